"""Records to stored documents and back, with every credential sealed.

All shipped repositories (memory, file, SQLite, PostgreSQL) store the same
JSON document per row, built here, so "no plaintext credential at rest" is
implemented once. What stays in clear is what listing and lookup need: ids,
scopes, expiry times, endpoints, the pending ``state``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tether.adapters.mcp.encryption import MCPOAuthCipher
from tether.adapters.mcp.records import (
    OTHER_CLIENTS_FIELD,
    SECRET_CLIENT_INFO_FIELDS,
    MCPOAuthClientInfoRecord,
    MCPUserIntegrationRecord,
)
from tether.domain.store_errors import StoreCorruptedError

_TOKEN_SECRETS = ("access_token", "refresh_token")


class RecordCodec:
    """Turns records into JSON-ready documents (credentials sealed) and back."""

    def __init__(self, cipher: MCPOAuthCipher) -> None:
        self.cipher = cipher

    def integration_document(self, record: MCPUserIntegrationRecord) -> dict[str, Any]:
        """The stored form of ``record``; raises ``MCPOAuthEncryptionNotConfiguredError``
        when it holds a credential and there is no key."""
        document = record.model_dump(mode="json")
        row = (record.tenant, record.user_uuid, record.server_name)
        pending = document.get("pending")
        if pending is not None:
            pending["code_verifier"] = self.cipher.seal(
                pending["code_verifier"], "pending", *row, pending["state"], "code_verifier"
            )
        tokens = document.get("tokens")
        if tokens is not None:
            for field in _TOKEN_SECRETS:
                if tokens.get(field) is not None:
                    tokens[field] = self.cipher.seal(tokens[field], "tokens", *row, field)
        return document

    def integration(self, document: Any, where: str) -> MCPUserIntegrationRecord:
        """The record stored as ``document`` (``where`` names it in errors)."""
        if not isinstance(document, dict):
            raise StoreCorruptedError(f"{where} does not hold an MCP user integration")
        opened = dict(document)
        try:
            row = (str(opened["tenant"]), str(opened["user_uuid"]), str(opened["server_name"]))
            pending = opened.get("pending")
            if pending is not None:
                pending = dict(pending)
                pending["code_verifier"] = self.cipher.open(
                    str(pending["code_verifier"]), "pending", *row, str(pending["state"]),
                    "code_verifier",
                )  # fmt: skip
                opened["pending"] = pending
            tokens = opened.get("tokens")
            if tokens is not None:
                tokens = dict(tokens)
                for field in _TOKEN_SECRETS:
                    if tokens.get(field) is not None:
                        tokens[field] = self.cipher.open(str(tokens[field]), "tokens", *row, field)
                opened["tokens"] = tokens
            return MCPUserIntegrationRecord.model_validate(opened)
        except (KeyError, TypeError, ValidationError) as error:
            raise StoreCorruptedError(
                f"{where} does not hold a valid MCP user integration ({error})"
            ) from error

    def client_info_document(self, record: MCPOAuthClientInfoRecord) -> dict[str, Any]:
        """The stored form of ``record``, its client secrets sealed (those of the other
        clients kept too, each bound to its own ``client_id``)."""
        document = record.model_dump(mode="json")
        info = document["client_info"]
        row = (record.tenant, record.server_name)
        self._seal_client(info, row, ())
        others = info.get(OTHER_CLIENTS_FIELD)
        if isinstance(others, list):
            for other in others:
                if isinstance(other, dict):
                    self._seal_client(other, row, _other_context(other))
        return document

    def client_info(self, document: Any, where: str) -> MCPOAuthClientInfoRecord:
        """The client info stored as ``document``."""
        if not isinstance(document, dict):
            raise StoreCorruptedError(f"{where} does not hold MCP OAuth client info")
        try:
            tenant, server = str(document["tenant"]), str(document["server_name"])
            info = dict(document["client_info"])
            self._open_client(info, (tenant, server), ())
            others = info.get(OTHER_CLIENTS_FIELD)
            if isinstance(others, list):
                opened = []
                for other in others:
                    if isinstance(other, dict):
                        other = dict(other)
                        self._open_client(other, (tenant, server), _other_context(other))
                    opened.append(other)
                info[OTHER_CLIENTS_FIELD] = opened
            revision = document.get("revision")
            return MCPOAuthClientInfoRecord(
                tenant=tenant,
                server_name=server,
                client_info=info,
                revision=None if revision is None else str(revision),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise StoreCorruptedError(
                f"{where} does not hold valid MCP OAuth client info ({error})"
            ) from error

    def _seal_client(
        self, info: dict[str, Any], row: tuple[str, str], context: tuple[str, ...]
    ) -> None:
        for field in SECRET_CLIENT_INFO_FIELDS:
            if isinstance(info.get(field), str):
                info[field] = self.cipher.seal(info[field], "client_info", *row, *context, field)

    def _open_client(
        self, info: dict[str, Any], row: tuple[str, str], context: tuple[str, ...]
    ) -> None:
        for field in SECRET_CLIENT_INFO_FIELDS:
            if isinstance(info.get(field), str):
                info[field] = self.cipher.open(info[field], "client_info", *row, *context, field)


def _other_context(info: dict[str, Any]) -> tuple[str, ...]:
    # Bound to its client id: a secret moved to another kept client does not open.
    return (OTHER_CLIENTS_FIELD, str(info.get("client_id")))
