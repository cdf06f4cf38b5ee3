"""``JWTAuthenticator``: identity from a verified ``Authorization: Bearer`` JSON Web Token.

It verifies the token itself and ignores identity headers, so a client that
forges ``requester-uuid`` gains nothing (design §5, invariant 8). Its keys are
a shared secret, a PEM public key or certificate, a JSON Web Key Set, or the
set an identity provider publishes at a URL (``tether.api.jwks``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from fastapi import Request
from jwt.algorithms import get_default_algorithms

from tether.api.authenticator import (
    AuthenticationError,
    Authenticator,
    check_tenant,
    is_valid_id,
)
from tether.api.jwks import RemoteKeys
from tether.domain.chat_request import RequestHeaders

# Curves by the JWS algorithm that signs with them (RFC 7518 §3.4, RFC 8812).
_EC_ALGORITHMS = {
    "secp256r1": "ES256",
    "secp384r1": "ES384",
    "secp521r1": "ES512",
    "secp256k1": "ES256K",
}


class JWTAuthenticator(Authenticator):
    """Identity from a verified ``Authorization: Bearer`` JSON Web Token.

    The token must verify with one of ``keys`` (a token naming a ``kid`` is
    checked with that key only; without one, the set must hold a single key),
    with the algorithm bound to that key, never the one the token asks for. It
    must carry ``exp`` unless ``require_exp`` is False, and match ``audience``
    and ``issuer`` when they are given. Claims then map to the identity:

    - ``requester_claim`` (default ``sub``): the requester, a valid id;
    - ``roles_claim`` (default ``roles``): a list of strings, or one string
      separated by spaces or commas;
    - ``tenants_claim`` (default ``tenants``): the same shape; a request whose
      ``tenant`` query parameter is not in it is 403. A token without the claim
      may use ``default_tenants`` (none unless configured): the default is to
      deny, so a token that names no tenant reaches no tenant's data.

    A claim name is looked up as is first, then as a dotted path into nested
    objects (``realm_access.roles``), so URL-shaped claim names still work.
    Identity headers are ignored. Build one with ``from_secret``,
    ``from_public_key``, ``from_jwks`` or their ``_file`` variants, or with
    ``from_jwks_url`` for keys the identity provider publishes and rotates
    (``tether.api.jwks``: a token's key is then looked up by its ``kid``).
    """

    def __init__(
        self,
        keys: Sequence[jwt.PyJWK],
        *,
        audience: str | Sequence[str] | None = None,
        issuer: str | None = None,
        requester_claim: str = "sub",
        roles_claim: str = "roles",
        tenants_claim: str = "tenants",
        leeway: float = 0.0,
        require_exp: bool = True,
        default_tenants: Sequence[str] = (),
        remote: RemoteKeys | None = None,
    ) -> None:
        usable = [key for key in keys if key.public_key_use in (None, "sig")]
        if not usable and remote is None:
            raise ValueError("a JWT authenticator needs at least one signing key")
        self.remote = remote
        for key in usable:
            # Refuse weak keys at start-up rather than warning on every request.
            weakness = key.Algorithm.check_key_length(key.Algorithm.prepare_key(key.key))
            if weakness:
                raise ValueError(weakness)
        self.keys = usable
        self.audience = audience
        self.issuer = issuer
        self.requester_claim = requester_claim
        self.roles_claim = roles_claim
        self.tenants_claim = tenants_claim
        self.leeway = leeway
        self.require_exp = require_exp
        self.default_tenants = list(default_tenants)

    @classmethod
    def from_secret(
        cls, secret: str | bytes, *, algorithm: str = "HS256", **options: Any
    ) -> JWTAuthenticator:
        """Tokens signed with a shared secret (HS256 by default; at least 32 bytes)."""
        raw = secret.encode() if isinstance(secret, str) else secret
        algorithms = get_default_algorithms()
        if not algorithm.startswith("HS") or algorithm not in algorithms:
            raise ValueError(f"{algorithm!r} is not a shared-secret algorithm (HS256/384/512)")
        jwk = algorithms[algorithm].to_jwk(raw, as_dict=True)
        return cls([jwt.PyJWK({**jwk, "alg": algorithm})], **options)

    @classmethod
    def from_public_key(
        cls, pem: str | bytes, *, algorithm: str | None = None, **options: Any
    ) -> JWTAuthenticator:
        """Tokens signed with the private half of a PEM public key or certificate.

        The algorithm follows from the key unless given: RS256 for RSA, ES256,
        ES384 or ES512 by curve, EdDSA for Ed25519.
        """
        data = pem.encode() if isinstance(pem, str) else pem
        try:
            if b"-----BEGIN CERTIFICATE-----" in data:
                public_key: Any = x509.load_pem_x509_certificate(data).public_key()
            else:
                public_key = load_pem_public_key(data)
        except ValueError as error:
            raise ValueError(f"not a PEM public key or certificate: {error}") from error
        chosen = algorithm or _algorithm_for(public_key)
        algorithms = get_default_algorithms()
        if chosen not in algorithms or chosen.startswith("HS") or chosen == "none":
            raise ValueError(f"{chosen!r} is not a public-key algorithm")
        jwk = algorithms[chosen].to_jwk(public_key, as_dict=True)
        return cls([jwt.PyJWK({**jwk, "alg": chosen})], **options)

    @classmethod
    def from_public_key_file(cls, path: str | Path, **options: Any) -> JWTAuthenticator:
        """``from_public_key`` with the PEM read from ``path``."""
        return cls.from_public_key(Path(path).read_bytes(), **options)

    @classmethod
    def from_jwks(cls, jwks: Mapping[str, Any], **options: Any) -> JWTAuthenticator:
        """Tokens signed with any key of a JSON Web Key Set (``{"keys": [...]}``).

        Keys PyJWT cannot use are skipped, as are keys meant for encryption.
        """
        try:
            key_set = jwt.PyJWKSet.from_dict(dict(jwks))
        except jwt.PyJWTError as error:
            raise ValueError(f"not a usable JSON Web Key Set: {error}") from error
        return cls(list(key_set), **options)

    @classmethod
    def from_jwks_file(cls, path: str | Path, **options: Any) -> JWTAuthenticator:
        """``from_jwks`` with the set read from a JSON file at ``path``."""
        try:
            document = json.loads(Path(path).read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not JSON: {error}") from error
        if not isinstance(document, dict):
            raise ValueError(f"{path} is not a JSON Web Key Set object")
        return cls.from_jwks(document, **options)

    @classmethod
    def from_jwks_url(cls, url: str, **options: Any) -> JWTAuthenticator:
        """Tokens signed with a key the JSON Web Key Set at ``url`` holds, fetched
        when first needed, cached, and fetched again when a token names a key
        id the cached set lacks (a rotation). Only public-key algorithms."""
        return cls([], remote=RemoteKeys(url), **options)

    async def prepare(self, request: Request) -> None:
        if self.remote is None:
            return
        token = _bearer_token(request.headers.get("authorization"))
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise AuthenticationError(f"the bearer token was refused: {error}") from error
        await self.remote.look_up(request, header)

    def authenticate(self, request: Request) -> RequestHeaders:
        authorization = request.headers.get("authorization")
        token = _bearer_token(authorization)
        claims = self._verified_claims(token, request)
        requester = _claim(claims, self.requester_claim)
        if not isinstance(requester, str) or not is_valid_id(requester):
            raise AuthenticationError(
                f"the token's {self.requester_claim!r} claim is not a valid requester id"
            )
        roles = _string_list(claims, self.roles_claim)
        tenants = _string_list(claims, self.tenants_claim)
        if tenants is None:
            tenants = list(self.default_tenants)
        check_tenant(request, tenants, "the token does not allow this tenant")
        return RequestHeaders(
            requester_uuid=requester,
            user_roles=roles,
            user_tenants=tenants,
            authorization=authorization,
        )

    def _verified_claims(self, token: str, request: Request) -> dict[str, Any]:
        try:
            key = self._key_for(jwt.get_unverified_header(token), request)
            return jwt.decode(
                token,
                key,
                algorithms=[key.algorithm_name],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={
                    "require": ["exp"] if self.require_exp else [],
                    # Without a configured audience, a token's ``aud`` is not
                    # ours to judge (PyJWT would refuse every token that has one).
                    "verify_aud": self.audience is not None,
                    "enforce_minimum_key_length": True,
                },
            )
        except jwt.ExpiredSignatureError as error:
            raise AuthenticationError("the bearer token has expired") from error
        except jwt.PyJWTError as error:
            raise AuthenticationError(f"the bearer token was refused: {error}") from error

    def _key_for(self, header: Mapping[str, Any], request: Request) -> jwt.PyJWK:
        kid = header.get("kid")
        if self.remote is not None:
            return _remote_key(self.remote, request, kid)
        if kid is None:
            if len(self.keys) == 1:
                return self.keys[0]
            raise AuthenticationError("the token names no key id (kid), and several keys verify")
        for key in self.keys:
            if key.key_id == kid:
                return key
        # A lone key without an id (a secret, a PEM file) verifies whatever kid
        # the issuer stamps on its tokens.
        if len(self.keys) == 1 and self.keys[0].key_id is None:
            return self.keys[0]
        raise AuthenticationError("the token's key id (kid) is not one of the server's keys")


def _remote_key(remote: RemoteKeys, request: Request, kid: object) -> jwt.PyJWK:
    if kid is None:
        raise AuthenticationError("the token names no key id (kid)")
    key = remote.key_of(request)
    if key is None or key.key_id != kid:
        raise AuthenticationError("the token's key id (kid) is not one of the provider's keys")
    if key.algorithm_name.startswith("HS") or key.algorithm_name == "none":
        # A shared secret published at a URL is no secret: never verify with it.
        raise AuthenticationError("the provider's key for this kid is not a public key")
    return key


def _bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise AuthenticationError(
            "this server needs an Authorization: Bearer <token> header", token_given=False
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError("the Authorization header is not of the form 'Bearer <token>'")
    return token.strip()


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _string_list(claims: Mapping[str, Any], name: str) -> list[str] | None:
    """A list-of-strings claim, accepting the space- or comma-separated string form."""
    value = _claim(claims, name)
    if value is None:
        return None
    if isinstance(value, str):
        return [item for item in re.split(r"[\s,]+", value) if item]
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        items = list(value)
        if all(isinstance(item, str) for item in items):
            return items
    raise AuthenticationError(f"the token's {name!r} claim is not a list of strings")


def _algorithm_for(public_key: Any) -> str:
    if isinstance(public_key, rsa.RSAPublicKey):
        return "RS256"
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        algorithm = _EC_ALGORITHMS.get(public_key.curve.name)
        if algorithm is None:
            raise ValueError(f"no JWS algorithm signs with curve {public_key.curve.name}")
        return algorithm
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return "EdDSA"
    raise ValueError(f"unsupported public key type {type(public_key).__name__}")
