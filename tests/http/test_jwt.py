"""JWT bearer tokens over real HTTP: verified against a JWKS file, issuer and audience checked,
``alg: none`` and HMAC refused, the key picked by ``kid``; the tenant comes from the claim.

Every bad token is ``401 UNAUTHENTICATED`` with a specific detail, executes nothing (the
helpdesk store shows no effect and the key stays unused), is counted in ``/metrics`` and
logged without the token. Embedded backend (the JWT check happens at the door, before any
backend is involved).

The server is started through :func:`start_guarded` (``toolledger.serve`` in a subprocess)
until ``toolledger serve`` has the ``--jwks``/``--policy`` options.
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
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from prometheus_client.parser import text_string_to_metric_families

from tests.http.helpers import assert_call, assert_problem, post_call
from tests.http.servers import ACME, ROOT, Process, Server, free_port, write_tokens
from toolledger.producers.client import TrustedContext
from toolledger.producers.http.auth import (
    AuthFailure,
    CombinedAuthenticator,
    TokenEntry,
    TokenStore,
)
from toolledger.producers.http.jwt_auth import (
    ClaimNames,
    JwksFile,
    JwtAuthenticator,
    JwtConfigError,
    JwtSettings,
    parse_jwks,
)

ISSUER = "https://issuer.test/"
AUDIENCE = "toolledger-test"

# -- a server with extra options, started through toolledger.serve --------------------------

_ENTRY = """
import asyncio, json, sys
from pathlib import Path
from toolledger.producers.http.auth import TokenStore
from toolledger import logs, serve
from toolledger.config import ToolSource
from toolledger.settings import LedgerSettings

o = json.loads(sys.argv[1])
logs.configure("INFO")
data = Path(o["data"])
data.mkdir(parents=True, exist_ok=True)
registry = ToolSource(demo=True, helpdesk_db=data / "helpdesk.db").load()
path = lambda name: Path(o[name]) if o.get(name) else None

async def main():
    door = serve.front_door(LedgerSettings(path=data / "ledger.db", create=True), registry,
        serve.Security(
            TokenStore.load(Path(o["tokens"])), jwks=path("jwks"),
            issuer=o.get("issuer"), audience=o.get("audience"), policy=path("policy"),
        ))
    async with door as front:
        await serve.serve(front, "127.0.0.1", o["port"])

asyncio.run(main())
"""


def start_guarded(
    workdir: Path,
    *,
    jwks: Path | None = None,
    issuer: str | None = None,
    audience: str | None = None,
    policy: Path | None = None,
) -> Server:
    """An embedded server with a JWKS file and/or a policy file (the tokens of servers.py)."""
    workdir.mkdir(parents=True, exist_ok=True)
    tokens = write_tokens(workdir / "tokens.json")
    data = workdir / "data"
    port = free_port()
    options = {
        "data": str(data),
        "tokens": str(tokens),
        "port": port,
        "jwks": str(jwks) if jwks else None,
        "issuer": issuer,
        "audience": audience,
        "policy": str(policy) if policy else None,
    }
    server = Server("embedded", f"http://127.0.0.1:{port}", data / "helpdesk.db", 5.0)
    log_path = workdir / "server.log"
    with open(log_path, "wb") as log_file:
        popen = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, json.dumps(options)],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server.processes.append(Process("server", popen, log_path))
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def full_log(server: Server) -> str:
    return server.processes[0].log_path.read_text(errors="replace")


def log_entries(server: Server, msg: str) -> list[dict[str, Any]]:
    entries = []
    for line in full_log(server).splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("msg") == msg:
            entries.append(entry)
    return entries


async def metric(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 if it is not there yet)."""
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


# -- keys and tokens --------------------------------------------------------------------------


@dataclass(frozen=True)
class Keys:
    rsa: RSAPrivateKey
    ec: EllipticCurvePrivateKey
    other_rsa: RSAPrivateKey  # not in the JWKS

    def jwks(self) -> dict[str, Any]:
        rsa_jwk = json.loads(RSAAlgorithm.to_jwk(self.rsa.public_key()))
        ec_jwk = json.loads(ECAlgorithm.to_jwk(self.ec.public_key()))
        return {
            "keys": [
                {**rsa_jwk, "kid": "rsa-1", "use": "sig"},
                {**ec_jwk, "kid": "ec-1", "use": "sig"},
            ]
        }


def new_keys() -> Keys:
    return Keys(
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ec.generate_private_key(ec.SECP256R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )


def claims_for(tenant: str, **overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": f"agent-{tenant}",
        "tenant_id": tenant,
        "scope": "tools:call",
        "iat": now,
        "nbf": now - 5,
        "exp": now + 600,
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def sign(
    keys: Keys, claims: dict[str, Any], *, kid: str | None = "rsa-1", alg: str = "RS256"
) -> str:
    key: Any = keys.ec if alg.startswith("ES") else keys.rsa
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(claims, key, algorithm=alg, headers=headers)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}.{b64(signature)}"


def hmac_confusion(keys: Keys, claims: dict[str, Any]) -> str:
    """HS256 with the RSA public key (PEM) as the HMAC secret: the classic confusion attack."""
    secret = keys.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


def tampered(keys: Keys, claims: dict[str, Any]) -> str:
    """A valid token whose payload is edited afterwards (tenant switched to acme)."""
    header, _, signature = sign(keys, claims).split(".")
    payload = b64(json.dumps({**claims, "tenant_id": "acme"}).encode())
    return f"{header}.{payload}.{signature}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fresh_tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keys() -> Keys:
    return new_keys()


@pytest.fixture(scope="module")
def jwt_server(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("http-jwt")
    jwks = workdir / "jwks.json"
    jwks.write_text(json.dumps(keys.jwks()))
    # this module refuses well over the default burst of 100 tokens from one address on
    # purpose (4 per bad-token case, 25 cases): the throttle those would trip is not what it
    # tests (tests/faults/test_auth_throttle.py does), so its bucket is made deep enough here
    policy = workdir / "policy.json"
    policy.write_text(json.dumps({"rate_limits": {"auth_failures": {"rate": 1, "burst": 10_000}}}))
    running = start_guarded(workdir, jwks=jwks, issuer=ISSUER, audience=AUDIENCE, policy=policy)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
async def anonymous(jwt_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=jwt_server.base_url, timeout=60) as http:
        yield http


@pytest.fixture
def key() -> str:
    return f"jwt-{uuid.uuid4().hex}"


# -- valid tokens -----------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_a_valid_jwt_executes_as_the_claimed_tenant(
    jwt_server: Server, anonymous: httpx.AsyncClient, keys: Keys, key: str, alg: str
) -> None:
    tenant = fresh_tenant()
    token = sign(keys, claims_for(tenant), kid="ec-1" if alg == "ES256" else "rsa-1", alg=alg)
    response = await post_call(
        anonymous, "create_ticket", {"title": "jwt"}, key=key, headers=bearer(token)
    )
    call = assert_call(response, "SUCCEEDED", replayed=False)
    assert call["tenant_id"] == tenant
    assert jwt_server.effects(tenant, "create_ticket", key) == 1
    found = await anonymous.get(f"/v1/calls/{call['call_id']}", headers=bearer(token))
    assert found.status_code == 200 and found.json()["tenant_id"] == tenant
    replay = await post_call(
        anonymous, "create_ticket", {"title": "jwt"}, key=key, headers=bearer(token)
    )
    assert_call(replay, "SUCCEEDED", replayed=True)
    assert jwt_server.effects(tenant, "create_ticket", key) == 1


async def test_tenant_comes_from_the_claim_never_from_the_body(
    jwt_server: Server, anonymous: httpx.AsyncClient, keys: Keys, key: str
) -> None:
    tenant = fresh_tenant()
    headers = bearer(sign(keys, claims_for(tenant)))
    smuggled = await post_call(
        anonymous, "create_ticket", {"title": "x"}, key=key, headers=headers, tenant="acme"
    )
    assert_problem(smuggled, 400, "VALIDATION_FAILED")
    in_arguments = await post_call(
        anonymous, "create_ticket", {"title": "x", "tenant_id": "acme"}, key=key, headers=headers
    )
    assert_problem(in_arguments, 400, "VALIDATION_FAILED")
    assert jwt_server.effects_with_key(key) == 0
    # the same key under two tenants' tokens: two calls, each in its own tenant
    other = fresh_tenant()
    for who in (tenant, other):
        response = await post_call(
            anonymous,
            "create_ticket",
            {"title": "x"},
            key=key,
            headers=bearer(sign(keys, claims_for(who))),
        )
        assert assert_call(response, "SUCCEEDED", replayed=False)["tenant_id"] == who
        assert jwt_server.effects(who, "create_ticket", key) == 1
    assert jwt_server.effects("acme", "create_ticket", key) == 0
    mine = await anonymous.get("/v1/calls", params={"idempotency_key": key}, headers=headers)
    assert [c["tenant_id"] for c in mine.json()["items"]] == [tenant]


async def test_opaque_tokens_of_the_tokens_file_still_work(
    jwt_server: Server, anonymous: httpx.AsyncClient, key: str
) -> None:
    response = await post_call(
        anonymous, "create_ticket", {"title": "opaque"}, key=key, headers=ACME.headers
    )
    assert assert_call(response, "SUCCEEDED", replayed=False)["tenant_id"] == "acme"


async def test_exp_has_a_small_leeway(
    jwt_server: Server, anonymous: httpx.AsyncClient, keys: Keys, key: str
) -> None:
    now = int(time.time())
    token = sign(keys, claims_for(fresh_tenant(), exp=now - 5, iat=now - 60, nbf=now + 5))
    response = await post_call(
        anonymous, "create_ticket", {"title": "leeway"}, key=key, headers=bearer(token)
    )
    assert_call(response, "SUCCEEDED", replayed=False)


@pytest.mark.parametrize(
    ("scopes", "status"),
    [
        ({"scope": "tools:call other"}, 200),
        ({"scope": None, "scopes": ["tools:call"]}, 200),
        ({"scope": None}, 403),
        ({"scope": "other"}, 403),
    ],
    ids=["scope string", "scopes list", "no scopes", "other scope"],
)
async def test_scopes_come_from_the_token(
    jwt_server: Server,
    anonymous: httpx.AsyncClient,
    keys: Keys,
    key: str,
    scopes: dict[str, Any],
    status: int,
) -> None:
    tenant = fresh_tenant()
    token = sign(keys, claims_for(tenant, **scopes))
    response = await post_call(
        anonymous, "create_ticket", {"title": "scopes"}, key=key, headers=bearer(token)
    )
    if status == 200:
        assert_call(response, "SUCCEEDED", replayed=False)
    else:
        assert_problem(response, 403, "FORBIDDEN")
        assert jwt_server.effects_with_key(key) == 0


# -- bad tokens -------------------------------------------------------------------------------

NOW = int(time.time())
BAD: dict[str, tuple[Callable[[Keys, str], str], set[str], str]] = {
    # case: (token for tenant, acceptable reasons, a fragment of the detail)
    "expired": (lambda k, t: sign(k, claims_for(t, exp=NOW - 300)), {"expired"}, "expired"),
    "not yet valid": (
        lambda k, t: sign(k, claims_for(t, nbf=int(time.time()) + 600)),
        {"not_yet_valid"},
        "not valid yet",
    ),
    "signed with another key": (
        lambda k, t: jwt.encode(claims_for(t), k.other_rsa, "RS256", {"kid": "rsa-1"}),
        {"bad_signature"},
        "signature",
    ),
    "unknown kid": (lambda k, t: sign(k, claims_for(t), kid="rsa-9"), {"unknown_kid"}, "key"),
    "no kid": (lambda k, t: sign(k, claims_for(t), kid=None), {"no_kid"}, "kid"),
    "alg none": (
        lambda k, t: unsigned({"alg": "none", "typ": "JWT", "kid": "rsa-1"}, claims_for(t)),
        {"alg_none"},
        "none",
    ),
    "alg None capitalised": (
        lambda k, t: unsigned({"alg": "None", "kid": "rsa-1"}, claims_for(t), b"x"),
        {"alg_none"},
        "none",
    ),
    "HS256 with the public key as secret": (
        lambda k, t: hmac_confusion(k, claims_for(t)),
        {"alg_not_allowed"},
        "algorithm",
    ),
    "RS512 not allowed": (
        lambda k, t: sign(k, claims_for(t), alg="RS512"),
        {"alg_not_allowed"},
        "algorithm",
    ),
    "EC signature on the RSA kid": (
        lambda k, t: sign(k, claims_for(t), kid="rsa-1", alg="ES256"),
        {"alg_not_allowed"},
        "algorithm",
    ),
    "wrong issuer": (
        lambda k, t: sign(k, claims_for(t, iss="https://evil.test/")),
        {"wrong_issuer"},
        "issuer",
    ),
    "wrong audience": (
        lambda k, t: sign(k, claims_for(t, aud="someone-else")),
        {"wrong_audience"},
        "audience",
    ),
    "no audience": (lambda k, t: sign(k, claims_for(t, aud=None)), {"missing_claim"}, "'aud'"),
    "no exp": (lambda k, t: sign(k, claims_for(t, exp=None)), {"missing_claim"}, "'exp'"),
    "no tenant claim": (
        lambda k, t: sign(k, claims_for(t, tenant_id=None)),
        {"missing_tenant"},
        "tenant_id",
    ),
    "tenant claim not a string": (
        lambda k, t: sign(k, claims_for(t, tenant_id=42)),
        {"bad_claim"},
        "tenant_id",
    ),
    "empty tenant claim": (
        lambda k, t: sign(k, claims_for(t, tenant_id="")),
        {"bad_claim"},
        "tenant_id",
    ),
    "no sub": (lambda k, t: sign(k, claims_for(t, sub=None)), {"missing_principal"}, "sub"),
    "payload edited": (lambda k, t: tampered(k, claims_for(t)), {"bad_signature"}, "signature"),
    "truncated in the payload": (
        lambda k, t: sign(k, claims_for(t))[:60],
        {"malformed"},
        "well-formed",
    ),
    "truncated signature": (
        lambda k, t: sign(k, claims_for(t))[:-11],
        {"malformed", "bad_signature"},
        "",
    ),
    "garbage with a JOSE prefix": (lambda k, t: "eyJ" + "!" * 40, {"malformed"}, "well-formed"),
    "three garbage segments": (lambda k, t: "abc.def.ghi", {"malformed"}, "well-formed"),
    "header not JSON": (lambda k, t: f"{b64(b'[1,2')}.e30.", {"malformed"}, "well-formed"),
    "unknown opaque token": (lambda k, t: "opaque-" + "x" * 30, {"unknown_token"}, "not known"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
async def test_bad_tokens_are_401_and_execute_nothing(
    jwt_server: Server, anonymous: httpx.AsyncClient, keys: Keys, key: str, case: str
) -> None:
    tenant = fresh_tenant()
    make, reasons, fragment = BAD[case]
    token = make(keys, tenant)
    before = {
        r: await metric(anonymous, "toolledger_http_auth_failures_total", reason=r) for r in reasons
    }
    response = await post_call(
        anonymous, "create_ticket", {"title": "bad jwt"}, key=key, headers=bearer(token)
    )
    problem = assert_problem(response, 401, "UNAUTHENTICATED")
    assert problem["retryable"] is False
    assert fragment in problem["detail"], problem
    assert token not in response.text
    assert response.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
    for path in ("/v1/calls", "/v1/tools", f"/v1/calls/call_{'0' * 32}"):
        assert_problem(await anonymous.get(path, headers=bearer(token)), 401, "UNAUTHENTICATED")
    # nothing executed, under any tenant, and the key is still free
    assert jwt_server.effects_with_key(key) == 0
    # counted, and logged with its reason but without the token
    after = {
        r: await metric(anonymous, "toolledger_http_auth_failures_total", reason=r) for r in reasons
    }
    assert sum(after.values()) >= sum(before.values()) + 4, (before, after)
    assert {e["reason"] for e in log_entries(jwt_server, "authentication failed")} & reasons
    assert token not in full_log(jwt_server)
    good = bearer(sign(keys, claims_for(tenant)))
    fresh = await post_call(anonymous, "create_ticket", {"title": "bad jwt"}, key=key, headers=good)
    assert_call(fresh, "SUCCEEDED", replayed=False)
    assert jwt_server.effects(tenant, "create_ticket", key) == 1
    assert jwt_server.effects_with_key(key) == 1


async def test_auth_failure_log_lines_are_structured(
    jwt_server: Server, anonymous: httpx.AsyncClient, keys: Keys
) -> None:
    token = sign(keys, claims_for(fresh_tenant(), exp=NOW - 300))
    response = await anonymous.get("/v1/tools", headers=bearer(token))
    assert_problem(response, 401, "UNAUTHENTICATED")
    entries = [
        e
        for e in log_entries(jwt_server, "authentication failed")
        if e.get("reason") == "expired" and e.get("path") == "/v1/tools"
    ]
    assert entries, full_log(jwt_server)[-2000:]
    entry = entries[-1]
    assert entry["level"] == "warning" and entry["token_kind"] == "jwt"
    assert entry["method"] == "GET"
    assert token not in json.dumps(entry)


async def test_huge_token_is_401_not_an_error(anonymous: httpx.AsyncClient, key: str) -> None:
    response = await post_call(
        anonymous, "create_ticket", {"title": "x"}, key=key, headers=bearer("eyJ" + "A" * 9000)
    )
    body = assert_problem(response, 401, "UNAUTHENTICATED")
    assert "longer" in body["detail"]


# -- the verifier and its configuration, in-process --------------------------------------------


def _authenticator(keys: Keys, tmp_path: Path, **settings: Any) -> JwtAuthenticator:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    return JwtAuthenticator.load(path, JwtSettings(ISSUER, AUDIENCE, **settings))


def test_claim_names_are_configurable(keys: Keys, tmp_path: Path) -> None:
    verifier = _authenticator(
        keys, tmp_path, claims=ClaimNames(tenant="org", principal="email", scopes="perms")
    )
    claims = claims_for("ignored", org="globex", email="bob@example.com", perms=["a", "b"])
    context = verifier.verify(sign(keys, claims))
    assert context == TrustedContext("globex", "bob@example.com", frozenset({"a", "b"}))
    missing = verifier.verify(sign(keys, claims_for("x")))
    assert isinstance(missing, AuthFailure) and missing.reason == "missing_tenant"


def test_scope_claims(keys: Keys, tmp_path: Path) -> None:
    verifier = _authenticator(keys, tmp_path)
    spaced = verifier.verify(sign(keys, claims_for("t", scope=" a  b ")))
    assert isinstance(spaced, TrustedContext) and spaced.scopes == {"a", "b"}
    listed = verifier.verify(sign(keys, claims_for("t", scope=None, scopes=["c"])))
    assert isinstance(listed, TrustedContext) and listed.scopes == {"c"}
    none = verifier.verify(sign(keys, claims_for("t", scope=None)))
    assert isinstance(none, TrustedContext) and none.scopes == frozenset()
    bad = verifier.verify(sign(keys, claims_for("t", scope=None, scopes=[1])))
    assert isinstance(bad, AuthFailure) and bad.reason == "bad_claim"


def test_several_audiences_and_algorithms(keys: Keys, tmp_path: Path) -> None:
    verifier = _authenticator(keys, tmp_path, algorithms=("PS256",))
    assert isinstance(verifier.verify(sign(keys, claims_for("t"), alg="PS256")), TrustedContext)
    refused = verifier.verify(sign(keys, claims_for("t")))  # RS256: not configured now
    assert isinstance(refused, AuthFailure) and refused.reason == "alg_not_allowed"
    path = tmp_path / "jwks.json"
    either = JwtAuthenticator.load(path, JwtSettings(ISSUER, ("a", AUDIENCE)))
    assert isinstance(either.verify(sign(keys, claims_for("t"))), TrustedContext)


@pytest.mark.parametrize("alg", ["HS256", "none", "HS512", "RS1", ""])
def test_configuring_hmac_or_none_is_refused(alg: str) -> None:
    with pytest.raises(JwtConfigError):
        JwtSettings(ISSUER, AUDIENCE, algorithms=(alg,))


def test_issuer_and_audience_are_required() -> None:
    with pytest.raises(JwtConfigError):
        JwtSettings("", AUDIENCE)
    with pytest.raises(JwtConfigError):
        JwtSettings(ISSUER, ())


def _small_rsa_jwk() -> dict[str, Any]:
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(small))
    return {**jwk, "kid": "small"}


@pytest.mark.parametrize(
    "document",
    [
        "not json",
        "[]",
        '{"keys": {}}',
        '{"keys": []}',
        '{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}',
        "no kid",
        "duplicate kid",
        "private key",
        "small rsa",
        "hmac alg",
    ],
)
def test_unusable_jwks_files_are_refused(keys: Keys, document: str) -> None:
    rsa_jwk = keys.jwks()["keys"][0]
    private: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(keys.rsa))
    special = {
        "no kid": {"keys": [{k: v for k, v in rsa_jwk.items() if k != "kid"}]},
        "duplicate kid": {"keys": [rsa_jwk, rsa_jwk]},
        "private key": {"keys": [{**private, "kid": "p"}]},
        "small rsa": {"keys": [_small_rsa_jwk()]},
        "hmac alg": {"keys": [{**rsa_jwk, "alg": "HS256"}]},
    }
    text = json.dumps(special[document]) if document in special else document
    with pytest.raises(JwtConfigError):
        parse_jwks(text, ("RS256", "ES256"))


def test_encryption_keys_are_ignored_and_jwk_alg_binds_the_key(keys: Keys) -> None:
    rsa_jwk, ec_jwk = keys.jwks()["keys"]
    parsed = parse_jwks(
        json.dumps({"keys": [{**rsa_jwk, "alg": "PS256"}, {**ec_jwk, "use": "enc"}]}),
        ("RS256", "PS256", "ES256"),
    )
    assert set(parsed) == {"rsa-1"} and parsed["rsa-1"].algorithms == ("PS256",)


def test_a_rotated_jwks_file_is_read_again(keys: Keys, tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "jwks.json"
    rsa_jwk = keys.jwks()["keys"][0]
    path.write_text(json.dumps({"keys": [rsa_jwk]}))
    jwks = JwksFile(path, ("RS256",), clock=lambda: now[0])
    verifier = JwtAuthenticator(jwks, JwtSettings(ISSUER, AUDIENCE, algorithms=("RS256",)))
    rotated = jwt.encode(claims_for("t"), keys.other_rsa, "RS256", {"kid": "rsa-2"})
    other_jwk = json.loads(RSAAlgorithm.to_jwk(keys.other_rsa.public_key()))
    path.write_text(json.dumps({"keys": [rsa_jwk, {**other_jwk, "kid": "rsa-2"}]}))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    unknown = verifier.verify(rotated)  # read again at most once a second
    assert isinstance(unknown, AuthFailure) and unknown.reason == "unknown_kid"
    now[0] = 2.0
    assert isinstance(verifier.verify(rotated), TrustedContext)
    path.write_text("broken")  # an unusable file keeps the keys read before
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    now[0] = 4.0
    still_unknown = verifier.verify(sign(keys, claims_for("t"), kid="rsa-3"))
    assert isinstance(still_unknown, AuthFailure) and still_unknown.reason == "unknown_kid"
    assert isinstance(verifier.verify(sign(keys, claims_for("t"))), TrustedContext)
    assert isinstance(verifier.verify(rotated), TrustedContext)


def test_combined_authenticator_routes_by_shape(keys: Keys, tmp_path: Path) -> None:
    store = TokenStore([TokenEntry(token="opaque-token-0123456789", tenant="a", principal="p")])
    combined = CombinedAuthenticator(store, _authenticator(keys, tmp_path))
    opaque = combined.check("Bearer opaque-token-0123456789")
    assert isinstance(opaque, TrustedContext) and opaque.tenant_id == "a"
    assert isinstance(combined.check(f"bearer {sign(keys, claims_for('b'))}"), TrustedContext)
    for header, reason in [
        (None, "missing"),
        ("Bearer ", "missing"),
        ("Basic abc", "not_bearer"),
        ("Bearer nope-nope-nope", "unknown_token"),
        ("Bearer eyJnope", "malformed"),
    ]:
        failure = combined.check(header)
        assert isinstance(failure, AuthFailure) and failure.reason == reason, header
    without_jwt = CombinedAuthenticator(store, None).check(f"Bearer {sign(keys, claims_for('b'))}")
    assert isinstance(without_jwt, AuthFailure) and without_jwt.reason == "jwt_not_accepted"
    assert combined.authenticate("Bearer opaque-token-0123456789") == opaque
    assert combined.authenticate("Bearer nope") is None
