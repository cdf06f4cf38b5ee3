"""The keyed hash conversations' epochs and fences are kept under (``tether.domain.tombstones``)."""

from __future__ import annotations

import pytest

from tether.domain.tombstones import DERIVED_DEFAULT, TombstoneKey, TombstoneKeyError


def test_a_tombstone_names_no_id_and_tells_conversations_and_keys_apart() -> None:
    key = TombstoneKey(b"a secret of sixteen+ chars")
    tombstone = key.of("acme", "alice", "s-1")
    assert len(tombstone) == 64 and not {"acme", "alice", "s-1"} & set(tombstone.split())
    assert key.of("acme", "alice", "s-1") == tombstone
    # The ids are length-prefixed: moving a character between them is another conversation.
    assert key.of("acm", "ealice", "s-1") != tombstone
    assert key.of("acme", None, "s-1") == key.of("acme", "", "s-1")
    assert TombstoneKey(b"another secret, as long").of("acme", "alice", "s-1") != tombstone
    assert key.of_bytes(b"acme", b"alice", b"s-1") == tombstone


def test_the_key_comes_from_the_environment_or_is_the_documented_default() -> None:
    assert TombstoneKey.from_env({}).check == TombstoneKey(DERIVED_DEFAULT).check
    configured = TombstoneKey.from_env({"TETHER_TOMBSTONE_KEY": "x" * 32})
    assert configured.check == TombstoneKey(b"x" * 32).check
    with pytest.raises(TombstoneKeyError, match="at least 16"):
        TombstoneKey.from_env({"TETHER_TOMBSTONE_KEY": "short"})


def test_a_store_written_under_another_key_is_named_in_a_clear_error() -> None:
    first, second = TombstoneKey(b"first secret key!"), TombstoneKey(b"second secret key")
    first.verify(None, "a store")  # nothing recorded yet
    first.verify(first.check, "a store")
    with pytest.raises(TombstoneKeyError, match="another TETHER_TOMBSTONE_KEY"):
        second.verify(first.check, "a store")
