"""Authenticators: trusted identity headers, and bearer JWTs verified by the server.

The rules are tested on the authenticators directly (fast, every branch); the
wiring, that ``tether serve --auth jwt`` really refuses, challenges and ignores
forged headers while probes and docs stay open, against a real server process.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.requests import Request

from tests.support.client import read_stream, turn_body
from tests.support.project import make_project
from tests.support.servers import ServerProcess
from tether.api.auth import (
    AuthenticationError,
    AuthMode,
    HeaderAuthenticator,
    InvalidIdentityError,
    JWTAuthenticator,
    TenantNotAllowedError,
    build_authenticator,
)

SECRET = "a-shared-secret-of-at-least-32-bytes!"
AUDIENCE = "tether-api"
ISSUER = "https://idp.example.test"


def _request(headers: dict[str, str] | None = None, tenant: str | None = "t") -> Request:
    query = urlencode({"tenant": tenant}) if tenant is not None else ""
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/conversations",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "query_string": query.encode(),
    }
    return Request(scope)


def _claims(**overrides: Any) -> dict[str, Any]:
    """A token's claims (``tenants=None`` leaves the tenants claim out)."""
    claims: dict[str, Any] = {"sub": "alice", "exp": int(time.time()) + 300, "tenants": ["t"]}
    claims.update(overrides)
    return {key: value for key, value in claims.items() if value is not None}


def _hs(claims: dict[str, Any], secret: str = SECRET, **headers: Any) -> str:
    return jwt.encode(claims, secret, algorithm="HS256", headers=headers or None)


def _bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


def _pem(
    private_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
) -> bytes:
    return private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


# ------------------------------------------------------------- headers


def test_header_authenticator_reads_the_gateway_headers() -> None:
    identity = HeaderAuthenticator().authenticate(
        _request(
            {
                "requester-uuid": "alice",
                "user-roles": "admin, reader",
                "user-tenants": "t,u",
                "Authorization": "Bearer opaque",
            }
        )
    )
    assert identity.requester_uuid == "alice"
    assert identity.user_roles == ["admin", "reader"]
    assert identity.user_tenants == ["t", "u"]
    assert identity.authorization == "Bearer opaque"
    # The gateway's tenant list limits the tenant, as in the seed's SDK.
    assert (
        HeaderAuthenticator().authenticate(_request({"user-tenants": "t"})).requester_uuid is None
    )
    with pytest.raises(TenantNotAllowedError):
        HeaderAuthenticator().authenticate(_request({"user-tenants": "u"}))


@pytest.mark.parametrize("requester", ["../../x", "/etc/passwd", "a\\b", "a" * 257, " alice"])
def test_header_authenticator_refuses_a_requester_no_store_key_can_hold(requester: str) -> None:
    with pytest.raises(InvalidIdentityError) as refused:
        HeaderAuthenticator().authenticate(_request({"requester-uuid": requester}))
    assert refused.value.status_code == 400


# ------------------------------------------------------ JWT: the token


def test_a_valid_token_maps_its_claims_and_ignores_identity_headers() -> None:
    auth = JWTAuthenticator.from_secret(SECRET)
    token = _hs(_claims(roles=["reader"], tenants=["t", "u"]))
    forged = _bearer(token, **{"requester-uuid": "mallory", "user-roles": "admin"})
    identity = auth.authenticate(_request(forged))
    assert identity.requester_uuid == "alice"
    assert identity.user_roles == ["reader"]
    assert identity.user_tenants == ["t", "u"]
    assert identity.authorization == f"Bearer {token}"


@pytest.mark.parametrize(
    ("headers", "given"),
    [
        ({}, False),
        ({"requester-uuid": "alice"}, False),
        ({"Authorization": "Basic YWxpY2U6cHc="}, True),
        ({"Authorization": "Bearer"}, True),
        ({"Authorization": "Bearer not.a.jwt"}, True),
        ({"Authorization": "Bearer " + "x" * 5000}, True),
    ],
    ids=["none", "header-only", "basic", "empty-bearer", "garbage", "huge"],
)
def test_no_usable_token_is_401_with_a_bearer_challenge(
    headers: dict[str, str], given: bool
) -> None:
    with pytest.raises(AuthenticationError) as refused:
        JWTAuthenticator.from_secret(SECRET).authenticate(_request(headers))
    assert refused.value.status_code == 401
    assert refused.value.body()["code"] == "UNAUTHENTICATED"
    assert refused.value.challenge.startswith("Bearer ")
    assert ('error="invalid_token"' in refused.value.challenge) is given


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (_hs(_claims(), secret="another-secret-that-is-32-bytes-long"), "Signature"),
        (_hs(_claims(exp=int(time.time()) - 5)), "expired"),
        (_hs(_claims(exp=None)), "exp"),
        (_hs(_claims(nbf=int(time.time()) + 300)), "not yet valid"),
        (_hs(_claims(sub=None)), "sub"),
        (_hs(_claims(sub="../../etc")), "not a valid requester id"),
        (_hs(_claims(sub="a" * 300)), "not a valid requester id"),
        (_hs(_claims(roles={"admin": True})), "not a list of strings"),
        (_hs(_claims(tenants=[1, 2])), "not a list of strings"),
        (jwt.encode(_claims(), "", algorithm="none"), "alg"),
    ],
    ids=[
        "wrong-secret",
        "expired",
        "no-exp",
        "not-yet-valid",
        "no-sub",
        "sub-traversal",
        "sub-too-long",
        "roles-object",
        "tenants-numbers",
        "alg-none",
    ],
)
def test_a_token_that_does_not_verify_is_401(token: str, message: str) -> None:
    with pytest.raises(AuthenticationError) as refused:
        JWTAuthenticator.from_secret(SECRET).authenticate(_request(_bearer(token)))
    assert message.lower() in refused.value.message.lower()


def test_audience_and_issuer_are_checked_when_configured() -> None:
    auth = JWTAuthenticator.from_secret(SECRET, audience=AUDIENCE, issuer=ISSUER)
    good = _hs(_claims(aud=AUDIENCE, iss=ISSUER))
    assert auth.authenticate(_request(_bearer(good))).requester_uuid == "alice"
    for claims in (
        _claims(aud="someone-else", iss=ISSUER),
        _claims(iss=ISSUER),
        _claims(aud=AUDIENCE, iss="https://evil.test"),
        _claims(aud=AUDIENCE),
    ):
        with pytest.raises(AuthenticationError):
            auth.authenticate(_request(_bearer(_hs(claims))))
    # Without a configured audience, a token's own audience is not refused.
    plain = JWTAuthenticator.from_secret(SECRET)
    assert plain.authenticate(_request(_bearer(good))).requester_uuid == "alice"


def test_tenants_claim_restricts_the_tenant_query_parameter() -> None:
    auth = JWTAuthenticator.from_secret(SECRET)
    token = _bearer(_hs(_claims(tenants="t u")))  # the space-separated form
    assert auth.authenticate(_request(token, tenant="u")).user_tenants == ["t", "u"]
    with pytest.raises(TenantNotAllowedError) as refused:
        auth.authenticate(_request(token, tenant="other"))
    assert refused.value.status_code == 403
    assert refused.value.body()["code"] == "TENANT_NOT_ALLOWED"
    # No tenants claim, and no default tenants configured: none; an empty list: none.
    with pytest.raises(TenantNotAllowedError):
        auth.authenticate(_request(_bearer(_hs(_claims(tenants=None))), tenant="x"))
    with pytest.raises(TenantNotAllowedError):
        auth.authenticate(_request(_bearer(_hs(_claims(tenants=[]))), tenant="t"))


def test_a_repeated_tenant_parameter_is_judged_as_the_route_reads_it() -> None:
    """FastAPI takes the last of repeated scalar parameters; so must the check."""
    auth = JWTAuthenticator.from_secret(SECRET)
    request = _request(_bearer(_hs(_claims(tenants=["t"]))), tenant=None)
    request.scope["query_string"] = b"tenant=t&tenant=other"
    with pytest.raises(TenantNotAllowedError):
        auth.authenticate(request)
    request = _request(_bearer(_hs(_claims(tenants=["t"]))), tenant=None)
    request.scope["query_string"] = b"tenant=other&tenant=t"
    assert auth.authenticate(request).user_tenants == ["t"]


def test_claim_names_are_configurable_and_may_be_nested_or_url_shaped() -> None:
    auth = JWTAuthenticator.from_secret(
        SECRET,
        requester_claim="uid",
        roles_claim="realm_access.roles",
        tenants_claim="https://tether.test/tenants",
    )
    token = _hs(
        _claims(
            sub="ignored",
            uid="u-42",
            realm_access={"roles": ["ops"]},
            **{"https://tether.test/tenants": ["t"]},
        )
    )
    identity = auth.authenticate(_request(_bearer(token)))
    assert (identity.requester_uuid, identity.user_roles, identity.user_tenants) == (
        "u-42",
        ["ops"],
        ["t"],
    )


def test_leeway_forgives_a_little_clock_skew() -> None:
    token = _bearer(_hs(_claims(exp=int(time.time()) - 5)))
    assert JWTAuthenticator.from_secret(SECRET, leeway=30).authenticate(_request(token))


# -------------------------------------------------------- JWT: the keys


def test_a_short_secret_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="HMAC key"):
        JWTAuthenticator.from_secret("short")
    with pytest.raises(ValueError, match="shared-secret"):
        JWTAuthenticator.from_secret(SECRET, algorithm="RS256")


def test_rs256_and_es256_public_keys_and_certificates(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    for private, algorithm in ((rsa_key, "RS256"), (ec_key, "ES256")):
        path = tmp_path / f"{algorithm}.pem"
        path.write_bytes(_pem(private))
        auth = JWTAuthenticator.from_public_key_file(path)
        token = jwt.encode(_claims(), private, algorithm=algorithm)
        assert auth.authenticate(_request(_bearer(token))).requester_uuid == "alice"
        # A token signed with another key of the same kind does not verify.
        other = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            if algorithm == "RS256"
            else ec.generate_private_key(ec.SECP256R1())
        )
        with pytest.raises(AuthenticationError):
            auth.authenticate(_request(_bearer(jwt.encode(_claims(), other, algorithm=algorithm))))
    ed = ed25519.Ed25519PrivateKey.generate()
    auth = JWTAuthenticator.from_public_key(_pem(ed))
    token = jwt.encode(_claims(), ed, algorithm="EdDSA")
    assert auth.authenticate(_request(_bearer(token))).requester_uuid == "alice"
    with pytest.raises(ValueError, match="PEM"):
        JWTAuthenticator.from_public_key(b"not a key")


def test_the_key_decides_the_algorithm_not_the_token(rsa_key: rsa.RSAPrivateKey) -> None:
    """The classic confusion: HS256 "signed" with the RSA public key as the secret."""
    pem = _pem(rsa_key)
    auth = JWTAuthenticator.from_public_key(pem)
    # PyJWT refuses to sign that way itself, so the token is built by hand.
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(_claims()).encode())
    signature = _b64(hmac.new(pem, head + b"." + body, hashlib.sha256).digest())
    token = (head + b"." + body + b"." + signature).decode()
    with pytest.raises(AuthenticationError, match="alg"):
        auth.authenticate(_request(_bearer(token)))


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def test_a_jwks_file_picks_the_key_by_kid(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    keys = [
        {**RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True), "kid": "r1", "alg": "RS256"},
        {**ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True), "kid": "e1", "use": "sig"},
        {"kty": "RSA", "kid": "broken"},  # unusable keys are skipped, as PyJWT does
    ]
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": keys}))
    auth = JWTAuthenticator.from_jwks_file(path)
    by_rsa = jwt.encode(_claims(sub="r"), rsa_key, algorithm="RS256", headers={"kid": "r1"})
    by_ec = jwt.encode(_claims(sub="e"), ec_key, algorithm="ES256", headers={"kid": "e1"})
    assert auth.authenticate(_request(_bearer(by_rsa))).requester_uuid == "r"
    assert auth.authenticate(_request(_bearer(by_ec))).requester_uuid == "e"
    wrong_kid = jwt.encode(_claims(), ec_key, algorithm="ES256", headers={"kid": "r1"})
    unknown_kid = jwt.encode(_claims(), ec_key, algorithm="ES256", headers={"kid": "zz"})
    no_kid = jwt.encode(_claims(), ec_key, algorithm="ES256")
    for token, message in ((wrong_kid, "alg"), (unknown_kid, "kid"), (no_kid, "kid")):
        with pytest.raises(AuthenticationError, match=message):
            auth.authenticate(_request(_bearer(token)))
    # One key with an id verifies a token that names none; a lone key without
    # an id verifies a token that names one.
    single = JWTAuthenticator.from_jwks({"keys": [keys[0]]})
    by_rsa_no_kid = jwt.encode(_claims(sub="r"), rsa_key, algorithm="RS256")
    assert single.authenticate(_request(_bearer(by_rsa_no_kid))).requester_uuid == "r"
    anonymous = JWTAuthenticator.from_public_key(_pem(rsa_key))
    assert anonymous.authenticate(_request(_bearer(by_rsa))).requester_uuid == "r"
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ValueError):
        JWTAuthenticator.from_jwks_file(tmp_path / "bad.json")
    with pytest.raises(ValueError):
        JWTAuthenticator.from_jwks({"keys": []})


def test_build_authenticator_refuses_incomplete_or_stray_options(tmp_path: Path) -> None:
    assert isinstance(build_authenticator("headers"), HeaderAuthenticator)
    assert isinstance(build_authenticator(AuthMode.JWT, secret=SECRET), JWTAuthenticator)
    with pytest.raises(ValueError, match="exactly one"):
        build_authenticator("jwt")
    pem = tmp_path / "k.pem"
    pem.write_bytes(_pem(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(ValueError, match="exactly one"):
        build_authenticator("jwt", secret=SECRET, public_key_file=pem)
    # A secret without --auth jwt would leave the server trusting headers.
    with pytest.raises(ValueError, match="only apply with --auth jwt"):
        build_authenticator("headers", secret=SECRET)
    with pytest.raises(ValueError):
        build_authenticator("basic")


# ------------------------------------------- a real `tether serve --auth jwt`


@pytest.fixture(scope="module")
def jwt_keys() -> dict[str, Any]:
    return {
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ec": ec.generate_private_key(ec.SECP256R1()),
    }


@pytest.fixture(scope="module")
def jwt_server(
    tmp_path_factory: pytest.TempPathFactory, jwt_keys: dict[str, Any]
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("auth")
    project = make_project(root / "project", chunks_per_second=400, answer_chunks=10)
    jwks = {
        "keys": [
            {**RSAAlgorithm.to_jwk(jwt_keys["rsa"].public_key(), as_dict=True), "kid": "r1"},
            {**ECAlgorithm.to_jwk(jwt_keys["ec"].public_key(), as_dict=True), "kid": "e1"},
        ]
    }
    (root / "jwks.json").write_text(json.dumps(jwks))
    args = ["--auth", "jwt", "--jwt-jwks", str(root / "jwks.json"), "--jwt-audience", AUDIENCE]
    process = ServerProcess(
        project,
        store_url="memory://",
        log_path=root / "server.log",
        extra_args=args,
        env={"TETHER_JWT_ISSUER": ISSUER},
    ).start()
    yield process
    process.stop()


@pytest.fixture
async def jwt_client(jwt_server: ServerProcess) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(base_url=jwt_server.url, timeout=30) as http:
        yield http


def _rs(keys: dict[str, Any], **claims: Any) -> dict[str, str]:
    token = jwt.encode(
        _claims(**{"aud": AUDIENCE, "iss": ISSUER, **claims}),
        keys["rsa"],
        algorithm="RS256",
        headers={"kid": "r1"},
    )
    return _bearer(token)


@pytest.mark.processes
async def test_jwt_server_refuses_without_a_token_and_says_how(
    jwt_client: httpx2.AsyncClient, jwt_keys: dict[str, Any]
) -> None:
    refused = [
        await jwt_client.get("/conversations?tenant=t"),
        await jwt_client.get("/conversations?tenant=t", headers={"requester-uuid": "alice"}),
        await jwt_client.post("/chat/stream?tenant=t", json=turn_body("hi", agent="plain")),
        await jwt_client.get("/chat/stream/status?tenant=t&session_id=s"),
        await jwt_client.get("/chat/stream/m?tenant=t&session_id=s"),
        await jwt_client.delete("/chat/stream/m?tenant=t&session_id=s"),
        # Refused before the body is even validated.
        await jwt_client.post("/chat/response?tenant=t", json={"nonsense": True}),
        await jwt_client.get("/conversations?tenant=t", headers=_rs(jwt_keys, exp=1)),
        await jwt_client.get("/conversations?tenant=t", headers=_rs(jwt_keys, aud="other")),
    ]
    for response in refused:
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.headers["content-type"].startswith("application/json")
        body = response.json()
        assert body["code"] == "UNAUTHENTICATED" and body["message"]
    assert "expired" in refused[-2].json()["message"]


@pytest.mark.processes
async def test_jwt_server_keeps_probes_and_docs_open(jwt_client: httpx2.AsyncClient) -> None:
    for path in ("/probes/alive", "/probes/ready", "/docs", "/openapi.json"):
        assert (await jwt_client.get(path)).status_code == 200, path
    schema = (await jwt_client.get("/openapi.json")).json()
    assert "401" in schema["paths"]["/conversations"]["get"]["responses"]


@pytest.mark.processes
async def test_jwt_server_serves_the_token_holder_whatever_the_headers_say(
    jwt_client: httpx2.AsyncClient, jwt_keys: dict[str, Any]
) -> None:
    session = f"s-{uuid.uuid4().hex[:8]}"
    body = turn_body("hello", agent="plain", stateful=True, session_id=session)
    headers = {**_rs(jwt_keys, sub="alice"), "requester-uuid": "mallory"}
    read = await read_stream(
        jwt_client, "POST", "/chat/stream?tenant=t", json=body, headers=headers
    )
    assert read.status_code == 201 and read.final_text
    own = await jwt_client.get("/conversations?tenant=t", headers=_rs(jwt_keys, sub="alice"))
    assert [item["owner_uuid"] for item in own.json()["items"]] == ["alice"]
    mallory = await jwt_client.get("/conversations?tenant=t", headers=_rs(jwt_keys, sub="mallory"))
    assert mallory.json()["items"] == []
    # The EC key of the set verifies too, by its kid.
    by_ec = jwt.encode(
        _claims(aud=AUDIENCE, iss=ISSUER), jwt_keys["ec"], algorithm="ES256", headers={"kid": "e1"}
    )
    assert (await jwt_client.get("/conversations?tenant=t", headers=_bearer(by_ec))).json()[
        "items"
    ][0]["session_id"] == session


@pytest.mark.processes
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--auth", "jwt"], {}, "exactly one"),
        (["--jwt-secret", SECRET], {}, "only apply with --auth jwt"),
        (["--auth", "jwt"], {"TETHER_JWT_SECRET": "short"}, "HMAC key"),
        (["--auth", "magic"], {}, "magic"),
    ],
    ids=["jwt-without-key", "secret-without-jwt", "short-secret", "unknown-mode"],
)
def test_serve_refuses_auth_options_that_do_not_add_up(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--store", "memory://", "--port", "1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200", **env},
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stdout + result.stderr
