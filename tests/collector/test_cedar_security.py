"""Security modes with the real htcondor2 client, accepted or refused as HTCondor would: the
stock 25.x policy, encryption refused by the client, SEC_CLIENT_NEGOTIATION = NEVER, FS
authentication, and authorization by ALLOW_/DENY_ levels."""
from __future__ import annotations

import getpass
from pathlib import Path

from tests.collector.cedar_harness import Endpoint, advertise_ok, run_client, wait_for

ADVERTISE = """
c = htcondor2.Collector(ADDR)
try:
    c.advertise([slot("slot1@sec.example")], "UPDATE_STARTD_AD")
    out(ok=True)
except Exception as exc:
    out(ok=False, error=str(exc))
"""

PERMISSIVE = {"SEC_DEFAULT_ENCRYPTION": "OPTIONAL", "SEC_DEFAULT_INTEGRITY": "OPTIONAL"}
FS_REQUIRED = {"SEC_DEFAULT_AUTHENTICATION": "REQUIRED", "SEC_DEFAULT_AUTHENTICATION_METHODS": "FS",
               "UID_DOMAIN": "sec.example"}


def test_stock_25_policy_is_accepted_encrypted(tmp_path: Path) -> None:
    with Endpoint(tmp_path) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path, {"use security": "recommended"})
        assert result.get("ok") is True, result["output"][-3000:]
        assert wait_for(lambda: len(ep.backend.peers) >= 1)
        (peer,) = ep.backend.peers
        assert peer.encrypted and peer.user is None
        assert ep.refusals() == []


def test_client_refusing_encryption_is_refused_when_encryption_is_required(tmp_path: Path) -> None:
    with Endpoint(tmp_path) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path,
                            {"SEC_CLIENT_ENCRYPTION": "NEVER", "SEC_CLIENT_INTEGRITY": "NEVER"})
        assert result.get("ok") is False
        assert ep.backend.ads == {}
        assert wait_for(lambda: len(ep.refusals()) >= 1)
        (line,) = ep.refusals()
        assert "cannot reconcile security policy (encryption, integrity)" in line
        assert advertise_ok(ep.port, tmp_path)["names"] == ["slot1@ok.example"]


def test_negotiation_never_is_refused_by_default_and_accepted_when_policy_allows(tmp_path: Path) -> None:
    never = {"SEC_CLIENT_NEGOTIATION": "NEVER"}
    with Endpoint(tmp_path) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path, never)
        assert ep.backend.ads == {}
        assert wait_for(lambda: len(ep.refusals()) >= 1)
        (line,) = ep.refusals()
        assert "UPDATE_STARTD_AD" in line and "SEC_CLIENT_NEGOTIATION = NEVER is refused" in line
        del result
    with Endpoint(tmp_path, PERMISSIVE) as ep:
        result = run_client(ep.port, ADVERTISE + """
q = c.query(htcondor2.AdType.Startd, projection=["Name"])
out(ok=True, names=[a["Name"] for a in q])
""", tmp_path, never)
        assert result.get("names") == ["slot1@sec.example"], result["output"][-3000:]
        assert all(not p.encrypted for p in ep.backend.peers)
        assert ep.refusals() == []


def test_fs_authentication_names_the_local_user(tmp_path: Path) -> None:
    with Endpoint(tmp_path, FS_REQUIRED) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path, {"SEC_CLIENT_AUTHENTICATION_METHODS": "FS"})
        assert result.get("ok") is True, result["output"][-3000:]
        assert wait_for(lambda: len(ep.backend.peers) >= 1)
        (peer,) = ep.backend.peers
        assert (peer.user, peer.method, peer.encrypted) == (f"{getpass.getuser()}@sec.example", "FS", True)
        assert ep.refusals() == []


def test_required_authentication_without_a_common_method_is_refused(tmp_path: Path) -> None:
    with Endpoint(tmp_path, FS_REQUIRED) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path,
                            {"SEC_CLIENT_AUTHENTICATION_METHODS": "CLAIMTOBE"})
        assert result.get("ok") is False
        assert ep.backend.ads == {}
        assert len(ep.refusals()) == 1


def test_unauthorized_identity_is_refused_and_others_served(tmp_path: Path) -> None:
    me = getpass.getuser()
    config = {**FS_REQUIRED, "ALLOW_ADVERTISE_STARTD": "condor@sec.example/*", "ALLOW_READ": "*"}
    client = {"SEC_CLIENT_AUTHENTICATION_METHODS": "FS"}
    with Endpoint(tmp_path, config) as ep:
        result = run_client(ep.port, ADVERTISE, tmp_path, client)
        assert result.get("ok") is False
        assert ep.backend.ads == {}
        assert wait_for(lambda: len(ep.refusals()) >= 1)
        (line,) = ep.refusals()
        assert f"{me}@sec.example from 127.0.0.1 is not in ALLOW_ADVERTISE_STARTD" in line
        # a query needs READ only: the same identity is served
        result = run_client(ep.port, """
c = htcondor2.Collector(ADDR)
out(n=len(c.query(htcondor2.AdType.Startd)))
""", tmp_path, client)
        assert result.get("n") == 0, result["output"][-3000:]


def test_allow_daemon_covers_advertise_levels_and_deny_wins(tmp_path: Path) -> None:
    me = getpass.getuser()
    client = {"SEC_CLIENT_AUTHENTICATION_METHODS": "FS"}
    with Endpoint(tmp_path, {**FS_REQUIRED, "ALLOW_DAEMON": f"{me}@sec.example"}) as ep:
        assert run_client(ep.port, ADVERTISE, tmp_path, client).get("ok") is True
    with Endpoint(tmp_path, {**FS_REQUIRED, "ALLOW_DAEMON": "*",
                             "DENY_ADVERTISE_STARTD": f"{me}@*/127.0.0.1"}) as ep:
        assert run_client(ep.port, ADVERTISE, tmp_path, client).get("ok") is False
        assert wait_for(lambda: len(ep.refusals()) >= 1)
        (line,) = ep.refusals()
        assert "DENY_ADVERTISE_STARTD" in line
