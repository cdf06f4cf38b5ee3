"""Old import path, kept working: the shared conversation rules now live in
``tether.adapters.conversation_record`` (every conversation store shares them).

Only a re-export remains here, so that code importing ``tether.adapters.conversation._record``
(older code) runs unchanged; import from the new place in new code.
"""

from tether.adapters.conversation_record import (
    TITLE_LENGTH,
    Append,
    Clock,
    ConversationRecord,
    Removal,
    page,
    stale_page,
    stamp,
    title_of,
    utc_now,
)

__all__ = [
    "TITLE_LENGTH",
    "Append",
    "Clock",
    "ConversationRecord",
    "Removal",
    "page",
    "stale_page",
    "stamp",
    "title_of",
    "utc_now",
]
