"""Policy and authorization without a network: HTCondor's knob fallbacks, requirement
dependencies, the reconcile table, and ALLOW_/DENY_ entry forms."""
from __future__ import annotations

from pathlib import Path

import pytest

from schemas.settings import load_settings
from services.admin import Identity
from services.collector.security import (NEVER, OPTIONAL, PREFERRED, REQUIRED, Authorizer, Policy,
                                         _reconcile)


def _settings(tmp: Path, **knobs: str):  # type: ignore[no-untyped-def]
    path = tmp / "condor_config"
    path.write_text("".join(f"{k} = {v}\n" for k, v in knobs.items()))
    return load_settings(path, env={})


def test_defaults_require_encryption_and_make_negotiation_required(tmp_path: Path) -> None:
    policy = Policy(_settings(tmp_path)).level("ADVERTISE_STARTD")
    assert (policy.encryption, policy.integrity) == (REQUIRED, REQUIRED)
    assert policy.negotiation == REQUIRED  # raised by encryption REQUIRED
    assert policy.authentication_new == OPTIONAL
    assert policy.methods == ("FS", "IDTOKENS")


def test_level_knobs_fall_back_through_daemon_to_default(tmp_path: Path) -> None:
    settings = _settings(tmp_path, SEC_DAEMON_AUTHENTICATION="REQUIRED", SEC_READ_ENCRYPTION="OPTIONAL",
                         SEC_READ_INTEGRITY="OPTIONAL", SEC_DEFAULT_AUTHENTICATION_METHODS="FS")
    policy = Policy(settings)
    assert policy.level("ADVERTISE_SCHEDD").authentication_new == REQUIRED  # via SEC_DAEMON_*
    assert policy.level("NEGOTIATOR").authentication_new == OPTIONAL
    read = policy.level("READ")
    assert (read.encryption, read.negotiation) == (OPTIONAL, PREFERRED)


def test_authentication_required_without_methods_is_an_invalid_policy(tmp_path: Path) -> None:
    settings = _settings(tmp_path, SEC_DEFAULT_AUTHENTICATION="REQUIRED",
                         SEC_DEFAULT_AUTHENTICATION_METHODS="KERBEROS")
    with pytest.raises(Exception, match="no supported method"):
        Policy(settings).level("READ")


@pytest.mark.parametrize("client,server,expected", [
    (REQUIRED, NEVER, "FAIL"), (REQUIRED, OPTIONAL, "YES"), (PREFERRED, NEVER, "NO"),
    (OPTIONAL, OPTIONAL, "NO"), (OPTIONAL, PREFERRED, "YES"), (NEVER, REQUIRED, "FAIL"),
    (None, REQUIRED, "FAIL"), (None, OPTIONAL, "NO")])
def test_reconcile_table(client: int | None, server: int, expected: str) -> None:
    assert _reconcile(client, server) == expected


def test_allow_and_deny_entries(tmp_path: Path) -> None:
    auth = Authorizer(_settings(
        tmp_path, ALLOW_DAEMON="condor@pool.example/*, 10.1.0.0/16", ALLOW_READ="*",
        DENY_ADVERTISE_STARTD="*/10.1.2.3", ALLOW_NEGOTIATOR="neg@pool.example"))
    condor = Identity("condor", "pool.example", "")
    nobody = Identity("unauthenticated", "unmapped", "")
    assert auth.check("ADVERTISE_STARTD", condor, "192.0.2.7") is None  # ALLOW_DAEMON fallback
    assert auth.check("ADVERTISE_STARTD", nobody, "10.1.9.9") is None  # a network entry
    assert "matches DENY_ADVERTISE_STARTD" in (auth.check("ADVERTISE_STARTD", condor, "10.1.2.3") or "")
    assert auth.check("ADVERTISE_MASTER", condor, "10.1.2.3") is None  # the deny is per level
    assert "is not in ALLOW_ADVERTISE_SCHEDD (ALLOW_DAEMON applies)" in (
        auth.check("ADVERTISE_SCHEDD", nobody, "192.0.2.7") or "")
    assert auth.check("READ", nobody, "192.0.2.7") is None
    assert auth.check("NEGOTIATOR", Identity("neg", "pool.example", ""), "192.0.2.7") is None
    assert auth.check("NEGOTIATOR", condor, "192.0.2.7") is not None


def test_a_level_without_allow_lists_is_open_and_implied_levels_count(tmp_path: Path) -> None:
    auth = Authorizer(_settings(tmp_path, ALLOW_ADMINISTRATOR="root@*", ALLOW_WRITE="writer@*"))
    nobody = Identity("unauthenticated", "unmapped", "")
    assert auth.check("READ", nobody, "127.0.0.1") is None  # no ALLOW_READ/DEFAULT: open
    assert auth.check("WRITE", Identity("root", "x", ""), "127.0.0.1") is None  # ADMINISTRATOR implies WRITE
    assert auth.check("WRITE", nobody, "127.0.0.1") is not None


def test_an_unworkable_policy_fails_at_start_naming_the_knob(tmp_path: Path) -> None:
    from services.collector.port import CollectorError
    from services.collector.server import CollectorServer
    from tests.collector.cedar_harness import MemoryBackend

    settings = _settings(tmp_path, SEC_DAEMON_AUTHENTICATION="REQUIRED",
                         SEC_DAEMON_AUTHENTICATION_METHODS="KERBEROS")
    with pytest.raises(CollectorError, match="SEC_DAEMON_AUTHENTICATION is REQUIRED but SEC_DAEMON_AUTHENTICATION_METHODS names no supported"):
        CollectorServer(settings, MemoryBackend())
