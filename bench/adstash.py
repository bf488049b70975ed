"""adstash throughput: job.history events -> convert -> sink runner -> a real Elasticsearch,
against the same documents sent by plain `elasticsearch.helpers.bulk` in the same run.

    python bench/adstash.py [--ads 20000] [--repeat 2] [--bunch N]

Elasticsearch is `ES_URL` if set, else a node started here with compose.search.SearchServer
(single node, loopback, 512 MB heap). The ads are shaped like the simulated schedd's history
ads (about 80 attributes, `Requirements` an expression, as in real pools' history), each with
its own job id, owner, slot and times.

Paths, measured in this run:
  (a) convert alone: `adstash.convert.to_doc` over the ads (decoded events, no I/O);
  (b) raw bulk (the baseline): the documents (a) made, with their ids, sent by
      `elasticsearch.helpers.bulk` (`chunk_size` = the bunch size) into a fresh index created
      with adstash's mappings;
  (c) sink: the same ads as `job.history` events of an embedded log, `SinkRunner.run_once`
      with `AdstashTarget` (read + decode + convert + bulk + checkpoint) into another fresh
      index with the same mappings.
Each path runs `--repeat` times on fresh indices (raw and sink alternating); the best run of
each is reported (the machine is shared, the best is the least disturbed). Counts are
checked after each run. Target (issue 12): (c) >= 0.7 x (b) and >= 5,000 ads/s.
The last line is key=value pairs for scripts.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# this file's own directory comes first on the path, and its name would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from adstash.convert import doc_id, to_doc  # noqa: E402
from adstash.interfaces import SearchEngineOptions, index_body  # noqa: E402
from adstash.target import AdstashTarget, adstash_metadata  # noqa: E402
from schemas.events import Envelope, JobHistory, make_event  # noqa: E402
from streams.log.embedded import EmbeddedLog  # noqa: E402
from streams.log.events import EventLog, ensure_topics  # noqa: E402
from streams.log.topics import EVENTS  # noqa: E402
from streams.sink import SinkRunner  # noqa: E402

T0 = 1_763_800_000
REQUIREMENTS = ('/Expr((TARGET.Arch == "X86_64") && (TARGET.OpSys == "LINUX") && '
                '(TARGET.Disk >= RequestDisk) && (TARGET.Memory >= RequestMemory) && '
                '(TARGET.Cpus >= RequestCpus) && (TARGET.HasFileTransfer))/')


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def history_ad(k: int) -> dict[str, Any]:
    """One completed job's history ad, shaped like services/pool/schedd.py's."""
    owner = f"user{k % 97}"
    schedd = f"ap{k % 4 + 1}.example.org"
    q = T0 + k // 10
    start = q + 60 + k % 300
    end = start + 600 + (k * 7919) % 36_000
    slot = f"slot1_{k % 32 + 1}@ep{k % 500 + 1}.example.org"
    return {
        "MyType": "Job", "TargetType": "Machine", "ClusterId": k // 10, "ProcId": k % 10,
        "GlobalJobId": f"{schedd}#{k // 10}.{k % 10}#{q}", "Owner": owner,
        "User": f"{owner}@example.org", "JobUniverse": 5, "Cmd": "/home/sim/run.sh",
        "Args": f"--seed {k}", "Iwd": f"/home/{owner}", "In": "/dev/null",
        "Out": f"/home/{owner}/job.{k}.out", "Err": f"/home/{owner}/job.{k}.err", "QDate": q,
        "EnteredCurrentStatus": end, "JobStatus": 4, "LastJobStatus": 2, "JobPrio": k % 10,
        "RequestCpus": 1 + k % 4, "RequestMemory": 2048 * (1 + k % 4), "RequestDisk": 1024,
        "Requirements": REQUIREMENTS, "Rank": 0.0, "KillSig": "SIGTERM", "NiceUser": False,
        "NumJobStarts": 1, "JobRunCount": 1, "NumShadowStarts": 1, "NumJobMatches": 1,
        "NumRestarts": 0, "NumSystemHolds": 0, "NumHolds": 0,
        "RemoteWallClockTime": float(end - start), "CumulativeSuspensionTime": 0,
        "CumulativeSlotTime": float(end - start), "CommittedTime": end - start,
        "CommittedSlotTime": float(end - start), "CommittedSuspensionTime": 0,
        "TotalSuspensions": 0, "ExitBySignal": False, "MinHosts": 1, "MaxHosts": 1,
        "CurrentHosts": 0, "CoreSize": 0, "ImageSize": 1000 + k % 5000,
        "DiskUsage": 1000 + k % 777, "ExecutableSize": 1000, "ShouldTransferFiles": "IF_NEEDED",
        "WhenToTransferOutput": "ON_EXIT", "OnExitRemove": True, "OnExitHold": False,
        "PeriodicHold": False, "PeriodicRelease": False, "PeriodicRemove": False,
        "LeaveJobInQueue": False, "JobNotification": 0, "TransferIn": False,
        "WantCheckpoint": False, "MyJobSubmitHost": f"<{schedd}:9618>",
        "AccountingGroup": f"group_physics.{owner}", "ConcurrencyLimits": "fileserver",
        "JobLeaseDuration": 2400, "LastMatchTime": start, "JobStartDate": start,
        "JobCurrentStartDate": start, "JobCurrentStartExecutingDate": start,
        "RemoteHost": slot, "StartdPrincipal": f"execute-side@matchsession/{slot.split('@')[1]}",
        "Cpus": 1 + k % 4, "CpusProvisioned": 1 + k % 4, "Memory": 2048 * (1 + k % 4),
        "MemoryProvisioned": 2048 * (1 + k % 4), "Disk": 1024, "DiskProvisioned": 1024,
        "MachineAttrSlotWeight0": float(1 + k % 4), "LastRemoteHost": slot,
        "CompletionDate": end, "ExitCode": 0, "ExitStatus": 0, "JobDuration": float(end - start),
    }


def events(n: int) -> list[Envelope]:
    return [make_event(JobHistory(history_ad(k)), ts=float(T0 + k), source="schedd@bench",
                       seq=k) for k in range(n)]


def convert(evs: list[Envelope], metadata: dict[str, Any]) -> tuple[float, list[Any]]:
    t = time.perf_counter()
    docs = []
    for env in evs:
        assert isinstance(env.data, JobHistory)
        doc = to_doc(env.data.ad, fallback_time=env.ts, metadata=metadata)
        assert doc is not None
        docs.append((doc_id(doc), doc))
    return time.perf_counter() - t, docs


def fresh_index(client: Any, name: str) -> str:
    """A new index with adstash's mappings behind its write alias; returns the alias."""
    body = index_body()
    client.indices.create(index=f"{name}-000001", aliases={name: {"is_write_index": True}},
                          settings=body["settings"], mappings=body["mappings"])
    return name


def count(client: Any, alias: str) -> int:
    client.indices.refresh(index=alias)
    return int(client.count(index=alias)["count"])


def raw_bulk(client: Any, docs: list[Any], bunch: int, tag: str) -> float:
    from elasticsearch import helpers

    alias = fresh_index(client, f"bench-raw-{tag}")
    t = time.perf_counter()
    ok, errors = helpers.bulk(client, ({"_index": alias, "_id": i, "_source": d}
                                       for i, d in docs), chunk_size=bunch)
    dt = time.perf_counter() - t
    if errors or count(client, alias) != len(docs):
        raise SystemExit(f"raw bulk indexed {count(client, alias)} of {len(docs)}: {errors!r}")
    client.indices.delete(index=f"{alias}-000001")
    return dt


def sink(url: str, log: EmbeddedLog, n: int, bunch: int, tag: str, client: Any) -> float:
    name = f"bench-sink-{tag}"
    opts = SearchEngineOptions(host=url, index_name=f"{name}-000001", bunch_size=bunch)
    runner = SinkRunner(log, AdstashTarget.from_options("elasticsearch", opts, name=name),
                        progress=False)
    t = time.perf_counter()
    report = runner.run_once()
    dt = time.perf_counter() - t
    runner.close()
    got = count(client, opts.alias)
    if (report.delivered, report.rejected, got) != (n, 0, n):
        raise SystemExit(f"sink: {report} and {got} documents, expected {n}")
    client.indices.delete(index=opts.index)
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ads", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--bunch", type=int, default=None,
                    help="documents per bulk request for both paths (default: the "
                         "ADSTASH_SE_BUNCH_SIZE knob's default)")
    args = ap.parse_args()
    from elasticsearch import Elasticsearch

    from schemas.settings import load_settings

    bunch = args.bunch or int(load_settings().get("ADSTASH_SE_BUNCH_SIZE"))
    server = None
    url = os.environ.get("ES_URL")
    if not url:
        from compose.search import SearchServer

        progress("starting Elasticsearch (compose.search.SearchServer)")
        server = SearchServer("elasticsearch")
        url = server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-adstash-") as tmp:
            progress(f"{args.ads:,} history ads -> embedded log")
            evs = events(args.ads)
            log = EmbeddedLog(Path(tmp) / "log")
            ensure_topics(log)
            EventLog(log).append(EVENTS, evs)
            meta = adstash_metadata("bench")
            conv_s, docs = min((convert(evs, meta) for _ in range(args.repeat)),
                               key=lambda r: r[0])
            client = Elasticsearch(url, request_timeout=120)
            raw_s: list[float] = []
            sink_s: list[float] = []
            for r in range(args.repeat):
                tag = f"{os.getpid()}-{r}"
                raw_s.append(raw_bulk(client, docs, bunch, tag))
                progress(f"raw bulk run {r + 1}: {raw_s[-1]:.2f} s")
                sink_s.append(sink(url, log, args.ads, bunch, tag, client))
                progress(f"sink run {r + 1}: {sink_s[-1]:.2f} s")
            client.close()
            log.close()
    finally:
        if server is not None:
            server.stop()
    n = args.ads
    conv, raw, snk = n / conv_s, n / min(raw_s), n / min(sink_s)
    ratio = snk / raw
    print(f"Elasticsearch {url}; {n:,} ads, bulk requests of {bunch}, best of {args.repeat}")
    print(f"  convert alone (to_doc)          {conv:12,.0f} ads/s")
    print(f"  raw helpers.bulk (baseline)     {raw:12,.0f} docs/s   runs {_runs(raw_s)}")
    print(f"  sink (log->convert->bulk->ack)  {snk:12,.0f} ads/s    runs {_runs(sink_s)}")
    print(f"  ratio sink/raw {ratio:.2f}  (target >= 0.7 and sink >= 5,000 ads/s: "
          f"{'met' if ratio >= 0.7 and snk >= 5000 else 'NOT met'})")
    print(f"sink_ads_per_s={snk:.0f} raw_bulk_docs_per_s={raw:.0f} ratio={ratio:.3f} "
          f"convert_ads_per_s={conv:.0f}")
    return 0


def _runs(seconds: list[float]) -> str:
    return " ".join(f"{s:.2f}s" for s in seconds)


if __name__ == "__main__":
    sys.exit(main())
