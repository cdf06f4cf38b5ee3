"""Dependencies an agent's constructor asks for by type, and the resumable kind."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from tether.domain.chat_message import ChatMessage

CheckpointHook = Callable[[], Awaitable[None]]


class AgentDependencyFactory(ABC):
    """Builds one dependency per turn.

    The factory is registered under the return annotation of ``create``; the
    parameters of ``create`` are themselves resolved by type (other registered
    dependencies) and then by name from the agent's configuration.
    """

    @classmethod
    @abstractmethod
    def create(cls, *args: Any, **kwargs: Any) -> Any:
        """Build the dependency for this turn."""


class ResumableAgentDependency(ABC):
    """A dependency whose working state is checkpointed during a stateful turn.

    The runtime calls ``dump`` every few seconds, after every completed tool call
    and at the end of the turn, and stores the result under ``state_key``. On the
    next stateful turn of the conversation (or on a resume of this one, on any
    replica) it calls ``load`` with what was stored, before the agent runs.

    ``restores_conversation`` says whether this dependency replays the
    conversation's transcript itself. When no dependency of an agent does, the
    handler feeds the agent the stored transcript instead of the request body.
    """

    state_key: ClassVar[str]
    restores_conversation: ClassVar[bool] = False
    _checkpoint_hook: CheckpointHook | None = None

    def bind_checkpoint_hook(self, hook: CheckpointHook | None) -> None:
        """Called by the runtime for stateful turns; see ``request_checkpoint``."""
        self._checkpoint_hook = hook

    async def request_checkpoint(self) -> None:
        """Ask the runtime to checkpoint now (for example right after a completed
        tool call, so it is never executed again on resume). A no-op outside a
        stateful turn."""
        if self._checkpoint_hook is not None:
            await self._checkpoint_hook()

    @abstractmethod
    async def dump(self) -> dict[str, Any]:
        """The state to checkpoint; must be JSON-serializable."""

    @abstractmethod
    async def load(self, state: dict[str, Any], *, resuming_turn: bool) -> None:
        """Restore from ``state``.

        ``resuming_turn`` is True when ``state`` was checkpointed by the very
        turn being resumed (a takeover after the producer died), and False when
        it comes from an earlier, finished turn of the conversation.
        """

    async def catch_up(self, shown: ChatMessage) -> None:  # noqa: B027 - optional hook
        """Optional, on a resume, right after ``load``: ``shown`` is the turn's
        recording, the newest message the earlier producer made durable. Its
        readers were handed only recorded messages, so no screen was shown
        more than ``shown``; it is often newer than the checkpoint just loaded
        (taken every few seconds). A dependency that can go on from there
        does, so the resumed turn streams new content at once, and every
        screen's text only grows. The default keeps the checkpoint; the
        runtime then holds back what is produced again until it passes
        ``shown``. That is exact only for a deterministic producer: a model
        that says something else the second time (sampling) replaces the
        text readers were shown with its own once it is longer, the one case
        in which a screen's text changes across a takeover. The bundled
        model/tool loop (``ChatClient``) goes on from ``shown`` whenever it
        only adds text to the checkpointed answer, and not while a tool call
        of the checkpoint is pending (what it says again is then held back)."""
