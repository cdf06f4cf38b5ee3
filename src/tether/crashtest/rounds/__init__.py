"""One round of a single turn per conversation (every fault but ``queue`` and
``erase``, which ``conversation_rounds`` plays): several turns on one replica,
failed, recovered, checked.

``state`` is what a round is made of (its plan, context, turns and their
evidence); ``play`` is its loop, which ``failing`` (the fault that hits the
producer), ``watching`` (the clients noticing and recovering), ``aftermath``
(continuing a stopped producer, the rest of a rolling deploy) and
``evidence`` (the checks and the measures) are the steps of.
"""

from tether.crashtest.rounds.play import play_round
from tether.crashtest.rounds.state import RoundContext, RoundPlan, round_bound

__all__ = ["RoundContext", "RoundPlan", "play_round", "round_bound"]
