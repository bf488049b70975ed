"""Hostile input to the CEDAR endpoint: each refused with ONE log line naming the peer and the
reason, the connection dropped, nothing handed to the backend, and another client still served."""
from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from pathlib import Path

import classad2

from services.collector.cedar import Writer
from tests.collector.cedar_harness import Endpoint, RawClient, advertise_ok, raw_bytes, run_client, wait_for

MB = 1024 * 1024
UPDATE_STARTD_AD = 0


def _slot(name: str) -> classad2.ClassAd:
    return classad2.ClassAd({"MyType": "Machine", "Name": name, "Cpus": 1})


def _one_refusal(ep: Endpoint, reason: str) -> str:
    assert wait_for(lambda: len(ep.refusals()) >= 1)
    time.sleep(0.1)
    lines = ep.refusals()
    assert len(lines) == 1, lines
    assert lines[0].startswith("refused 127.0.0.1:"), lines[0]
    assert reason in lines[0], lines[0]
    return lines[0]


def _still_serves(ep: Endpoint, tmp: Path, before: int = 0) -> None:
    assert ep.backend.count("Machine") == before
    assert "slot1@ok.example" in advertise_ok(ep.port, tmp)["names"]


def test_garbage_bytes(tmp_path: Path) -> None:
    with Endpoint(tmp_path) as ep:
        assert raw_bytes(ep.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == b""
        _one_refusal(ep, "garbage")
        _still_serves(ep, tmp_path)


def test_packet_over_one_megabyte(tmp_path: Path) -> None:
    with Endpoint(tmp_path) as ep:
        raw_bytes(ep.port, b"\x01" + struct.pack(">I", 2 * MB) + b"x" * 1000)
        _one_refusal(ep, f"a packet of {2 * MB} bytes (over the 1 MB limit)")
        _still_serves(ep, tmp_path)


def test_negative_length(tmp_path: Path) -> None:
    with Endpoint(tmp_path) as ep:
        raw_bytes(ep.port, b"\x01" + struct.pack(">i", -16) + b"x" * 16)
        _one_refusal(ep, "a packet of length -16 (must be > 0)")
        _still_serves(ep, tmp_path)


def test_truncated_packet_and_truncated_message(tmp_path: Path) -> None:
    with Endpoint(tmp_path) as ep:
        raw_bytes(ep.port, b"\x01" + struct.pack(">I", 100) + b"x" * 10)
        _one_refusal(ep, "truncated message")
        _still_serves(ep, tmp_path)
    with Endpoint(tmp_path) as ep:  # a whole packet whose ad stops after one of five strings
        body = Writer(False).integer(60010).integer(5).string("Command = 0").payload()
        raw_bytes(ep.port, b"\x01" + struct.pack(">I", len(body)) + body)
        _one_refusal(ep, "truncated message (a string has no terminating NUL)")
        _still_serves(ep, tmp_path)


def test_bad_gcm_tag(tmp_path: Path) -> None:
    async def attack(port: int) -> bool:
        client = RawClient(port)
        await client.negotiate(UPDATE_STARTD_AD)
        assert client.channel is not None
        sealed = bytearray(client.channel._packet(Writer(True).ad(_slot("slot9@evil")).payload(), True))
        sealed[-20] ^= 0x01  # one bit of ciphertext
        client.channel.writer.write(bytes(sealed))
        closed = await client.closed_by_server()
        client.close()
        return closed

    with Endpoint(tmp_path) as ep:
        assert asyncio.run(attack(ep.port))
        _one_refusal(ep, "bad GCM tag")
        _still_serves(ep, tmp_path)


def test_replayed_session_id_and_unknown_session(tmp_path: Path) -> None:
    async def attack(port: int) -> tuple[bytes, str, str]:
        honest = RawClient(port)
        await honest.negotiate(UPDATE_STARTD_AD)
        wire = honest.send_ad(_slot("slot1@honest"))
        assert honest.channel is not None
        await honest.channel.drain()
        honest.close()
        assert honest.sid is not None
        # an eavesdropper saw the Sid (plaintext) and the sealed update, not the key
        thief = RawClient(port)
        reply = await thief.resume(UPDATE_STARTD_AD, honest.sid, key=None)
        assert thief.channel is not None
        thief.channel.writer.write(wire)
        closed = await thief.closed_by_server()
        thief.close()
        assert closed
        stranger = RawClient(port)
        unknown = await stranger.resume(UPDATE_STARTD_AD, "nosuch:1:2:3", key=None)
        closed = await stranger.closed_by_server()
        stranger.close()
        assert closed
        return wire, str(reply["ReturnCode"]), str(unknown["ReturnCode"])

    with Endpoint(tmp_path) as ep:
        _, resumed, unknown = asyncio.run(attack(ep.port))
        assert (resumed, unknown) == ("AUTHORIZED", "SID_NOT_FOUND")
        assert wait_for(lambda: len(ep.refusals()) == 2)
        replay, stranger = ep.refusals()
        assert "bad GCM tag" in replay
        assert "resume of unknown or expired session nosuch:1:2:3" in stranger
        assert ep.backend.calls == ["update Machine slot1@honest"]
        _still_serves(ep, tmp_path, before=1)


def test_unencrypted_session_when_encryption_required(tmp_path: Path) -> None:
    async def attack(port: int) -> bool:
        client = RawClient(port)
        channel = await client.connect()
        ad = classad2.ClassAd({"Command": UPDATE_STARTD_AD, "NewSession": "YES", "Enact": "NO",
                               "Authentication": "NEVER", "Encryption": "NEVER", "Integrity": "NEVER"})
        channel.send(Writer(False).integer(60010).ad(ad).payload())
        await channel.drain()
        closed = await client.closed_by_server()
        client.close()
        return closed

    with Endpoint(tmp_path) as ep:
        assert asyncio.run(attack(ep.port))
        _one_refusal(ep, "cannot reconcile security policy (encryption, integrity)")
        _still_serves(ep, tmp_path)
    with Endpoint(tmp_path) as ep:  # a raw command, no negotiation at all
        body = Writer(False).integer(UPDATE_STARTD_AD).ad(_slot("slot1@raw")).payload()
        raw_bytes(ep.port, b"\x01" + struct.pack(">I", len(body)) + body)
        _one_refusal(ep, "SEC_CLIENT_NEGOTIATION = NEVER is refused")
        _still_serves(ep, tmp_path)


def test_slow_sender_and_silent_connection(tmp_path: Path) -> None:
    with Endpoint(tmp_path, {"POOLLEDGER_COLLECTOR_TIMEOUT": "1"}) as ep:
        slow = socket.create_connection(("127.0.0.1", ep.port))
        slow.sendall(b"\x01\x00\x00")  # half a header, then nothing
        served = advertise_ok(ep.port, tmp_path)  # served meanwhile
        assert served["names"] == ["slot1@ok.example"], served["output"][-2000:]
        _one_refusal(ep, "took over 1 s to arrive (slow sender)")
        assert slow.recv(10) == b""  # dropped
        slow.close()
    with Endpoint(tmp_path, {"POOLLEDGER_COLLECTOR_TIMEOUT": "1"}) as ep:
        silent = socket.create_connection(("127.0.0.1", ep.port))
        _one_refusal(ep, "no command for 1 s (idle timeout)")
        assert silent.recv(10) == b""
        silent.close()


def test_ad_with_100000_attributes(tmp_path: Path) -> None:
    with Endpoint(tmp_path) as ep:
        result = run_client(ep.port, """
            ad = slot("slot1@huge.example")
            for i in range(100_000):
                ad[f"Attr{i}"] = i
            try:
                htcondor2.Collector(ADDR).advertise([ad], "UPDATE_STARTD_AD")
                out(ok=True)
            except Exception as exc:
                out(ok=False)
        """, tmp_path)
        assert "ok" in result, result["output"][-2000:]
        _one_refusal(ep, "an ad with 100006 attributes (more than 10000)")
        _still_serves(ep, tmp_path)


def test_more_connections_than_the_maximum(tmp_path: Path) -> None:
    async def crowd(port: int) -> tuple[list[bytes], int]:
        first = [RawClient(port) for _ in range(3)]
        for client in first:
            await client.connect()
        await asyncio.sleep(0.2)
        extra = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            extra.append(await asyncio.wait_for(reader.read(10), 5))
            writer.close()
        for i, client in enumerate(first):  # the first three are served
            await client.negotiate(UPDATE_STARTD_AD)
            client.send_ad(_slot(f"slot{i}@crowd"))
            assert client.channel is not None
            await client.channel.drain()
        await asyncio.sleep(0.3)
        for client in first:
            client.close()
        return extra, 0

    with Endpoint(tmp_path, {"POOLLEDGER_COLLECTOR_MAX_CONNECTIONS": "3"}) as ep:
        extra, _ = asyncio.run(crowd(ep.port))
        assert extra == [b"", b""]
        assert wait_for(lambda: ep.backend.count("Machine") == 3)
        lines = ep.refusals()
        assert len(lines) == 2 and all("over POOLLEDGER_COLLECTOR_MAX_CONNECTIONS" in x for x in lines)


def test_a_refused_connection_does_not_disturb_a_concurrent_one(tmp_path: Path) -> None:
    with Endpoint(tmp_path) as ep:
        stop = threading.Event()

        def pester() -> None:
            while not stop.is_set():
                raw_bytes(ep.port, b"\xff" * 64)

        thread = threading.Thread(target=pester)
        thread.start()
        try:
            assert advertise_ok(ep.port, tmp_path)["names"] == ["slot1@ok.example"]
        finally:
            stop.set()
            thread.join()
        assert ep.refusals() and all("garbage" in x for x in ep.refusals())


def test_a_session_does_not_carry_a_level_with_a_stricter_policy(tmp_path: Path) -> None:
    """READ may go unencrypted here; a session negotiated for a query must not then carry an
    update, whose level requires encryption."""
    async def attack(port: int) -> bool:
        client = RawClient(port)
        channel = await client.connect()
        ad = classad2.ClassAd({"Command": 5, "NewSession": "YES", "Enact": "NO",
                               "Authentication": "NEVER", "Encryption": "NEVER", "Integrity": "NEVER"})
        channel.send(Writer(False).integer(60010).ad(ad).payload())
        await channel.drain()
        await channel.receive()  # the reconciled policy
        await channel.receive()  # the post-auth ad (no key: plaintext)
        channel.send(Writer(False).ad(classad2.ClassAd({"MyType": "Query"})).payload())
        reply = await channel.receive()  # the query's answer: 0, no ads
        assert reply == Writer(False).integer(0).payload()
        channel.send(Writer(False).integer(UPDATE_STARTD_AD).ad(_slot("slot1@sneaky")).payload())
        await channel.drain()
        closed = await client.closed_by_server()
        client.close()
        return closed

    with Endpoint(tmp_path, {"SEC_READ_ENCRYPTION": "OPTIONAL", "SEC_READ_INTEGRITY": "OPTIONAL"}) as ep:
        assert asyncio.run(attack(ep.port))
        _one_refusal(ep, "negotiated under another policy than ADVERTISE_STARTD's")
        _still_serves(ep, tmp_path)


def test_message_over_the_maximum_size(tmp_path: Path) -> None:
    with Endpoint(tmp_path, {"POOLLEDGER_COLLECTOR_MAX_MESSAGE_BYTES": "2048"}) as ep:
        packet = b"\x00" + struct.pack(">I", 1000) + b"x" * 1000  # never the last packet
        raw_bytes(ep.port, packet * 3)
        _one_refusal(ep, "a message over 2048 bytes")
        _still_serves(ep, tmp_path)
