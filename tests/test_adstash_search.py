"""adstash on real Elasticsearch and OpenSearch: documents, mappings, imports, rejections.

The session fixtures start each engine once (compose/search.py); every test uses its own
index name and consumer group, so tests share the cluster without seeing each other.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from adstash.interfaces import SearchEngineOptions, make_interface
from adstash.sources import import_history
from adstash.target import AdstashTarget
from schemas.events import JobHistory, make_event
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog, ensure_topics
from streams.log.topics import EVENTS
from streams.sink import SinkRunner

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
    target = AdstashTarget(make_interface(kind, opts), name=f"adstash-{index}")
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
