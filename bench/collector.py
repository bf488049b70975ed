"""The collector endpoint: ad updates per second from the real htcondor2 client with AES on,
and a query returning 200,000 slot ads, against baselines measured in the same run.

    python bench/collector.py [--updates 20000] [--slots 200000]

The endpoint is `poolledger collector`'s: the CEDAR server (services.collector.server) in
front of the ledger backend (services.collector.backend) on a fresh embedded log, in a thread
of this process, with the default security (ECDH + AES-256-GCM required, authentication
optional). The real client runs in subprocesses (it holds the GIL while it talks).

  (a) wire baseline: the client advertises `--updates` distinct slot ads (~55 attributes, as
      the simulated startd publishes) to the same server in front of a backend that drops
      them: the client's encoding, CEDAR and AES alone;
  (b) updates: the same ads into the ledger backend, timed until the last one is appended to
      the log and folded (`updates_per_s`, target >= 3,000/s: a 200,000-slot pool sends ~700/s
      at a five-minute UPDATE_INTERVAL);
  (c) heartbeats: the same ads again with only volatile attributes changed (LoadAvg,
      MyCurrentTime, UpdateSequenceNumber), which the backend does not log;
  (d) the pool is filled to `--slots` slot ads through the backend in process (no wire), then
      the client queries every slot ad with condor_status's default projection
      (`query_200k_seconds`, target <= 3 s) and whole (`query_200k_full_seconds`); the
      backend's own answer, without the wire, is the baseline (`query_backend_seconds`;
      the first query renders every ad for the wire: `query_backend_first_seconds`).
The last line is key=value pairs for scripts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import classad2

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from schemas.settings import load_settings  # noqa: E402
from services.collector.backend import LedgerCollector  # noqa: E402
from services.collector.port import Peer  # noqa: E402
from services.collector.server import CollectorServer  # noqa: E402
from streams.log.embedded import EmbeddedLog  # noqa: E402
from streams.log.topics import ensure_topics  # noqa: E402

T0 = 1763800000
#: condor_status's default slot projection
STATUS_PROJECTION = ["Name", "OpSys", "Arch", "State", "Activity", "LoadAvg", "Memory",
                     "EnteredCurrentActivity", "MyCurrentTime", "Machine", "SlotType"]

#: builds slot `i`'s ad (in the bench and in the client processes)
SLOT_CODE = '''
def slot_ad(i, load=0.0, seq=1):
    host = f"ep{i // 8}.example.org"
    ad = classad2.ClassAd({
        "MyType": "Machine", "TargetType": "Job", "Name": f"slot{i % 8 + 1}@{host}",
        "Machine": host, "SlotID": i % 8 + 1, "SlotType": "Static", "SlotTypeID": 1,
        "State": ("Unclaimed", "Claimed", "Owner")[i % 3], "Activity": "Idle",
        "EnteredCurrentState": 1763800000, "EnteredCurrentActivity": 1763800000,
        "OpSys": "LINUX", "Arch": "X86_64", "OpSysAndVer": "AlmaLinux9", "UidDomain": "example.org",
        "FileSystemDomain": "example.org", "HasFileTransfer": True,
        "StartdIpAddr": f"<10.0.{i // 2000}.{i % 250}:9618>", "MyAddress": f"<10.0.{i // 2000}.{i % 250}:9618>",
        "DaemonStartTime": 1763800000, "MyCurrentTime": 1763800000 + seq,
        "UpdateSequenceNumber": seq, "Cpus": 1 + i % 8, "TotalSlotCpus": 8, "TotalCpus": 64,
        "DetectedCpus": 64, "Memory": 4096 * (1 + i % 4), "TotalMemory": 262144,
        "DetectedMemory": 262144, "Disk": 100000000, "TotalDisk": 800000000,
        "VirtualMemory": 33554432, "KeyboardIdle": 1200 + seq, "ConsoleIdle": 1200 + seq,
        "CondorLoadAvg": load, "LoadAvg": load, "TotalLoadAvg": load * 8, "ClockMin": 506,
        "ClockDay": 6, "CurrentRank": 0.0, "SlotWeight": float(1 + i % 8), "Mips": 30000,
        "KFlops": 2000000, "HasDocker": i % 2 == 0, "HasSingularity": True,
        "CondorVersion": "$CondorVersion: 25.0.1 2025-11-20 $", "IsWakeAble": False,
        "TotalJobRuntime": 0, "NumPids": 0, "JobStarts": i % 17, "RecentJobStarts": 0,
        "TotalTimeUnclaimedIdle": seq * 300, "ExpectedMachineGracefulDrainingBadput": 0,
        "ExpectedMachineGracefulDrainingCompletion": 1763800000 + seq,
    })
    ad["Start"] = classad2.ExprTree("TARGET.RequestMemory <= MY.Memory && KeyboardIdle > 15 * 60")
    ad["Rank"] = classad2.ExprTree("0")
    ad["Requirements"] = classad2.ExprTree("START")
    ad["MachineMaxVacateTime"] = classad2.ExprTree("10 * 60")
    return ad
'''

CLIENT = '''
import json, sys, time
import htcondor2, classad2
PORT, MODE, COUNT = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
c = htcondor2.Collector(f"127.0.0.1:{PORT}")
''' + SLOT_CODE + '''
if MODE in ("update", "heartbeat"):
    seq = 1 if MODE == "update" else 2
    ads = [slot_ad(i, load=0.5 * seq, seq=seq) for i in range(COUNT)]
    c.query(htcondor2.AdType.Collector)  # the security session, made before the clock starts
    start = time.time()
    for k in range(0, COUNT, 1000):
        c.advertise(ads[k:k + 1000], "UPDATE_STARTD_AD")
    print(json.dumps({"start": start, "sent": time.time()}), flush=True)
else:
    c.query(htcondor2.AdType.Collector)
    start = time.time()
    found = c.query(htcondor2.AdType.Startd,
                    projection=json.loads(sys.argv[4]) if MODE == "projected" else [])
    print(json.dumps({"seconds": time.time() - start, "ads": len(found),
                      "attrs": len(found[0]) if found else 0}), flush=True)
'''

namespace: dict[str, Any] = {"classad2": classad2}
exec(SLOT_CODE, namespace)  # noqa: S102 - the one slot generator the client processes use too
slot_ad = namespace["slot_ad"]
PEER = Peer("127.0.0.1", 0, "tcp", None, None, True)


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class DropBackend:
    """The wire baseline's backend: counts what arrives, keeps nothing."""

    def __init__(self) -> None:
        self.commands = 0

    def update(self, ad_type: str, ad: Any, private: Any, peer: Peer) -> None:
        self.commands += 1

    def invalidate(self, ad_type: str, query: Any, peer: Peer) -> None:
        self.commands += 1

    def query(self, ad_type: Any, query: Any, peer: Peer) -> list[Any]:
        return []

    def priorities(self, peer: Peer) -> Any:
        return classad2.ClassAd()


class Served:
    """A CollectorServer over `backend` in a thread with its own event loop."""

    def __init__(self, backend: Any, settings: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = CollectorServer(settings, backend, host="127.0.0.1", port=0)
        self.loop.run_until_complete(self.server.start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.run_until_complete(self.server.close())
        self.loop.close()


def client(port: int, mode: str, count: int, tmp: Path, *extra: str) -> dict[str, Any]:
    config = tmp / "client_config"
    config.write_text("")
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(port), mode, str(count), *extra],
                          capture_output=True, text=True, timeout=3600, cwd=str(tmp),
                          env={**os.environ, "CONDOR_CONFIG": str(config)})
    if proc.returncode != 0:
        raise SystemExit(f"bench/collector.py: the client failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def advertise_rate(backend: Any, port: int, mode: str, count: int, tmp: Path,
                   done: Any) -> float:
    """Updates per second: from the client's first send until `done()` (all handled)."""
    before = backend.commands
    got = client(port, mode, count, tmp)
    while backend.commands < before + count:
        time.sleep(0.001)
    done()
    return count / (time.time() - got["start"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=20000)
    parser.add_argument("--slots", type=int, default=200000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_collector_"))
    settings = load_settings(config_path=[], env={}, overrides={})

    drop = DropBackend()
    served = Served(drop, settings)
    progress(f"(a) wire baseline: {args.updates} updates into a backend that drops them")
    wire = advertise_rate(drop, served.server.port, "update", args.updates, tmp, lambda: None)
    served.close()

    log = EmbeddedLog(tmp / "log")
    ensure_topics(log)
    backend = LedgerCollector(log, settings, name="collector@bench")
    backend.start()  # the flusher, as `poolledger collector` runs it
    served = Served(backend, settings)
    port = served.server.port
    progress(f"(b) {args.updates} updates into the ledger backend")
    updates = advertise_rate(backend, port, "update", args.updates, tmp, backend.flush)
    appended = backend.appended
    progress(f"(c) {args.updates} heartbeats")
    beats = advertise_rate(backend, port, "heartbeat", args.updates, tmp, backend.flush)
    heartbeat_events = backend.appended - appended

    progress(f"(d) filling the pool to {args.slots} slot ads in process")
    start = time.perf_counter()
    for i in range(args.updates, args.slots):
        backend.update("Machine", slot_ad(i), None, PEER)
    backend.flush()
    fill = (args.slots - args.updates) / (time.perf_counter() - start)
    status = classad2.ClassAd({"Projection": " ".join(STATUS_PROJECTION)})
    start = time.perf_counter()
    own = backend.query("Machine", status, PEER)  # renders every ad for the wire, once
    first_seconds = time.perf_counter() - start
    assert len(own) == args.slots, len(own)
    start = time.perf_counter()
    own = backend.query("Machine", status, PEER)
    own_seconds = time.perf_counter() - start
    projected = client(port, "projected", 0, tmp, json.dumps(STATUS_PROJECTION))
    assert projected["ads"] == args.slots, projected
    full = client(port, "full", 0, tmp)
    assert full["ads"] == args.slots, full
    served.close()
    backend.close()
    log.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6

    print(f"wire baseline (client + CEDAR + AES, ads dropped): {wire:,.0f} updates/s")
    print(f"updates into the ledger backend:                   {updates:,.0f} updates/s "
          f"({updates / wire:.2f} of the wire's)")
    print(f"heartbeats (not logged: {heartbeat_events} events for {args.updates}):  "
          f"{beats:,.0f} updates/s")
    print(f"filling in process (no wire):                      {fill:,.0f} updates/s")
    print(f"query of {args.slots} slot ads, condor_status projection: "
          f"{projected['seconds']:.2f} s through the client, {own_seconds:.2f} s in the backend "
          f"({first_seconds:.2f} s the first time: every ad rendered for the wire)")
    print(f"query of {args.slots} whole slot ads ({full['attrs']} attributes): "
          f"{full['seconds']:.2f} s through the client")
    print(f"updates_per_s={updates:.0f} wire_updates_per_s={wire:.0f} "
          f"updates_ratio={updates / wire:.3f} heartbeats_per_s={beats:.0f} "
          f"heartbeat_events={heartbeat_events} fill_updates_per_s={fill:.0f} "
          f"query_200k_seconds={projected['seconds']:.3f} "
          f"query_200k_full_seconds={full['seconds']:.3f} query_backend_seconds={own_seconds:.3f} "
          f"query_backend_first_seconds={first_seconds:.3f} "
          f"peak_rss_gb={rss:.2f}")


if __name__ == "__main__":
    main()
