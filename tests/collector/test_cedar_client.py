"""The real htcondor2 client against the CEDAR endpoint with the client's default security:
advertise, query (constraint, projection), locate, getPriorities, ping, resumed sessions."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.collector.cedar_harness import Endpoint, run_client, wait_for


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
        settle(c, 2)
        settle(c, 1, htcondor2.AdType.Negotiator)
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
            settle(c, i + 1)
            n = len(c.query(htcondor2.AdType.Startd))
        out(n=n)
    """, tmp_path)
    assert result["rc"] == 0, result["output"][-3000:]
    assert result["n"] == 3
    # three advertises and three queries on six connections
    assert endpoint.server is not None
    assert len(endpoint.server.security.sessions) == 1  # the levels share one policy: one session
    assert wait_for(lambda: endpoint.backend.count("Machine") == 3)


def test_persistent_connection_carries_many_updates_and_ping_answers(endpoint: Endpoint,
                                                                     tmp_path: Path) -> None:
    result = run_client(endpoint.port, """
        c = htcondor2.Collector(ADDR)
        c.advertise([slot(f"slot{i}@p.example") for i in range(50)], "UPDATE_STARTD_AD")
        reply = htcondor2.ping(f"<{ADDR}>", "DC_NOP")
        out(reply=dict(reply))
    """, tmp_path)
    assert result["rc"] == 0, result["output"][-3000:]
    assert wait_for(lambda: endpoint.backend.count("Machine") == 50)
    assert result["reply"].get("AuthorizationSucceeded") is True
    assert endpoint.refusals() == []


def test_invalidate_removes_the_named_ad(endpoint: Endpoint, tmp_path: Path) -> None:
    result = run_client(endpoint.port, """
        c = htcondor2.Collector(ADDR)
        c.advertise([slot("slot1@i.example"), slot("slot2@i.example")], "UPDATE_STARTD_AD")
        q = classad2.ClassAd({"MyType": "Query", "TargetType": "Machine", "Name": "slot1@i.example",
                              "Requirements": classad2.ExprTree('Name == "slot1@i.example"')})
        settle(c, 2)
        c.advertise([q], "INVALIDATE_STARTD_ADS")
        deadline = time.monotonic() + 10
        while len(c.query(htcondor2.AdType.Startd)) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        out(left=sorted(a["Name"] for a in c.query(htcondor2.AdType.Startd)))
    """, tmp_path)
    assert result["rc"] == 0, result["output"][-3000:]
    assert result["left"] == ["slot2@i.example"]
    assert "invalidate Machine" in endpoint.backend.calls


def test_restart_costs_a_client_at_most_its_next_command(tmp_path: Path) -> None:
    ep = Endpoint(tmp_path).start()
    flag = tmp_path / "restarted"
    try:
        proc_result: dict = {}
        import threading

        def client() -> None:
            proc_result.update(run_client(ep.port, f"""
                c = htcondor2.Collector(ADDR)
                c.advertise([slot("slot1@before.example")], "UPDATE_STARTD_AD")
                c.query(htcondor2.AdType.Startd)
                print("READY", flush=True)
                open({str(tmp_path / 'ready')!r}, "w").close()
                while not os.path.exists({str(flag)!r}):
                    time.sleep(0.05)
                outcomes = []
                for i in range(4):
                    try:
                        c.advertise([slot(f"slot{{i}}@after.example")], "UPDATE_STARTD_AD")
                        n = len(c.query(htcondor2.AdType.Startd))
                        outcomes.append("ok")
                    except Exception as exc:
                        outcomes.append("failed")
                out(outcomes=outcomes)
            """, tmp_path))

        thread = threading.Thread(target=client)
        thread.start()
        from tests.collector.cedar_harness import wait_for
        assert wait_for(lambda: (tmp_path / "ready").exists(), 30)
        ep.restart()  # same port, empty session cache
        flag.touch()
        thread.join(60)
        outcomes = proc_result.get("outcomes")
        assert outcomes is not None, proc_result.get("output", "")[-3000:]
        assert outcomes[1:] == ["ok", "ok", "ok"], outcomes  # only the next command may fail
        assert ep.backend.count("Machine") >= 4
        assert any("SID_NOT_FOUND" in line for line in ep.refusals()) or outcomes[0] == "ok"
    finally:
        ep.stop()


def test_forwarded_startd_update_carries_public_and_private_ads(endpoint: Endpoint) -> None:
    import asyncio

    import classad2

    from services.collector.cedar import Writer
    from tests.collector.cedar_harness import RawClient, wait_for

    async def forward(port: int) -> None:
        client = RawClient(port)
        await client.negotiate(0)
        public = classad2.ClassAd({"MyType": "Machine", "Name": "slot1@fwd.example", "Cpus": 2})
        private = classad2.ClassAd({"MyType": "Machine", "Name": "slot1@fwd.example",
                                    "Capability": "<1.2.3.4:9618>#123#1#..."})
        assert client.channel is not None
        # the first update rides the negotiated session; the next come raw on the same connection
        client.channel.send(Writer(True).ad(public).ad(private).payload())
        for i in range(2, 4):
            public = classad2.ClassAd({"MyType": "Machine", "Name": f"slot{i}@fwd.example"})
            client.channel.send(Writer(True).integer(0).ad(public).ad(private).payload())
        client.channel.send(Writer(True).integer(60011).payload())
        await client.channel.drain()
        await asyncio.sleep(0.3)
        client.close()

    asyncio.run(forward(endpoint.port))
    assert wait_for(lambda: endpoint.backend.count("Machine") == 3)
    key = ("Machine", "slot1@fwd.example")
    assert "Capability" not in endpoint.backend.ads[key]
    assert endpoint.backend.private[key]["Capability"].startswith("<1.2.3.4")
    assert endpoint.refusals() == []


def test_udp_datagram_when_policy_allows_raw_commands(tmp_path: Path) -> None:
    import socket

    import classad2

    from services.collector.cedar import Writer
    from tests.collector.cedar_harness import wait_for

    config = {"SEC_DEFAULT_ENCRYPTION": "OPTIONAL", "SEC_DEFAULT_INTEGRITY": "OPTIONAL"}
    with Endpoint(tmp_path, config) as ep:
        ad = classad2.ClassAd({"MyType": "Machine", "Name": "slot1@udp.example", "Cpus": 1,
                               "ClaimId": "secret"})
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(Writer(False).integer(0).ad(ad).payload(), ("127.0.0.1", ep.port))
            sock.sendto(b"\x00" * 3, ("127.0.0.1", ep.port))
        assert wait_for(lambda: ep.backend.count("Machine") == 1)
        assert wait_for(lambda: len(ep.backend.peers) >= 1)
        (peer,) = ep.backend.peers
        assert peer.transport == "udp" and not peer.encrypted
        assert "ClaimId" not in ep.backend.ads[("Machine", "slot1@udp.example")]
        assert wait_for(lambda: len(ep.refusals()) == 1)
        assert "(UDP)" in ep.refusals()[0] and "truncated" in ep.refusals()[0]
    with Endpoint(tmp_path) as ep:  # encryption required: a raw UDP update is refused
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(Writer(False).integer(0).ad(ad).payload(), ("127.0.0.1", ep.port))
        assert wait_for(lambda: len(ep.refusals()) == 1)
        assert ep.backend.ads == {}


def test_query_multiple_ads_as_condor_status_sends_it(endpoint: Endpoint, tmp_path: Path) -> None:
    import asyncio

    import classad2

    from services.collector.cedar import Reader
    from tests.collector.cedar_harness import RawClient

    assert run_client(endpoint.port, """
        htcondor2.Collector(ADDR).advertise([slot("slot1@m.example"), slot("slot2@m.example")],
                                            "UPDATE_STARTD_AD")
        out(ok=True)
    """, tmp_path).get("ok")

    async def status(port: int) -> list[dict]:
        client = RawClient(port)
        await client.negotiate(53)
        query = classad2.ClassAd({"MyType": "Query", "TargetType": "Machine",
                                  "MachineProjection": "Name",
                                  "MachineRequirements": classad2.ExprTree("true")})
        client.send_ad(query)
        assert client.channel is not None
        await client.channel.drain()
        reply = Reader(await client.channel.receive(), True)
        ads = []
        while reply.integer() == 1:
            ads.append(dict(reply.ad(1000)[0]))
        reply.done()
        client.close()
        return ads

    ads = asyncio.run(status(endpoint.port))
    assert sorted(a["Name"] for a in ads) == ["slot1@m.example", "slot2@m.example"]
    assert "query None" in endpoint.backend.calls


def test_udp_with_a_negotiated_session_is_refused_by_the_client_cleanly(endpoint: Endpoint,
                                                                       tmp_path: Path) -> None:
    """The client first makes a session over TCP (DC_AUTHENTICATE as the real command: no
    payload follows), then finds AES-GCM unusable over UDP and gives up: nothing is refused
    here, and the session-only request did not wait for a payload."""
    result = run_client(endpoint.port, """
        try:
            htcondor2.Collector(ADDR).advertise([slot("slot1@u.example")], "UPDATE_STARTD_AD",
                                                use_tcp=False)
            out(ok=True)
        except Exception:
            out(ok=False)
    """, tmp_path)
    assert result.get("ok") is False  # "AES not supported for UDP" on the client's side
    from tests.collector.cedar_harness import wait_for
    assert wait_for(lambda: endpoint.server is not None and len(endpoint.server.security.sessions) == 1)
    assert endpoint.refusals() == []


def test_update_with_ack_is_acknowledged(endpoint: Endpoint) -> None:
    import asyncio

    import classad2

    from services.collector.cedar import Reader
    from tests.collector.cedar_harness import RawClient

    async def update(port: int) -> int:
        client = RawClient(port)
        await client.negotiate(60)  # UPDATE_STARTD_AD_WITH_ACK
        client.send_ad(classad2.ClassAd({"MyType": "Machine", "Name": "slot1@ack.example"}))
        assert client.channel is not None
        await client.channel.drain()
        ack = Reader(await client.channel.receive(), True)
        client.close()
        return ack.integer()

    assert asyncio.run(update(endpoint.port)) == 1
    assert endpoint.backend.count("Machine") == 1


def test_a_reply_of_many_packets(endpoint: Endpoint, tmp_path: Path) -> None:
    result = run_client(endpoint.port, """
        c = htcondor2.Collector(ADDR)
        pad = "x" * 200
        c.advertise([slot(f"slot{i}@big.example", Pad=pad) for i in range(600)], "UPDATE_STARTD_AD")
        settle(c, 600)
        ads = c.query(htcondor2.AdType.Startd)
        out(n=len(ads), names=len({a["Name"] for a in ads}), pads=all(a["Pad"] == pad for a in ads))
    """, tmp_path)
    assert (result.get("n"), result.get("names"), result.get("pads")) == (600, 600, True), \
        result["output"][-3000:]
