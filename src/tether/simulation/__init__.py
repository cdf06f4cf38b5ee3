"""``tether simulate``: seeded histories of conversations over several in-process replicas."""

from tether.simulation.report import RunReport
from tether.simulation.scheduler import History, Options, history_seed, run_history

__all__ = ["History", "Options", "RunReport", "history_seed", "run_history"]
