"""The sink targets the contract suite runs on (test_sink_target.py), each over its real store.

A `Subject` opens targets over ONE store (a restart opens the same store again), says what the
store holds (`stored`) and what it should hold after events were delivered once (`expected`),
gives a hostile event (one the target refuses, or one it must store all the same) and a target
whose service is down (a closed port, an unwritable directory; None: an embedded store with no service).
"""
from __future__ import annotations

import io
import itertools
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from adstash.interfaces import SearchEngineOptions
from adstash.target import AdstashTarget, CheckpointFile
from compose.kafka import free_port
from schemas.events import AdUpdated, Envelope, JobHistory, make_event
from streams.log.topics import EVENTS
from streams.sink import Target

T0 = 1_763_800_020.0
_runs = itertools.count()


@dataclass
class Subject:
    """One target kind over one store."""

    kind: str
    make: Callable[[], Target]
    stored: Callable[[], Counter[str]]
    expected: Callable[[list[Envelope]], Counter[str]]
    events: Callable[[int, int], list[Envelope]]
    #: a hostile event: one the target refuses (`refuses`), else one it must still store
    hostile: Envelope | None
    refuses: bool
    down: Callable[[], Target] | None
    #: targets opened by `make`/`down`, closed by the fixture if a test did not
    opened: list[Target]


def job_history(lo: int, hi: int) -> list[Envelope]:
    """Completed jobs lo..hi-1, one `job.history` event each (GlobalJobId unique per event)."""
    return [make_event(JobHistory({"GlobalJobId": f"ap1.example.org#{k}.0#{int(T0)}",
                                   "ClusterId": k, "ProcId": 0, "Owner": f"u{k % 3}",
                                   "JobStatus": 4, "QDate": int(T0) - 600,
                                   "CompletionDate": int(T0) + k, "RequestMemory": 1024}),
                       ts=T0 + k, source="schedd@ap1.example.org", seq=k + 1)
            for k in range(lo, hi)]


def _by_job(envs: list[Envelope]) -> Counter[str]:
    return Counter(str(e.data.ad["GlobalJobId"]) for e in envs
                   if isinstance(e.data, JobHistory) and "GlobalJobId" in e.data.ad)


def _tracked(opened: list[Target], make: Callable[[], Target]) -> Callable[[], Target]:
    def build() -> Target:
        target = make()
        opened.append(target)
        return target
    return build


# --------------------------------------------------------------------------- adstash


def search_engine(kind: str, url: str) -> Subject:
    """adstash into a real Elasticsearch or OpenSearch, a fresh index per subject."""
    index = f"contract-{time.time_ns()}-{next(_runs)}-000001"
    opts = SearchEngineOptions(host=url, index_name=index, bunch_size=7)
    dead = SearchEngineOptions(host=f"127.0.0.1:{free_port()}", index_name=index, timeout=5)
    if kind == "elasticsearch":
        from elasticsearch import Elasticsearch

        client: Any = Elasticsearch(url)
    else:
        from opensearchpy import OpenSearch

        client = OpenSearch([url])

    def stored() -> Counter[str]:
        if not client.indices.exists_alias(name=opts.alias):
            return Counter()
        client.indices.refresh(index=opts.alias)
        res = client.search(index=opts.alias, body={"query": {"match_all": {}}, "size": 10_000})
        return Counter(str(h["_source"]["GlobalJobId"]) for h in res["hits"]["hits"])

    # a date the cluster cannot parse, in a field mapped as a date: the cluster's own refusal
    bad = make_event(JobHistory({"GlobalJobId": f"ap1.example.org#999.0#{int(T0)}",
                                 "ClusterId": 999, "ProcId": 0,
                                 "QDate": 9_200_000_000_000_000_000}),
                     ts=T0 + 999, source="schedd@ap1.example.org", seq=1000)
    opened: list[Target] = []
    return Subject(kind, _tracked(opened, lambda: AdstashTarget.from_options(kind, opts)),
                   stored, _by_job, job_history, bad, True,
                   _tracked(opened, lambda: AdstashTarget.from_options(kind, dead)), opened)


def _no_job_id() -> Envelope:
    """A job ad adstash cannot name a document for (no GlobalJobId, ClusterId or ProcId)."""
    return make_event(JobHistory({"Owner": "u9", "JobStatus": 4}), ts=T0 + 998,
                      source="schedd@ap1.example.org", seq=999)


def json_files(root: Path) -> Subject:
    """adstash's json_file interface into a directory."""
    out = root / "adstash-json"
    unwritable = root / "not-a-directory"
    unwritable.write_text("a file where the directory should be\n")

    def stored() -> Counter[str]:
        found: Counter[str] = Counter()
        for path in sorted(out.glob("*.json")):
            found.update(str(d["GlobalJobId"]) for d in orjson.loads(path.read_bytes()).values())
        return found

    opened: list[Target] = []
    return Subject("jsonfile", _tracked(opened, lambda: AdstashTarget.from_options(
        "jsonfile", SearchEngineOptions(log_dir=str(out)))), stored, _by_job, job_history,
        _no_job_id(), True, _tracked(opened, lambda: AdstashTarget.from_options(
            "jsonfile", SearchEngineOptions(log_dir=str(unwritable)))), opened)


def checkpoint_file(root: Path) -> Subject:
    """condor_adstash's --checkpoint_file around the json_file interface: positions its own."""
    inner = json_files(root)
    path = root / "adstash.checkpoint"
    opened: list[Target] = []
    return Subject("checkpoint_file", _tracked(opened, lambda: CheckpointFile(inner.make(), path)),
                   inner.stored, inner.expected, job_history, inner.hostile, inner.refuses,
                   _tracked(opened, lambda: CheckpointFile(
                       inner.down() if inner.down else inner.make(), path)), opened)


# --------------------------------------------------------------------------- DuckDB history


def history_db(root: Path) -> Subject:
    """The DuckDB history database (transactional: positions stored with the rows)."""
    from adstash.history.target import HistoryTarget

    path = root / "history.duckdb"

    def stored() -> Counter[str]:
        import duckdb

        # the process's one instance of the file (DuckDB shares it between connections)
        con = duckdb.connect(str(path))
        try:
            return Counter(str(r[0]) for r in con.execute("SELECT event_id FROM jobs").fetchall())
        finally:
            con.close()

    def expected(envs: list[Envelope]) -> Counter[str]:
        return Counter(e.id for e in envs if isinstance(e.data, JobHistory))

    opened: list[Target] = []
    # an embedded database has no service to be down; it refuses nothing (an ad that does
    # not fit a typed column keeps NULL there and the whole ad in `ad`)
    return Subject("history", _tracked(opened, lambda: HistoryTarget(path, (EVENTS,))),
                   stored, expected, job_history, _no_job_id(), False, None, opened)


# --------------------------------------------------------------------------- metrics


#: whole minutes, an hour ago (+20 s): carbon keeps such points at full (one-minute) resolution
M0 = float(int(time.time() // 60) * 60 - 3600 + 20)


def machine_updates(lo: int, hi: int) -> list[Envelope]:
    """One startd ad per minute k (lo..hi-1): each passes a GANGLIAD_INTERVAL boundary."""
    return [make_event(AdUpdated("Machine", f"slot1@ep{k % 4}.example.org",
                                 {"Name": f"slot1@ep{k % 4}.example.org",
                                  "Machine": f"ep{k % 4}.example.org", "Cpus": 1 + k % 3,
                                  "Memory": 2048, "State": "Unclaimed", "Activity": "Idle",
                                  "MyType": "Machine"}),
                       ts=M0 + 60 * k, source=f"startd@ep{k % 4}.example.org", seq=k + 1)
            for k in range(lo, hi)]


def metrics(carbon: dict[str, Any]) -> Subject:
    """condor_gangliad's metrics sink publishing to a real carbon-cache. What the store holds:
    the points of one series (the pool's Machines in Pool) carbon wrote, by event time; what it
    should hold: one point per evaluation of a direct fold of the same events."""
    import whisper

    from ganglia.gangliad import Gangliad
    from ganglia.graphite import GraphitePublisher
    from ganglia.metrics import GangliadConfig, load_metrics
    from ganglia.publish import HISTORY, Delivery
    from ganglia.sink import MetricsTarget
    from schemas.settings import load_settings

    settings = load_settings(config_path=[], env={})
    defs, problems = load_metrics(None)
    assert not problems, problems
    prefix = f"contract{time.time_ns()}"
    series = Path(carbon["whisper_dir"]) / prefix / "localhost" / "Machines_in_Pool.wsp"

    def daemon() -> Gangliad:
        return Gangliad(defs, GangliadConfig.from_settings(settings), settings)

    def build(port: int) -> Target:
        return MetricsTarget(daemon(), Delivery([(GraphitePublisher("127.0.0.1", port, prefix),
                                                  HISTORY)], err=io.StringIO()))

    def points() -> Counter[str]:
        if not series.exists():
            return Counter()
        (first, _end, step), values = whisper.fetch(str(series), M0 - 120, time.time())
        return Counter(str(first + k * step) for k, v in enumerate(values) if v is not None)

    def stored() -> Counter[str]:
        """carbon writes behind its socket: the points once they stopped changing."""
        last, same, deadline = points(), 0, time.monotonic() + 15
        while same < 4 and time.monotonic() < deadline:
            time.sleep(0.3)
            now = points()
            same = same + 1 if now == last else 0
            last = now
        return last

    def expected(envs: list[Envelope]) -> Counter[str]:
        d = daemon()
        return Counter(str(int(ev.at)) for env in envs for ev in d.feed(env))

    opened: list[Target] = []
    return Subject("metrics", _tracked(opened, lambda: build(int(carbon["port"]))), stored,
                   expected, machine_updates, None, False,
                   _tracked(opened, lambda: build(free_port())), opened)


def closing(subject: Subject) -> Iterator[Subject]:
    """Yield the subject; then close what a test left open (a closed target may raise)."""
    try:
        yield subject
    finally:
        for target in subject.opened:
            try:
                target.close()
            except Exception:  # noqa: BLE001 - closed by the test already
                pass
