"""The real htcondor2 client against the CEDAR endpoint with the client's default security:
advertise, query (constraint, projection), locate, getPriorities, ping, resumed sessions."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.collector.cedar_harness import Endpoint, run_client


@pytest.fixture()
def endpoint(tmp_path: Path):
    with Endpoint(tmp_path) as ep:
        yield ep


def test_advertise_query_locate_priorities_with_client_defaults(endpoint: Endpoint, tmp_path: Path) -> None:
    result = run_client(endpoint.port, r"""
        c = htcondor2.Collector(ADDR)
        c.advertise([slot("slot1@a.example", Cpus=8, Path="C:\\Users\\x"),
                     slot("slot2@a.example", Cpus=2)], "UPDATE_STARTD_AD")
        neg = classad2.ClassAd({"MyType": "Negotiator", "Name": "neg@cm", "MyAddress": f"<{ADDR}>"})
        c.advertise([neg], "UPDATE_NEGOTIATOR_AD")
        big = c.query(htcondor2.AdType.Startd, constraint="Cpus > 4", projection=["Name", "Path"])
        every = c.query(htcondor2.AdType.Startd)
        located = c.locate(htcondor2.DaemonType.Negotiator)
        prios = htcondor2.Negotiator(located).getPriorities()
        out(big=[dict(a) for a in big], every=sorted(a["Name"] for a in every),
            located=located["MyAddress"], prios=[dict(p) for p in prios])
    """, tmp_path)
    assert result["rc"] == 0, result["output"][-3000:]
    assert result["big"] == [{"Name": "slot1@a.example", "Path": "C:\\Users\\x"}]
    assert result["every"] == ["slot1@a.example", "slot2@a.example"]
    assert result["located"] == f"<127.0.0.1:{endpoint.port}>"
    names = {p["Name"]: p["Priority"] for p in result["prios"]}
    assert names == {"alice@pool": 0.5, "bob@pool": 12.25}
    ad = endpoint.backend.ads[("Machine", "slot1@a.example")]
    assert ad["Path"] == "C:\\Users\\x" and ad["Cpus"] == 8
    peers = endpoint.backend.peers
    assert all(p.encrypted and p.transport == "tcp" and p.user is None for p in peers)
    assert endpoint.refusals() == []


def test_one_session_per_level_is_resumed_by_later_commands(endpoint: Endpoint, tmp_path: Path) -> None:
    result = run_client(endpoint.port, """
        c = htcondor2.Collector(ADDR)
        for i in range(3):
            c.advertise([slot(f"slot{i}@r.example")], "UPDATE_STARTD_AD")
            n = len(c.query(htcondor2.AdType.Startd))
        out(n=n)
    """, tmp_path)
    assert result["rc"] == 0, result["output"][-3000:]
    assert result["n"] == 3
    # three advertises and three queries on six connections, but one session per level
    assert endpoint.server is not None
    assert len(endpoint.server.security.sessions) == 2
    assert endpoint.backend.count("Machine") == 3


def test_persistent_connection_carries_many_updates_and_ping_answers(endpoint: Endpoint,
                                                                     tmp_path: Path) -> None:
    result = run_client(endpoint.port, """
        c = htcondor2.Collector(ADDR)
        c.advertise([slot(f"slot{i}@p.example") for i in range(50)], "UPDATE_STARTD_AD")
        reply = htcondor2.ping(f"<{ADDR}>", "DC_NOP")
        out(reply=dict(reply))
    """, tmp_path)
    assert result["rc"] == 0, result["output"][-3000:]
    assert endpoint.backend.count("Machine") == 50
    assert result["reply"].get("AuthorizationSucceeded") is True
    assert endpoint.refusals() == []


def test_invalidate_removes_the_named_ad(endpoint: Endpoint, tmp_path: Path) -> None:
    result = run_client(endpoint.port, """
        c = htcondor2.Collector(ADDR)
        c.advertise([slot("slot1@i.example"), slot("slot2@i.example")], "UPDATE_STARTD_AD")
        q = classad2.ClassAd({"MyType": "Query", "TargetType": "Machine", "Name": "slot1@i.example",
                              "Requirements": classad2.ExprTree('Name == "slot1@i.example"')})
        c.advertise([q], "INVALIDATE_STARTD_ADS")
        out(left=sorted(a["Name"] for a in c.query(htcondor2.AdType.Startd)))
    """, tmp_path)
    assert result["rc"] == 0, result["output"][-3000:]
    assert result["left"] == ["slot2@i.example"]
    assert "invalidate Machine" in endpoint.backend.calls
