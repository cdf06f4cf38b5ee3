"""Invariant 7 of design §5: what a fenced producer changed, once continued.

- ``fenced`` (§5.7): a stopped-then-continued producer changed nothing.
"""

from __future__ import annotations

from tether.crashtest.invariants.observed import Expected, FenceEvidence, Violation, normalize


def fenced(fence: FenceEvidence, expected: Expected) -> list[Violation]:
    violations = []
    left, after = fence.left_by_new_owner, fence.after_continue
    if left.status != after.status:
        violations.append(
            Violation(
                "fenced",
                f"the supervision row changed after the old producer continued: {left.status} "
                f"became {after.status}",
            )
        )
    if left.transcript != after.transcript:
        violations.append(
            Violation("fenced", "the transcript changed after the old producer continued")
        )
    if (
        fence.epoch_before_fault is not None
        and left.status is not None
        and left.status.epoch <= fence.epoch_before_fault
    ):
        violations.append(
            Violation(
                "fenced",
                f"the takeover did not raise the epoch ({left.status.epoch}, "
                f"the stopped producer held {fence.epoch_before_fault})",
            )
        )
    if not fence.old_readers_ended:
        violations.append(
            Violation("fenced", "the fenced producer's readers did not end after it continued")
        )
    if fence.store_error is None:
        violations += _fenced_stores(fence, expected)
    return violations


def _fenced_stores(fence: FenceEvidence, expected: Expected) -> list[Violation]:
    violations = []
    owner = fence.left_by_new_owner.status
    # The producer writes at its lease's epoch; its terminal status took the
    # next one (so no late heartbeat of its own can undo it).
    owner_epoch = None
    if owner is not None:
        owner_epoch = owner.epoch - 1 if owner.status in ("done", "errored") else owner.epoch
    bots = [m for m in expected.transcript if m.get("sender") == "bot"]
    if fence.recorded_final is None:
        violations.append(
            Violation("fenced", "the turn's recording is gone after the old producer ran")
        )
    elif not bots or normalize(fence.recorded_final) != bots[-1]:
        violations.append(
            Violation("fenced", "the recording's last message is not the crash-free answer")
        )
    if fence.recorded_final is not None and fence.recorded_epoch != owner_epoch:
        violations.append(
            Violation(
                "fenced",
                f"the recording was written at epoch {fence.recorded_epoch}; the owner's is "
                f"{owner_epoch}",
            )
        )
    if fence.checkpoint_epoch != owner_epoch:
        violations.append(
            Violation(
                "fenced",
                f"the checkpoint was written at epoch {fence.checkpoint_epoch}; the owner's is "
                f"{owner_epoch}",
            )
        )
    return violations
