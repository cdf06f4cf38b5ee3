"""tether: run LLM chat agents in production.

Public names are re-exported here so that the seed's wiring runs with
``zav.agents_sdk`` renamed to ``tether``.
"""

from tether.domain import *  # noqa: F403 - the domain's __all__ is the public vocabulary
from tether.domain import __all__ as _domain_all

__all__ = [*_domain_all]
