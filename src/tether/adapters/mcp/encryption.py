"""Encryption at rest for MCP OAuth credentials: AES-256-GCM, rotatable keys, bound rows.

Every secret string (an access or refresh token, a client secret, a PKCE
verifier) is sealed on its own as ``tmcp1.<key id>.<base64url(nonce | ciphertext)>``.

- **Rotation.** Several keys may be configured: the first seals, every one opens.
  To rotate, put a new key first and keep the old ones until every row has been
  rewritten (tokens are rewritten at each refresh and each new authorization).
- **Binding.** The associated data of each seal names what it belongs to (the
  kind of row, tenant, user, server and field), so a ciphertext copied into
  another user's row, another server's row or another field fails to open
  instead of handing one user's grant to someone else.
- **No key, no secrets.** Without a key the cipher refuses to seal, with an
  error saying how to configure one; nothing is ever stored in clear.

``cryptography`` is imported only when keys are given, so ``import tether``
works without the ``mcp`` extra.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tether.domain.store_errors import StoreCorruptedError, StoreError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

ENCRYPTION_KEYS_ENV = "TETHER_MCP_ENCRYPTION_KEYS"
NO_KEY_MESSAGE = (
    "refusing to store MCP OAuth credentials unencrypted: no encryption key is configured; "
    f"set {ENCRYPTION_KEYS_ENV} to a base64url 32-byte key (several, comma-separated, to "
    "rotate; the first encrypts)"
)
_PREFIX = "tmcp1"
_NONCE_BYTES = 12


class MCPOAuthEncryptionNotConfiguredError(StoreError):
    """A credential was to be stored but no encryption key is configured."""


class MCPOAuthDecryptionError(StoreCorruptedError):
    """A sealed value does not open: wrong or missing key, tampered, or moved rows."""


def generate_encryption_key() -> str:
    """A fresh random key in the format ``TETHER_MCP_ENCRYPTION_KEYS`` expects."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")


def _decode_key(text: str, position: int) -> bytes:
    padded = text.strip() + "=" * (-len(text.strip()) % 4)
    try:
        key = base64.urlsafe_b64decode(padded.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError) as error:
        raise ValueError(f"{ENCRYPTION_KEYS_ENV}: key #{position + 1} is not base64url") from error
    if len(key) != 32:
        raise ValueError(
            f"{ENCRYPTION_KEYS_ENV}: key #{position + 1} decodes to {len(key)} bytes; "
            "a key is 32 random bytes, base64url-encoded (generate one with "
            "tether.adapters.mcp.generate_encryption_key())"
        )
    return key


def _key_id(key: bytes) -> str:
    # Names the key without revealing it, so opening tries the right key first.
    return hashlib.sha256(b"tether-mcp-key-id\x00" + key).hexdigest()[:8]


class MCPOAuthCipher:
    """Seals and opens credential strings with AES-256-GCM under ``keys`` (first seals).

    ``keys`` are base64url-encoded 32-byte keys. A cipher without keys opens
    nothing and seals nothing: ``seal`` raises
    ``MCPOAuthEncryptionNotConfiguredError``, which is how a server without a
    key refuses to store tokens.
    """

    def __init__(self, keys: Iterable[str] = ()) -> None:
        decoded = [_decode_key(key, n) for n, key in enumerate(k for k in keys if k.strip())]
        self._keys: list[tuple[str, AESGCM]] = []
        if decoded:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._keys = [(_key_id(key), AESGCM(key)) for key in decoded]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MCPOAuthCipher:
        """The cipher of ``TETHER_MCP_ENCRYPTION_KEYS`` (comma-separated, first seals)."""
        environ = os.environ if environ is None else environ
        return cls(environ.get(ENCRYPTION_KEYS_ENV, "").split(","))

    @property
    def configured(self) -> bool:
        """Whether there is a key to seal with."""
        return bool(self._keys)

    def seal(self, plaintext: str, *context: str) -> str:
        """``plaintext`` encrypted under the first key, bound to ``context``."""
        if not self._keys:
            raise MCPOAuthEncryptionNotConfiguredError(NO_KEY_MESSAGE)
        key_id, aead = self._keys[0]
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = aead.encrypt(nonce, plaintext.encode("utf-8"), _associated_data(context))
        body = base64.urlsafe_b64encode(nonce + sealed).decode("ascii").rstrip("=")
        return f"{_PREFIX}.{key_id}.{body}"

    def open(self, sealed: str, *context: str) -> str:
        """The plaintext of ``sealed``; raises ``MCPOAuthDecryptionError`` when no key
        opens it for this ``context``."""
        from cryptography.exceptions import InvalidTag

        prefix, _, rest = sealed.partition(".")
        key_id, _, body = rest.partition(".")
        if prefix != _PREFIX or not body:
            raise MCPOAuthDecryptionError("a stored MCP credential is not a sealed value")
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError) as error:
            raise MCPOAuthDecryptionError("a stored MCP credential is damaged") from error
        if not self._keys:
            raise MCPOAuthDecryptionError(
                f"stored MCP credentials are encrypted but {ENCRYPTION_KEYS_ENV} is not set"
            )
        nonce, ciphertext = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        # The named key first; then the others, in case ids ever collide.
        candidates = sorted(self._keys, key=lambda item: item[0] != key_id)
        for _, aead in candidates:
            try:
                return aead.decrypt(nonce, ciphertext, _associated_data(context)).decode("utf-8")
            except InvalidTag:
                continue
        raise MCPOAuthDecryptionError(
            "a stored MCP credential does not decrypt: it was sealed with a key that is no "
            f"longer in {ENCRYPTION_KEYS_ENV}, or it belongs to another row"
        )


def _associated_data(context: tuple[str, ...]) -> bytes:
    # A JSON list is unambiguous: ("a,b", "c") and ("a", "b,c") never collide.
    return json.dumps(["tether.mcp-oauth.v1", *context], ensure_ascii=True).encode("ascii")
