"""Redis backend: agent state, stream recording and stream supervision stores.

``tether.stores.from_url("redis://host:6379/0?prefix=myapp:")`` (or
``stores_from_url``) builds the three stores over one shared
``RedisConnection``. The conversation store (and the MCP OAuth store) are not
served here: transcripts and credentials need a durable, queryable SQL backend,
so ``chat_conversation_store`` is None; pair this backend with SQLite or
PostgreSQL for those.

URL query parameters (the rest of the URL is redis-py's):

- ``prefix``: starts every key, verbatim (default ``tether:``); deployments
  sharing a server stay apart by prefix.
- ``stream_ttl``: seconds a supervision row or recording outlives its last write
  (default 21600, six hours). Running turns renew theirs every second, so only
  the rows of finished and abandoned turns expire; no reaper is needed.
- ``state_ttl``: seconds a checkpoint outlives its last save (default 0: never,
  because checkpoints serve stateful follow-ups of finished turns too).

Keys (see ``_keys``): ``{prefix}{kind}:{tenant}:{requester}:{session}`` with each
id percent-encoded, kinds ``agent-state`` (JSON string), ``stream-supervision``
and ``stream-recording`` (hashes holding the JSON row and the fields the
scripts fence on). Every atomic step (compare-and-swap, fenced put, guarded
deletes) is one Lua script shipped as package data; each also publishes the
conversation on ``{prefix}changes``, which ``wait_for_change`` listens to over
one pub/sub connection per ``RedisConnection``.

Durability is the server's configuration, not ours: a write is acknowledged
once it is in Redis's memory. With ``appendonly yes`` and ``appendfsync
everysec`` a Redis crash loses up to about a second of writes; RDB snapshots
alone lose everything since the last snapshot; without persistence a restart
loses everything; an asynchronous replica promoted in a failover may lack the
latest writes (``WAIT`` is not used). Losing supervision rows or recordings
costs at most the turns in flight at the time; losing checkpoints costs
resumability, so run Redis with AOF if the state store lives here.

Standalone Redis (or Sentinel, through a client you build) only: the scripts
and ``compare_and_swap_many`` touch keys without hash tags, which Redis Cluster
would refuse as cross-slot.
"""

from tether.adapters.redis.agent_state import RedisChatAgentStateStore
from tether.adapters.redis.bundle import stores_from_url
from tether.adapters.redis.connection import RedisConnection
from tether.adapters.redis.recording import RedisChatStreamRecordingStore
from tether.adapters.redis.supervision import RedisChatStreamSupervisionStore

__all__ = [
    "RedisChatAgentStateStore",
    "RedisChatStreamRecordingStore",
    "RedisChatStreamSupervisionStore",
    "RedisConnection",
    "stores_from_url",
]
