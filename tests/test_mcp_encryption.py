"""Credentials at rest: AES-GCM with rotatable keys, bound to their row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.adapters.mcp import (
    ENCRYPTION_KEYS_ENV,
    LocalFileMCPOAuthRepository,
    MCPOAuthCipher,
    MCPOAuthClientInfoRecord,
    MCPOAuthDecryptionError,
    MCPOAuthEncryptionNotConfiguredError,
    MCPOAuthSettings,
    generate_encryption_key,
)
from tether.testing.contracts.mcp_oauth import record

OLD, NEW = generate_encryption_key(), generate_encryption_key()


def test_sealed_values_open_under_any_configured_key_and_seal_under_the_first() -> None:
    sealed_old = MCPOAuthCipher([OLD]).seal("token", "ctx")
    rotated = MCPOAuthCipher([NEW, OLD])
    assert rotated.open(sealed_old, "ctx") == "token"
    sealed_new = rotated.seal("token", "ctx")
    assert sealed_new.split(".")[1] != sealed_old.split(".")[1], "the first key seals"
    assert MCPOAuthCipher([NEW]).open(sealed_new, "ctx") == "token"
    with pytest.raises(MCPOAuthDecryptionError, match=r"no\s+longer in"):
        MCPOAuthCipher([NEW]).open(sealed_old, "ctx")


def test_a_sealed_value_is_bound_to_its_context_and_not_readable() -> None:
    cipher = MCPOAuthCipher([OLD])
    sealed = cipher.seal("the-access-token", "tokens", "t", "alice", "srv", "access_token")
    assert "the-access-token" not in sealed
    assert cipher.seal("x", "a") != cipher.seal("x", "a"), "fresh nonce every time"
    for other in (
        ("tokens", "t", "bob", "srv", "access_token"),
        ("tokens", "t", "alice", "srv", "refresh_token"),
    ):
        with pytest.raises(MCPOAuthDecryptionError):
            cipher.open(sealed, *other)
    tampered = sealed[:-2] + ("AA" if not sealed.endswith("AA") else "BB")
    with pytest.raises(MCPOAuthDecryptionError):
        cipher.open(tampered, "tokens", "t", "alice", "srv", "access_token")


def test_without_a_key_nothing_is_sealed_and_the_error_says_how_to_fix_it() -> None:
    cipher = MCPOAuthCipher.from_env({})
    assert not cipher.configured
    with pytest.raises(MCPOAuthEncryptionNotConfiguredError, match=ENCRYPTION_KEYS_ENV):
        cipher.seal("token", "ctx")
    sealed = MCPOAuthCipher([OLD]).seal("token", "ctx")
    with pytest.raises(MCPOAuthDecryptionError, match=ENCRYPTION_KEYS_ENV):
        cipher.open(sealed, "ctx")


@pytest.mark.parametrize("bad", ["not base64 !", "c2hvcnQ", "x" * 60])
def test_a_malformed_key_is_refused_at_start_up(bad: str) -> None:
    with pytest.raises(ValueError, match=ENCRYPTION_KEYS_ENV):
        MCPOAuthCipher([bad])


def test_keys_come_from_the_environment_comma_separated() -> None:
    settings = MCPOAuthSettings.from_env({ENCRYPTION_KEYS_ENV: f" {NEW} , {OLD},"})
    assert settings.encryption_keys == (NEW, OLD)
    assert NEW not in repr(settings)
    cipher = MCPOAuthCipher.from_env({ENCRYPTION_KEYS_ENV: f"{NEW},{OLD}"})
    assert cipher.open(MCPOAuthCipher([OLD]).seal("v", "c"), "c") == "v"


async def test_a_row_copied_into_another_users_place_does_not_decrypt(tmp_path: Path) -> None:
    repository = LocalFileMCPOAuthRepository(tmp_path, MCPOAuthCipher([OLD]))
    await repository.save_user_integration(record("t", "alice", "srv", with_pending=False))
    await repository.save_user_integration(record("t", "bob", "srv", with_pending=False))
    alice = tmp_path / "integrations" / "t" / "alice" / "srv.json"
    bob = tmp_path / "integrations" / "t" / "bob" / "srv.json"
    stolen = json.loads(alice.read_text())
    stolen["user_uuid"] = "bob"  # alice's sealed tokens, dressed as bob's row
    bob.write_text(json.dumps(stolen))
    with pytest.raises(MCPOAuthDecryptionError, match="another row"):
        await repository.get_user_integration("t", "bob", "srv")
    found = await repository.get_user_integration("t", "alice", "srv")
    assert found is not None and found.tokens is not None


async def test_a_client_secret_copied_to_another_tenant_does_not_decrypt(tmp_path: Path) -> None:
    repository = LocalFileMCPOAuthRepository(tmp_path, MCPOAuthCipher([OLD]))
    info = {"client_id": "c", "client_secret": "s3cret-value"}
    await repository.save_client_info(
        MCPOAuthClientInfoRecord(tenant="t1", server_name="srv", client_info=info)
    )
    source = tmp_path / "clients" / "t1" / "srv.json"
    assert b"s3cret-value" not in source.read_bytes()
    moved = json.loads(source.read_text())
    moved["tenant"] = "t2"
    target = tmp_path / "clients" / "t2" / "srv.json"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(moved))
    with pytest.raises(MCPOAuthDecryptionError):
        await repository.get_client_info("t2", "srv")
