"""adstash on real Elasticsearch and OpenSearch: documents, mappings, imports, rejections.

The session fixtures start each engine once (compose/search.py); every test uses its own
index name and consumer group, so tests share the cluster without seeing each other.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from adstash.interfaces import SearchEngineOptions
from adstash.sources import import_history
from adstash.target import AdstashTarget
from schemas.events import JobHistory, make_event
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog, ensure_topics
from streams.log.topics import EVENTS
from streams.sink import SinkReport, SinkRunner, TargetUnavailableError, sink_group

DATA = Path(__file__).parent / "data"
T0 = 1_763_800_000


def client_for(kind: str, url: str) -> Any:
    if kind == "elasticsearch":
        from elasticsearch import Elasticsearch

        return Elasticsearch(url)
    from opensearchpy import OpenSearch

    return OpenSearch([url])


@pytest.fixture(params=[pytest.param("elasticsearch", marks=pytest.mark.elasticsearch),
                        pytest.param("opensearch", marks=pytest.mark.opensearch)])
def engine(request: pytest.FixtureRequest) -> tuple[str, str]:
    fixture = "es_url" if request.param == "elasticsearch" else "opensearch_url"
    return request.param, str(request.getfixturevalue(fixture))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EmbeddedLog]:
    lg = EmbeddedLog(tmp_path / "log")
    ensure_topics(lg)
    yield lg
    lg.close()


def runner_for(kind: str, url: str, log: EmbeddedLog, **kw: Any) -> tuple[SinkRunner, str]:
    index = f"t{time.time_ns()}-000001"
    opts = SearchEngineOptions(host=url, index_name=index, bunch_size=50)
    target = AdstashTarget.from_options(kind, opts, name=f"adstash-{index}")
    return SinkRunner(log, target, progress=False, **kw), opts.alias


def docs(client: Any, alias: str) -> dict[str, dict[str, Any]]:
    client.indices.refresh(index=alias)
    res = client.search(index=alias, body={"query": {"match_all": {}}, "size": 10_000})
    return {h["_id"]: h["_source"] for h in res["hits"]["hits"]}


def history_ads(n: int) -> list[dict[str, Any]]:
    return [{"GlobalJobId": f"ap{k % 3}.example.org#{k}.0#{T0}", "ClusterId": k, "ProcId": 0,
             "Owner": f"u{k % 4}", "JobStatus": 4, "JobUniverse": 5,
             "CompletionDate": T0 + 100 + k, "QDate": T0, "RequestMemory": 1024 + k,
             "RemoteHost": f"slot{k % 2 + 1}@ep{k % 5}.example.org", "WantCheckpoint": False,
             "Requirements": "/Expr(TARGET.Memory >= RequestMemory)/"} for k in range(n)]


def test_history_events_become_exactly_one_document_each(engine: tuple[str, str],
                                                         log: EmbeddedLog) -> None:
    kind, url = engine
    ads = history_ads(120)
    EventLog(log).append(EVENTS, [make_event(JobHistory(ad), ts=T0 + k, source="schedd@ap",
                                             seq=k) for k, ad in enumerate(ads)])
    runner, alias = runner_for(kind, url, log)
    report = runner.run_once()
    assert (report.delivered, report.rejected, report.lag) == (120, 0, 0)
    client = client_for(kind, url)
    got = docs(client, alias)
    assert set(got) == {f"{a['GlobalJobId']}#{a['CompletionDate']}" for a in ads}
    d = got[f"ap1.example.org#1.0#{T0}#{T0 + 101}"]
    assert (d["RecordTime"], d["ScheddName"], d["StartdSlot"], d["StartdName"]) == (
        T0 + 101, "ap1.example.org", "slot2", "ep1.example.org")
    assert d["Status"] == "Completed" and d["Universe"] == "Vanilla"
    assert d["Requirements_EXPR"] == "TARGET.Memory >= RequestMemory"
    mapping = client.indices.get_mapping(index=alias)
    props = next(iter(dict(mapping).values()))["mappings"]["properties"]
    assert props["RecordTime"]["type"] == "date" and props["CompletionDate"]["type"] == "date"
    assert props["RequestMemory"]["type"] == "long"
    assert props["WantCheckpoint"]["type"] == "boolean"
    assert props["Requirements_EXPR"] == {"type": "keyword", "index": False,
                                          "ignore_above": 256}
    # a second run changes nothing
    assert runner.run_once().delivered == 0
    assert client.count(index=alias)["count"] == 120


def test_history_files_import_and_index_and_reimport_changes_no_count(
        engine: tuple[str, str], log: EmbeddedLog) -> None:
    kind, url = engine
    elog = EventLog(log)
    files = [DATA / "history.sample", DATA / "history.json", DATA / "history.bad"]
    rep = import_history(elog, files)
    assert (rep.imported, rep.rejected) == (7, 1)
    (dead,) = elog.dead_letters(EVENTS)
    assert dead.reason.startswith(f"{DATA / 'history.bad'}:7:")
    runner, alias = runner_for(kind, url, log)
    assert runner.run_once().delivered == 7
    client = client_for(kind, url)
    got = docs(client, alias)
    assert len(got) == 7
    j = got[f"ap2.example.org#7.0#1763810000#1763814000"]
    assert (j["StartdSlot"], j["StartdName"], j["ScheddName"]) == (
        "slot2", "ep9.example.org", "ap2.example.org")
    assert j["WantDocker"] is True and j["IsNoopJob"] is False
    assert j["OnExitRemove_EXPR"] == "Nope + 1"
    removed = got[f"ap2.example.org#7.1#1763810000#1763812000"]  # RecordTime from ECS
    assert removed["Status"] == "Removed" and removed["StartdSlot"] == "slot1_1"
    sample = got[f"ap1.example.org#101.0#1763800000#1763803600"]
    assert sample["RequestMemory"] == 2048 and sample["TransferInputStats"] == {
        "CedarFilesCount": 2, "CedarSizeBytes": 1024}
    rep2 = import_history(elog, files)
    assert (rep2.imported, rep2.already) == (0, 7)
    assert len(elog.dead_letters(EVENTS)) == 1
    assert runner.run_once().delivered == 0
    assert client.count(index=alias)["count"] == 7


def test_a_document_the_cluster_refuses_goes_to_the_sink_dlq(engine: tuple[str, str],
                                                             log: EmbeddedLog) -> None:
    kind, url = engine
    ads = history_ads(3)
    ads[1]["RequestMemory"] = "lots"       # RequestMemory_STRING: fine
    ads[1]["NumJobStarts"] = "not a number"  # unknown-typed -> keyword, fine
    ads[0]["QDate"] = "yesterday"          # a date field that is not a date: QDate_STRING
    ads[2]["QDate"] = 9_200_000_000_000_000_000  # fits a long, no date: the cluster refuses
    EventLog(log).append(EVENTS, [make_event(JobHistory(ad), ts=T0 + k, source="schedd@ap",
                                             seq=k) for k, ad in enumerate(ads)])
    runner, alias = runner_for(kind, url, log)
    report = runner.run_once()
    assert (report.delivered, report.rejected, report.lag) == (2, 1, 0)
    (dead,) = runner.dead_letters()
    assert "schedd@ap:2" in dead.reason and "QDate" in dead.reason
    assert len(docs(client_for(kind, url), alias)) == 2


# --------------------------------------------------------------------------- faults


@pytest.fixture
def killable_es(es_server: Any) -> Iterator[Any]:
    """A SearchServer this test may kill -9: the session's own, or (ES_URL given) a new one."""
    if es_server is not None:
        yield es_server
        return
    from compose.search import SearchServer

    with SearchServer("elasticsearch") as _:
        yield _


class WatchedTarget:
    """The real adstash target, plus a check before every delivery: all documents below the
    sink's committed offset must be in Elasticsearch (asked with an ids count, not assumed).
    On delivery `kill_at` it asks the test to kill the node while the bulk is in flight."""

    def __init__(self, inner: AdstashTarget, log: EmbeddedLog, ids: list[str], client: Any,
                 alias: str, kill_at: int) -> None:
        self.inner, self.log, self.ids, self.client, self.alias = inner, log, ids, client, alias
        self.name, self.topics = inner.name, inner.topics
        self.kill_at = kill_at
        self.calls = 0
        self.unavailable = 0
        self.samples: list[tuple[int, int]] = []   # (committed offset, its docs present in ES)
        self.kill_now = threading.Event()
        self.killed = threading.Event()

    def _sample(self) -> None:
        import elastic_transport
        from elasticsearch import ApiError

        committed = self.log.committed(sink_group(self.name), EVENTS).get(0, 0)
        try:
            self.client.indices.refresh(index=self.alias)
            present = self.client.count(index=self.alias, query={
                "ids": {"values": self.ids[:committed]}})["count"] if committed else 0
        except (elastic_transport.TransportError, ApiError):
            return  # down or recovering: nothing to compare with
        self.samples.append((committed, present))

    def deliver(self, items: Any, upto: Any) -> Any:
        self._sample()
        self.calls += 1
        if self.calls == self.kill_at:
            self.kill_now.set()
        try:
            return self.inner.deliver(items, upto)
        except TargetUnavailableError:
            self.unavailable += 1
            raise
        finally:
            if self.calls == self.kill_at:
                self.killed.wait(60)

    def positions(self) -> None:
        return None

    def close(self) -> None:
        self.inner.close()


@pytest.mark.elasticsearch
def test_elasticsearch_killed_mid_stream_loses_and_duplicates_nothing(
        killable_es: Any, log: EmbeddedLog) -> None:
    from elasticsearch import Elasticsearch

    url = str(killable_es.url)
    ads = history_ads(3000)
    EventLog(log).append(EVENTS, [make_event(JobHistory(ad), ts=T0 + k, source="schedd@ap",
                                             seq=k) for k, ad in enumerate(ads)])
    ids = [f"{a['GlobalJobId']}#{a['CompletionDate']}" for a in ads]  # in log order
    index = f"t{time.time_ns()}-000001"
    opts = SearchEngineOptions(host=url, index_name=index, bunch_size=50)
    client = Elasticsearch(url, max_retries=0, request_timeout=10)
    watched = WatchedTarget(AdstashTarget.from_options("elasticsearch", opts,
                                                       name=f"adstash-{index}"),
                            log, ids, client, opts.alias, kill_at=6)
    runner = SinkRunner(log, watched, batch=100, backoff=0.2, max_backoff=2.0, progress=False)
    reports: list[SinkReport] = []
    worker = threading.Thread(target=lambda: reports.append(runner.run_once()))
    worker.start()
    try:
        assert watched.kill_now.wait(120)
        killable_es.kill()
        at_kill = log.committed(runner.group, EVENTS).get(0, 0)
        watched.killed.set()
        time.sleep(1.0)
        killable_es.start()
        worker.join(300)
        assert not worker.is_alive()
    finally:
        watched.killed.set()
    (report,) = reports
    assert 0 < at_kill < len(ads)            # the kill came mid-stream
    assert watched.unavailable >= 1          # and the sink saw the cluster gone
    assert report.lag == 0 and log.committed(runner.group, EVENTS) == {0: len(ads)}
    # the checkpoint was never ahead of what Elasticsearch held, including right after restart
    after_restart = [s for s in watched.samples if s[0] >= at_kill]
    assert after_restart and all(present == committed for committed, present in watched.samples)
    client.indices.refresh(index=opts.alias)
    assert client.count(index=opts.alias)["count"] == len(ads)
    got = [h["_id"] for h in client.search(index=opts.alias, size=10_000, source=False,
                                           query={"match_all": {}})["hits"]["hits"]]
    assert len(got) == len(set(got)) == len(ads) and set(got) == set(ids)
    client.close()


def home_with_history(tmp_path: Path, n: int) -> Path:
    """A data directory whose embedded log holds `n` job.history events."""
    home = tmp_path / "home"
    lg = EmbeddedLog(home / "log")
    ensure_topics(lg)
    EventLog(lg).append(EVENTS, [make_event(JobHistory(ad), ts=T0 + k, source="schedd@ap",
                                            seq=k) for k, ad in enumerate(history_ads(n))])
    lg.close()
    return home


def test_an_unreachable_cluster_is_one_line_retried_with_backoff_checkpoint_held(
        tmp_path: Path) -> None:
    from compose.kafka import free_port

    home = home_with_history(tmp_path, 5)
    port = free_port()  # nothing listens there

    def adstash(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home),
                               *extra, "adstash", "--se_host", f"127.0.0.1:{port}", "--once",
                               "--retry_for", "2"], capture_output=True, text=True,
                              cwd=Path(__file__).parents[1], timeout=120)

    proc = adstash()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert f"127.0.0.1:{port} is unreachable" in lines[0] and "retrying with backoff" in lines[0]
    assert lines[1] == (f"poolledger adstash: gave up after 2 s of retries: elasticsearch at "
                        f"http://127.0.0.1:{port} is unreachable: ConnectionError; "
                        f"checkpoint kept, lag 5")
    verbose = adstash("-v")
    delays = [float(m) for m in re.findall(r"retrying in ([0-9.]+) s", verbose.stderr)]
    assert delays[:3] == [0.5, 1.0, 2.0] and "Traceback" not in verbose.stderr
    lg = EmbeddedLog(home / "log")
    try:
        assert lg.committed(sink_group("adstash-elasticsearch"), EVENTS) == {}
    finally:
        lg.close()


def test_checkpoint_file_holds_the_positions_acknowledged_and_daemon_options_are_refused(
        tmp_path: Path) -> None:
    """condor_adstash's `--checkpoint_file`: the checkpoint goes to that JSON file after each
    acknowledged bulk (not to the consumer group), a second run starts from it, an
    unreachable cluster leaves it alone; adstash's daemon-polling options are refused in one
    line, its deprecated --es_* spellings accepted."""
    from compose.kafka import free_port

    home = home_with_history(tmp_path, 5)
    ck = tmp_path / "adstash_checkpoint.json"

    def adstash(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "services.cli", "--home", str(home),
                               "adstash", "--once", *extra], capture_output=True, text=True,
                              cwd=Path(__file__).parents[1], timeout=120)

    port = free_port()  # nothing listens there
    down = adstash("--es_host", f"127.0.0.1:{port}", "--retry_for", "1",
                   "--checkpoint_file", str(ck))
    assert down.returncode == 1 and "checkpoint kept, lag 5" in down.stderr
    assert not ck.exists()
    first = adstash("--interface", "jsonfile", "--json_dir", str(tmp_path / "j"),
                    "--checkpoint_file", str(ck))
    assert first.returncode == 0, first.stderr
    assert "5 documents indexed from 5 events read" in first.stdout
    assert json.loads(ck.read_text()) == {EVENTS: {"0": 5}}
    lg = EmbeddedLog(home / "log")
    try:
        assert lg.committed(sink_group("adstash-jsonfile"), EVENTS) == {}
        EventLog(lg).append(EVENTS, [make_event(JobHistory(history_ads(6)[5]), ts=T0 + 5,
                                                source="schedd@ap", seq=5)])
    finally:
        lg.close()
    again = adstash("--interface", "jsonfile", "--json_dir", str(tmp_path / "j"),
                    "--checkpoint_file", str(ck))
    assert "1 documents indexed from 1 events read" in again.stdout
    assert json.loads(ck.read_text()) == {EVENTS: {"0": 6}}
    ck.write_text("[1, 2]")
    bad = adstash("--interface", "jsonfile", "--json_dir", str(tmp_path / "j"),
                  "--checkpoint_file", str(ck))
    assert (bad.returncode, bad.stderr) == (2, f"poolledger adstash: --checkpoint_file {ck}: "
                                               "not a PoolLedger checkpoint "
                                               '({"topic": {"partition": offset}})\n')
    for option in (["--schedd_history"], ["--collectors", "cm.example.org"],
                   ["--log_level", "DEBUG"]):
        refused = adstash(*option)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert refused.stderr.startswith(f"poolledger adstash: {option[0]}: ")
        assert len(refused.stderr.splitlines()) == 1


# --------------------------------------------------------------------------- live


@pytest.mark.elasticsearch
def test_run_with_adstash_indexes_the_runs_job_history(es_url: str, tmp_path: Path) -> None:
    import orjson
    from elasticsearch import Elasticsearch

    index = f"t{time.time_ns()}-000001"
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "services.cli", "run", "small", "--hours", "2",
                           "--out", str(out), "--quiet", "--adstash", es_url],
                          capture_output=True, text=True, cwd=Path(__file__).parents[1],
                          timeout=600, env={**os.environ,
                                            "POOLLEDGER_ADSTASH_SE_INDEX_NAME": index})
    assert proc.returncode == 0, proc.stderr
    history = [e for e in map(orjson.loads, (out / "events.jsonl").read_bytes().splitlines())
               if e["type"] == "job.history"]
    assert len(history) > 10
    assert f"adstash: the run's events indexed into {es_url}" in proc.stdout
    client = Elasticsearch(es_url)
    alias = index.removesuffix("-000001")
    client.indices.refresh(index=alias)
    got = {h["_id"] for h in client.search(index=alias, size=10_000, source=False,
                                           query={"match_all": {}})["hits"]["hits"]}
    assert got == {f"{e['data']['ad']['GlobalJobId']}#{e['data']['ad']['CompletionDate']}"
                   for e in history}
    assert client.count(index=alias)["count"] == len(history)
    client.close()


@pytest.mark.kafka
@pytest.mark.elasticsearch
def test_run_on_kafka_indexes_the_runs_job_history_and_keeps_its_history_database(
        kafka_bootstrap: str, es_url: str, tmp_path: Path) -> None:
    """`poolledger --broker kafka://... run --adstash URL`: the adstash sink is a consumer
    group of the run's Kafka topic beside the faust worker, and the run ends with its
    history.duckdb holding the topic's job.history events, as an embedded run does."""
    import orjson
    from elasticsearch import Elasticsearch

    from adstash.history import connect

    index = f"k{time.time_ns()}-000001"
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("POOLLEDGER_HOME",
                                                             "POOLLEDGER_CONFIG")}
    proc = subprocess.run([sys.executable, "-m", "services.cli", "--broker",
                           f"kafka://{kafka_bootstrap}", "run", "small", "--hours", "1",
                           "--out", str(out), "--quiet", "--adstash", es_url],
                          capture_output=True, text=True, cwd=Path(__file__).parents[1],
                          timeout=600, env={**env, "POOLLEDGER_ADSTASH_SE_INDEX_NAME": index})
    assert proc.returncode == 0, proc.stderr
    assert "faust check: OK" in proc.stdout
    assert f"adstash: the run's events indexed into {es_url}" in proc.stdout
    assert f"History database: {out / 'history.duckdb'}" in proc.stdout
    history = [e for e in map(orjson.loads, (out / "events.jsonl").read_bytes().splitlines())
               if e["type"] == "job.history"]
    assert len(history) > 10
    client = Elasticsearch(es_url)
    alias = index.removesuffix("-000001")
    client.indices.refresh(index=alias)
    got = {h["_id"] for h in client.search(index=alias, size=10_000, source=False,
                                           query={"match_all": {}})["hits"]["hits"]}
    client.close()
    assert got == {f"{e['data']['ad']['GlobalJobId']}#{e['data']['ad']['CompletionDate']}"
                   for e in history}
    con = connect(home=out)
    rows = [r[0] for r in con.execute("SELECT event_id FROM jobs").fetchall()]
    con.close()
    assert sorted(rows) == sorted(e["id"] for e in history)


# --------------------------------------------------------------------------- Grafana

DASHBOARDS = Path(__file__).resolve().parents[1] / "compose" / "grafana" / "dashboards"


def grafana_es_body(target: dict[str, Any]) -> dict[str, Any]:
    """The search a Grafana Elasticsearch panel target sends: its Lucene query, its bucket
    aggregations nested in order, its metrics (count is the buckets' doc_count) innermost."""
    inner: dict[str, Any] = {m["id"]: {m["type"]: {"field": m["field"]}}
                             for m in target["metrics"] if m["type"] != "count"}
    for b in reversed(target["bucketAggs"]):
        s = b.get("settings", {})
        agg: dict[str, Any]
        if b["type"] == "terms":
            agg = {"terms": {"field": b["field"], "size": int(s.get("size", 10))}}
        else:
            assert b["type"] == "date_histogram", b
            agg = {"date_histogram": {"field": b["field"], "fixed_interval": s["interval"],
                                      "min_doc_count": int(s.get("min_doc_count", 0))}}
        if inner:
            agg["aggs"] = inner
        inner = {b["id"]: agg}
    return {"size": 0, "query": {"query_string": {"query": target.get("query") or "*"}},
            "aggs": inner}


@pytest.mark.elasticsearch
def test_every_grafana_job_history_panel_query_returns_data(es_url: str, log: EmbeddedLog) -> None:
    """Issue 14: each Elasticsearch panel of the provisioned dashboards, run as Grafana sends
    it against adstash's documents in the real Elasticsearch, finds them (counts add up)."""
    ads = [dict(a, RemoteWallClockTime=600 + k) for k, a in enumerate(history_ads(60))]
    EventLog(log).append(EVENTS, [make_event(JobHistory(ad), ts=T0 + k, source="schedd@ap",
                                             seq=k + 1) for k, ad in enumerate(ads)])
    runner, alias = runner_for("elasticsearch", es_url, log)
    assert runner.run_once().delivered == 60
    client = client_for("elasticsearch", es_url)
    client.indices.refresh(index=alias)
    checked = 0
    for board in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(board.read_text())["panels"]:
            for target in panel["targets"]:
                ds = target.get("datasource") or panel.get("datasource")
                if ds["uid"] != "poolledger-elasticsearch":
                    continue
                res = client.search(index=alias, body=grafana_es_body(target))
                outer = res["aggregations"][target["bucketAggs"][0]["id"]]["buckets"]
                assert outer, f"{board.name}: panel {panel['title']!r} found nothing"
                assert sum(b["doc_count"] for b in outer) == 60, panel["title"]
                metric = next((m for m in target["metrics"] if m["type"] != "count"), None)
                if metric is not None:  # the wall-clock sum over every bucket is the ads' sum
                    leaf = [d for b in outer for d in b[target["bucketAggs"][1]["id"]]["buckets"]]
                    assert sum(d[metric["id"]]["value"] for d in leaf) == sum(
                        a["RemoteWallClockTime"] for a in ads)
                checked += 1
    assert checked >= 4
