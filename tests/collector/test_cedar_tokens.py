"""IDTOKENS with the real htcondor2 client: a token signed with the pool signing key (made here
as condor_token_create makes it) authenticates; an expired or a foreign-signed one is refused."""
from __future__ import annotations

import os
from pathlib import Path

from services.collector.tokens import create_token, read_signing_key, write_signing_key
from tests.collector.cedar_harness import Endpoint, advertise_ok, run_client, wait_for

ADVERTISE = """
c = htcondor2.Collector(ADDR)
try:
    c.advertise([slot("slot1@tok.example")], "UPDATE_STARTD_AD")
    out(ok=True)
except Exception as exc:
    out(ok=False, error=str(exc))
"""


def _pool(tmp: Path, name: str = "POOL", secret: bytes | None = None) -> Path:
    path = tmp / name
    write_signing_key(path, secret or os.urandom(64))
    return path


def _client(tmp: Path, token: str) -> dict[str, str]:
    tokens = tmp / f"tokens_{abs(hash(token))}"
    tokens.mkdir(mode=0o700)
    (tokens / "tok").write_text(token + "\n")
    (tokens / "tok").chmod(0o600)
    return {"SEC_CLIENT_AUTHENTICATION_METHODS": "IDTOKENS", "SEC_TOKEN_DIRECTORY": str(tokens)}


def _server(key: Path, **extra: str) -> dict[str, str]:
    return {"SEC_DEFAULT_AUTHENTICATION": "REQUIRED", "SEC_DEFAULT_AUTHENTICATION_METHODS": "IDTOKENS",
            "SEC_TOKEN_POOL_SIGNING_KEY_FILE": str(key), "TRUST_DOMAIN": "pool.example", **extra}


def test_valid_token_authenticates_its_subject(tmp_path: Path) -> None:
    key = _pool(tmp_path)
    token = create_token(read_signing_key(key, pool=True), "pool.example", "condor@pool.example",
                         lifetime=3600)
    with Endpoint(tmp_path, _server(key, ALLOW_ADVERTISE_STARTD="condor@pool.example")) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path, _client(tmp_path, token))
        assert result.get("ok") is True, result["output"][-4000:]
        assert wait_for(lambda: len(ep.backend.peers) >= 1)
        (peer,) = ep.backend.peers
        assert (peer.user, peer.method, peer.encrypted) == ("condor@pool.example", "IDTOKENS", True)
        assert ep.refusals() == []


def test_expired_token_is_refused(tmp_path: Path) -> None:
    key = _pool(tmp_path)
    token = create_token(read_signing_key(key, pool=True), "pool.example", "condor@pool.example",
                         lifetime=60, now=1_700_000_000)
    with Endpoint(tmp_path, _server(key)) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path, _client(tmp_path, token))
        assert result.get("ok") is False
        assert ep.backend.ads == {}
        assert wait_for(lambda: len(ep.refusals()) >= 1)
        (line,) = ep.refusals()
        assert "required authentication failed" in line and "expired" in line
        assert advertise_ok(ep.port, tmp_path, config=_client(tmp_path, create_token(
            read_signing_key(key, pool=True), "pool.example", "condor@pool.example")))["names"]


def test_foreign_signed_token_is_refused(tmp_path: Path) -> None:
    key = _pool(tmp_path)
    foreign = _pool(tmp_path, "OTHER_POOL")
    token = create_token(read_signing_key(foreign, pool=True), "pool.example", "condor@pool.example",
                         lifetime=3600)
    with Endpoint(tmp_path, _server(key, POOLLEDGER_COLLECTOR_TIMEOUT="3")) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path, _client(tmp_path, token))
        assert result.get("ok") is False
        assert ep.backend.ads == {}
        assert wait_for(lambda: len(ep.refusals()) >= 1)
        (line,) = ep.refusals()
        assert "not signed with the key it names" in line


def test_token_scopes_limit_authorization(tmp_path: Path) -> None:
    key = _pool(tmp_path)
    token = create_token(read_signing_key(key, pool=True), "pool.example", "reader@pool.example",
                         scopes=("READ",))
    with Endpoint(tmp_path, _server(key)) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path, _client(tmp_path, token))
        assert result.get("ok") is False
        assert wait_for(lambda: len(ep.refusals()) >= 1)
        (line,) = ep.refusals()
        assert "scopes (READ) do not include ADVERTISE_STARTD" in line
