"""Shared pieces of the CEDAR endpoint tests: an in-memory backend, the server in a thread,
the real htcondor2 client in a subprocess (its own condor_config and session cache), and a
raw CEDAR client for inputs the real client never sends."""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import classad2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from schemas.settings import load_settings
from services.collector.cedar import Channel, Reader, Writer
from services.collector.port import Peer
from services.collector.server import CollectorServer

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


class MemoryBackend:
    """The smallest CollectorBackend: ads by (type, Name), queries by constraint/projection."""

    def __init__(self) -> None:
        self.ads: dict[tuple[str, str], classad2.ClassAd] = {}
        self.private: dict[tuple[str, str], classad2.ClassAd] = {}
        self.peers: list[Peer] = []
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def update(self, ad_type: str, ad: classad2.ClassAd, private: classad2.ClassAd | None,
               peer: Peer) -> None:
        with self.lock:
            key = (ad_type, str(ad.get("Name")))
            self.ads[key] = ad
            if private is not None:
                self.private[key] = private
            self.peers.append(peer)
            self.calls.append(f"update {ad_type} {key[1]}")

    def invalidate(self, ad_type: str, query: classad2.ClassAd, peer: Peer) -> None:
        with self.lock:
            self.calls.append(f"invalidate {ad_type}")
            for key in [k for k in self.ads if k[0] == ad_type]:
                if query.get("Name") in (None, key[1]) and _matches(query, self.ads[key]):
                    del self.ads[key]

    def query(self, ad_type: str | None, query: classad2.ClassAd, peer: Peer) -> Iterable[classad2.ClassAd]:
        with self.lock:
            self.calls.append(f"query {ad_type}")
            self.peers.append(peer)
            types = [ad_type] if ad_type else str(query.get("TargetType", "")).split(",")
            projection = [p for p in str(query.get("Projection", "")).replace(",", " ").split() if p]
            out = []
            for (t, _), ad in self.ads.items():
                if t not in types or not _matches(query, ad):
                    continue
                if projection:
                    ad = classad2.ClassAd({k: ad[k] for k in projection if k in ad})
                out.append(ad)
            limit = query.get("LimitResults")
            return out[:int(limit)] if isinstance(limit, int) and limit > 0 else out

    def priorities(self, peer: Peer) -> classad2.ClassAd:
        with self.lock:
            self.calls.append("priorities")
            ad = classad2.ClassAd()
            ad["NumSubmittors"] = 2
            for i, (name, prio) in enumerate((("alice@pool", 0.5), ("bob@pool", 12.25)), 1):
                ad[f"Name{i}"] = name
                ad[f"Priority{i}"] = prio
                ad[f"PriorityFactor{i}"] = 1000.0
                ad[f"ResourcesUsed{i}"] = i
                ad[f"WeightedResourcesUsed{i}"] = float(i)
                ad[f"AccumulatedUsage{i}"] = 3600.0 * i
                ad[f"WeightedAccumulatedUsage{i}"] = 3600.0 * i
                ad[f"BeginUsageTime{i}"] = 1_700_000_000
                ad[f"LastUsageTime{i}"] = 1_700_003_600
                ad[f"IsAccountingGroup{i}"] = False
                ad[f"AccountingGroup{i}"] = name
            ad["LastUpdate"] = 1_700_003_600
            return ad

    def count(self, ad_type: str) -> int:
        with self.lock:
            return sum(1 for t, _ in self.ads if t == ad_type)


def _matches(query: classad2.ClassAd, ad: classad2.ClassAd) -> bool:
    req = query.get("Requirements", True)
    if req is True:
        return True
    try:
        return bool(classad2.ExprTree(str(req)).eval(ad)) is True
    except Exception:  # noqa: BLE001 - a constraint that does not evaluate selects nothing
        return False


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Endpoint:
    """The collector endpoint in a thread with its own event loop, configured by a
    condor_config file (security knobs come from configuration files)."""

    def __init__(self, tmp: Path, config: dict[str, str] | None = None, port: int = 0,
                 backend: MemoryBackend | None = None) -> None:
        self.tmp = tmp
        self.config = {"POOLLEDGER_COLLECTOR_TIMEOUT": "5", **(config or {})}
        self.backend = backend or MemoryBackend()
        self.port = port
        self.capture = _Capture()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.server: CollectorServer | None = None

    @property
    def lines(self) -> list[str]:
        return self.capture.lines

    def refusals(self) -> list[str]:
        return [line for line in self.capture.lines if line.startswith("refused")]

    def start(self) -> Endpoint:
        path = self.tmp / "endpoint_config"
        path.write_text("".join(f"{k} = {v}\n" for k, v in self.config.items()))
        settings = load_settings(path, env={})
        logger = logging.getLogger("poolledger.collector")
        logger.addHandler(self.capture)
        logger.setLevel(logging.INFO)
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self.server = CollectorServer(settings, self.backend, host="127.0.0.1", port=self.port)
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                failure.append(exc)
                ready.set()
                return
            self.port = self.server.port
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.server.close())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        logging.getLogger("poolledger.collector").removeHandler(self.capture)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the real client ------------------------------------------------------------------------

CLIENT_PRELUDE = """
import json, os, sys, time
import htcondor2, classad2
PORT = int(sys.argv[1])
ADDR = f"127.0.0.1:{PORT}"
def out(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
def settle(c, n, ad_type=htcondor2.AdType.Startd):
    # advertise has no acknowledgement: wait until the endpoint has folded n ads
    deadline = time.monotonic() + 10
    while len(c.query(ad_type, projection=["Name"])) < n and time.monotonic() < deadline:
        time.sleep(0.05)
def slot(name, **attrs):
    ad = classad2.ClassAd({"MyType": "Machine", "Name": name, "Machine": name.split("@")[-1],
                           "Cpus": 4, "Memory": 8192, "State": "Unclaimed", **attrs})
    return ad
"""


def run_client(port: int, code: str, tmp: Path, config: dict[str, str] | None = None,
               timeout: float = 60, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `code` with the real htcondor2 client in a fresh process; its RESULT line as a dict
    (plus `rc` and `output`)."""
    cfg = tmp / f"client_config_{time.monotonic_ns()}"
    cfg.write_text("".join(f"{k} = {v}\n" for k, v in (config or {}).items()))
    script = CLIENT_PRELUDE + textwrap.dedent(code)
    proc = subprocess.run([PYTHON, "-c", script, str(port)], capture_output=True, text=True,
                          timeout=timeout, cwd=str(tmp),
                          env={**os.environ, "CONDOR_CONFIG": str(cfg), **(env or {})})
    result: dict[str, Any] = {"rc": proc.returncode, "output": proc.stdout + proc.stderr}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result.update(json.loads(line[len("RESULT "):]))
    return result


def advertise_ok(port: int, tmp: Path, name: str = "slot1@ok.example",
                 config: dict[str, str] | None = None) -> dict[str, Any]:
    """One real-client advertise and query: what `another client is still served` means."""
    return run_client(port, f"""
        c = htcondor2.Collector(ADDR)
        c.advertise([slot({name!r})], "UPDATE_STARTD_AD")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            names = [a["Name"] for a in c.query(htcondor2.AdType.Startd, projection=["Name"])]
            if {name!r} in names:
                break
            time.sleep(0.05)
        out(names=names)
    """, tmp, config)


# --- a raw CEDAR client -----------------------------------------------------------------------


class RawClient:
    """A minimal client side of CEDAR for hostile inputs: plain bytes, or a negotiated AES
    session whose later packets the test may corrupt."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.channel: Channel | None = None
        self.sid: str | None = None
        self.key: bytes | None = None
        self.sent: list[bytes] = []

    async def connect(self) -> Channel:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.channel = Channel(reader, writer, 10, 1 << 26)
        return self.channel

    async def negotiate(self, command: int, **extra: Any) -> classad2.ClassAd:
        """DC_AUTHENTICATE for `command` with ECDH, no authentication; the post-auth ad."""
        channel = self.channel or await self.connect()
        private = ec.generate_private_key(ec.SECP256R1())
        pub = private.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
        ad = classad2.ClassAd({
            "Command": command, "NewSession": "YES", "Enact": "NO", "Authentication": "OPTIONAL",
            "AuthenticationNew": "OPTIONAL", "Encryption": "REQUIRED", "Integrity": "REQUIRED",
            "AuthMethods": "FS", "CryptoMethods": "AES", "SessionDuration": "60", "SessionLease": 3600,
            "ECDHPublicKey": base64.b64encode(pub).decode(),
            "RemoteVersion": "$CondorVersion: 25.14.1 2026-09-24 BuildID: test $", **extra})
        channel.send(Writer(False).integer(60010).ad(ad).payload())
        await channel.drain()
        reply, _ = Reader(await channel.receive(), False).ad(1000)
        peer = ec.EllipticCurvePublicKey.from_encoded_point(
            ec.SECP256R1(), base64.b64decode(str(reply["ECDHPublicKey"])))
        self.key = HKDF(hashes.SHA256(), 32, salt=b"htcondor", info=b"keygen").derive(
            private.exchange(ec.ECDH(), peer))
        channel.enable_crypto(self.key)
        post, _ = Reader(await channel.receive(), True).ad(1000)
        self.sid = str(post["Sid"])
        return post

    async def resume(self, command: int, sid: str, key: bytes | None) -> classad2.ClassAd:
        channel = self.channel or await self.connect()
        ad = classad2.ClassAd({"Command": command, "UseSession": "YES", "Sid": sid,
                               "ResumeResponse": True, "Nonce": "bm9uY2U=",
                               "RemoteVersion": "$CondorVersion: 25.14.1 2026-09-24 BuildID: test $"})
        channel.send(Writer(False).integer(60010).ad(ad).payload())
        await channel.drain()
        reply, _ = Reader(await channel.receive(), False).ad(1000)
        if key is not None and reply.get("ReturnCode") == "AUTHORIZED":
            channel.enable_crypto(key)
        return reply

    def send_ad(self, ad: classad2.ClassAd, command: int | None = None) -> bytes:
        """Send one message (optionally `[command]` first); returns the bytes put on the wire."""
        assert self.channel is not None
        writer = Writer(self.channel.encrypted)
        if command is not None:
            writer.integer(command)
        writer.ad(ad)
        transport = self.channel.writer
        before = len(self.sent)
        original = transport.write

        def record(data: bytes | bytearray | memoryview) -> None:
            self.sent.append(bytes(data))
            original(data)
        transport.write = record  # type: ignore[method-assign,assignment]
        try:
            self.channel.send(writer.payload())
        finally:
            transport.write = original  # type: ignore[method-assign]
        return b"".join(self.sent[before:])

    async def closed_by_server(self, wait: float = 10) -> bool:
        """Whether the server closes the connection (EOF) within `wait` seconds."""
        assert self.channel is not None
        try:
            data = await asyncio.wait_for(self.channel.reader.read(1 << 20), wait)
        except (asyncio.TimeoutError, ConnectionError):
            return False
        while data:
            try:
                data = await asyncio.wait_for(self.channel.reader.read(1 << 20), wait)
            except (asyncio.TimeoutError, ConnectionError):
                return True
        return True

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


def raw_bytes(port: int, data: bytes, wait: float = 10) -> bytes:
    """Send bytes on a fresh TCP connection and close our side; what came back before the
    server closed it."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (socket.timeout, ConnectionError):
            pass
        return b"".join(chunks)


def wait_for(predicate: Any, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
