"""gangliad against the real services: Debian's gmond, Prometheus (+ promtool) and carbon-cache,
each started on free loopback ports by compose/monitoring.py and stopped by the test."""
from __future__ import annotations

import io
import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compose.kafka import free_port, terminate
from compose.monitoring import MonitoringServer, _tcp_open, free_udp_port
from ganglia.gmetric import GmondPublisher, gmond_channels, read_gmond
from ganglia.graphite import GraphitePublisher
from ganglia.metrics import Evaluation
from ganglia.prometheus import PrometheusExporter
from ganglia.publish import HISTORY, LIVE, Delivery
from services.cli import main
from streams.core.collector import current_ads
from tests.ganglia.helpers import START, evaluations, simulate

DASHBOARDS = Path(__file__).resolve().parents[2] / "compose" / "grafana" / "dashboards"


@pytest.fixture(scope="module")
def run_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("metrics-run")
    simulate(home)
    return home


@pytest.fixture(scope="module")
def expected(run_home: Path) -> tuple[list[Evaluation], Evaluation, Any]:
    return evaluations(run_home / "log")


def gangliad(home: Path, *args: str, sets: dict[str, Any] | None = None) -> int:
    argv = ["--home", str(home)]
    for k, v in (sets or {}).items():
        argv += ["--set", f"{k}={v}"]
    return main([*argv, "gangliad", *args])


def wait_for(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


# --------------------------------------------------------------------------- gmond

def gmond_xml(info: dict[str, Any]) -> dict[str, Any]:
    return read_gmond("127.0.0.1", info["xml_port"])


def test_gmond_holds_the_pool_aggregates_per_schedd_and_slot1_metrics(
        run_home: Path, expected: tuple[list[Evaluation], Evaluation, Any]) -> None:
    _, final, daemon = expected
    with MonitoringServer("gmond") as info:
        rc = gangliad(run_home, "--once", "--publish", "ganglia",
                      sets={"GANGLIA_CONFIG": info["config"], "GANGLIA_SEND_DATA_FOR_ALL_HOSTS": True})
        assert rc == 0
        hosts = wait_for(lambda: (lambda h: h if "cm.example.org" in h and "ep01.example.org" in h else None)(gmond_xml(info)))
        assert hosts, gmond_xml(info)
    schedds = current_ads(daemon.state, "Scheduler")
    running = sum(r.ad["TotalRunningJobs"] for r in schedds)
    idle = sum(r.ad["TotalIdleJobs"] for r in schedds)
    cm = hosts["cm.example.org"].metrics
    assert int(cm["Jobs in Pool"]["VAL"]) == running + idle
    assert int(cm["Held Jobs in Pool"]["VAL"]) == 2
    assert int(cm["Cpus in Pool"]["VAL"]) == 14
    assert cm["Jobs in Pool"]["GROUP"] == "HTCondor Pool"
    assert (cm["Jobs in Pool"]["TMAX"], cm["Jobs in Pool"]["DMAX"]) == ("120", "86400")
    for name in ("ap1.example.org", "ap2.example.org"):
        ad = next(r.ad for r in schedds if r.ad["Name"] == name)
        assert int(hosts[name].metrics["TotalRunningJobs"]["VAL"]) == ad["TotalRunningJobs"]
        assert hosts[name].metrics["TotalRunningJobs"]["GROUP"] == "HTCondor Schedd"
    assert int(hosts["ep01.example.org"].metrics["TotalCpus"]["VAL"]) == 2
    assert int(hosts["big1.example.org"].metrics["TotalCpus"]["VAL"]) == 8
    neg = hosts["negotiator.cm.example.org"].metrics
    limit = next(m for m in final.metrics if m.name == "ConcurrencyLimit_xsw")
    assert float(neg["ConcurrencyLimit_xsw"]["VAL"]) == limit.value  # the Regex metric, expanded
    completed = hosts["ap1.example.org"].metrics["JobsCompleted"]
    assert completed["SLOPE"] == "derivative"
    # nothing above GANGLIAD_VERBOSITY (0): TotalDisk, CandidateSlots0, UpdatesLost are verbosity 1
    everything = {n for h in hosts.values() for n in h.metrics}
    assert not everything & {"TotalDisk", "LastNegotiationCycleCandidateSlots0", "UpdatesLost",
                             "ScheddRunningFraction", "Busiest Schedd Running Jobs"}
    published = {m.name for m in final.metrics}
    assert everything == published


def test_gmond_without_per_execute_node_metrics(run_home: Path) -> None:
    with MonitoringServer("gmond") as info:
        rc = gangliad(run_home, "--once", "--publish", "ganglia",
                      sets={"GANGLIA_CONFIG": info["config"], "GANGLIA_SEND_DATA_FOR_ALL_HOSTS": True,
                            "GANGLIAD_PER_EXECUTE_NODE_METRICS": False})
        assert rc == 0
        # gmond shows a host from its first packet: wait for the metric, not only the host
        hosts = wait_for(lambda: (lambda h: h if "cm.example.org" in h and "Cpus in Pool" in
                                  h["cm.example.org"].metrics else None)(gmond_xml(info)))
    assert not [h for h in hosts if h.startswith(("ep", "big"))]
    assert int(hosts["cm.example.org"].metrics["Cpus in Pool"]["VAL"]) == 14  # aggregates stay


def test_gmond_only_monitored_hosts_unless_send_data_for_all_hosts(run_home: Path) -> None:
    with MonitoringServer("gmond") as info:
        assert gangliad(run_home, "--once", "--publish", "ganglia",
                        sets={"GANGLIA_CONFIG": info["config"]}) == 0
        time.sleep(1.0)
        assert gmond_xml(info) == {}  # gmond monitors no host yet: nothing is sent


def test_compose_gmond_is_unicast_and_receives_gangliads_metrics(run_home: Path, tmp_path: Path) -> None:
    """The docker-compose gmond's configuration, run by the real gmond (on free ports: 8649 may
    be taken on a shared machine): gangliad, told where to send by the same file, reaches it."""
    compose = (DASHBOARDS.parents[1] / "docker-compose.yml").read_text()
    gmond_service = compose.split("\n  gmond:\n", 1)[1].split("\n  gangliad:\n", 1)[0]
    gangliad_service = compose.split("\n  gangliad:\n", 1)[1].split("\n  graphite:\n", 1)[0]
    assert "./ganglia/gmond.conf:/etc/poolledger/gmond.conf:ro" in gmond_service
    assert "gmond -f -c /etc/poolledger/gmond.conf" in gmond_service
    assert "./ganglia/gmond.conf:/etc/poolledger/gmond.conf:ro" in gangliad_service
    assert "--set GANGLIA_CONFIG=/etc/poolledger/gmond.conf" in gangliad_service
    assert "--publish ganglia" in gangliad_service
    source = DASHBOARDS.parents[1] / "ganglia" / "gmond.conf"
    text = source.read_text()
    assert "mcast" not in re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # Debian's default joins 239.2.11.71
    assert gmond_channels(source) == (("127.0.0.1", 8649), ("127.0.0.1", 8649))
    udp, tcp = free_udp_port(), free_port()
    conf = tmp_path / "gmond.conf"
    conf.write_text(re.sub(r"(tcp_accept_channel \{\s*port = )8649", rf"\g<1>{tcp}", text)
                    .replace("port = 8649", f"port = {udp}"))
    assert gmond_channels(conf) == (("127.0.0.1", udp), ("127.0.0.1", tcp))
    with open(tmp_path / "gmond.log", "wb") as log:
        proc = subprocess.Popen(["gmond", "-c", str(conf), "-f"], stdout=log, stderr=subprocess.STDOUT,
                                cwd=tmp_path, start_new_session=True)
    try:
        assert wait_for(lambda: proc.poll() is not None or _tcp_open(tcp)) and proc.poll() is None, \
            (tmp_path / "gmond.log").read_text()
        assert gangliad(run_home, "--once", "--publish", "ganglia",
                        sets={"GANGLIA_CONFIG": conf, "GANGLIA_SEND_DATA_FOR_ALL_HOSTS": True}) == 0
        hosts = wait_for(lambda: (lambda h: h if "cm.example.org" in h else None)(
            read_gmond("127.0.0.1", tcp)))
        assert hosts and "Jobs in Pool" in hosts["cm.example.org"].metrics
    finally:
        terminate(proc.pid, 15.0, proc)


# --------------------------------------------------------------------------- Prometheus

def prom_query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.fixture(scope="module")
def scraped(expected: tuple[list[Evaluation], Evaluation, Any]) -> Iterator[tuple[str, Evaluation]]:
    """The exporter holding the run's final view, scraped by a real Prometheus."""
    _, final, _ = expected
    exporter = PrometheusExporter("127.0.0.1", free_port())
    exporter.publish(final.metrics, final.at)
    try:
        with MonitoringServer("prometheus", scrape=[f"127.0.0.1:{exporter.port}"]) as info:
            assert wait_for(lambda: prom_query(info["url"], "htcondor_pool_jobs"), 60)
            time.sleep(3)  # a few scrapes, so rate() over them has two points
            yield info["url"], final
    finally:
        exporter.close()


def test_prometheus_answers_with_the_pools_value(scraped: tuple[str, Evaluation]) -> None:
    url, final = scraped
    result = prom_query(url, "htcondor_pool_jobs")
    jobs = next(m for m in final.metrics if m.name == "Jobs in Pool")
    assert [float(r["value"][1]) for r in result] == [float(jobs.value)]
    assert result[0]["metric"]["machine"] == "cm.example.org"
    eup = prom_query(url, 'htcondor_submitter_effective_priority{submitter="alice@example.org"}')
    alice = next(m for m in final.metrics if m.name == "alice@example.org-EffectivePriority")
    assert float(eup[0]["value"][1]) == pytest.approx(alice.value)


def prom_types(url: str) -> dict[str, str]:
    """Each series name Prometheus scraped -> its family's TYPE (a counter's series is the
    family name + `_total`)."""
    with urllib.request.urlopen(f"{url}/api/v1/metadata", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    out = {}
    for family, entries in body["data"].items():
        kind = entries[0]["type"]
        out[family] = kind
        if kind == "counter" and not family.endswith("_total"):
            out[family + "_total"] = kind
    return out


def exposition(final: Evaluation) -> str:
    """What the exporter serves for the run's final view."""
    exporter = PrometheusExporter("127.0.0.1", 0)
    try:
        exporter.publish(final.metrics, final.at)
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as r:
            return str(r.read().decode())
    finally:
        exporter.close()


def test_exposition_passes_promtool_check_metrics_with_counters_typed(
        expected: tuple[list[Evaluation], Evaluation, Any]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    _, final, daemon = expected
    text = exposition(final)
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), \
        lint.stdout + lint.stderr  # promtool's lint: snake_case, _total counters, units, HELP
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("htcondor_")}
    assert len(families) >= 40
    assert {n for n, f in families.items() if f.type == "counter"} == {
        "htcondor_schedd_jobs_submitted", "htcondor_schedd_jobs_started", "htcondor_schedd_jobs_completed"}
    assert all(f.type == "gauge" for n, f in families.items() if not n.startswith("htcondor_schedd_jobs_"))
    completed = families["htcondor_schedd_jobs_completed"].samples
    assert {s.name for s in completed} == {"htcondor_schedd_jobs_completed_total"}
    memory = families["htcondor_pool_memory_bytes"].samples
    assert [s.value for s in memory] == [next(float(m.value) for m in final.metrics if m.name == "Memory in Pool")]
    hosts = {r.ad["Machine"] for r in current_ads(daemon.state) if isinstance(r.ad.get("Machine"), str)}
    for f in families.values():
        instances = {v for s in f.samples for k, v in s.labels.items() if k not in ("daemon", "machine")}
        assert f.documentation and not [v for v in instances if v and v in f.documentation], \
            (f.name, f.documentation)
        assert {s.labels["machine"] for s in f.samples} <= hosts, f.name  # a host, never a daemon name
        assert len({tuple(sorted(s.labels)) for s in f.samples}) == 1, f.name


def test_every_grafana_panel_query_returns_data(scraped: tuple[str, Evaluation]) -> None:
    url, _ = scraped
    boards = sorted(DASHBOARDS.glob("*.json"))
    assert len(boards) >= 4
    types = prom_types(url)
    checked = rates = 0
    for board in boards:
        doc = json.loads(board.read_text())
        for panel in doc["panels"]:
            for target in panel["targets"]:
                ds = target.get("datasource") or panel.get("datasource")
                if ds["uid"] == "poolledger-elasticsearch":
                    continue  # job history: run against the real Elasticsearch in test_adstash_search
                assert ds["uid"] == "poolledger-prometheus", (board.name, panel["title"])
                where = f"{board.name}: panel {panel['title']!r}: {target['expr']}"
                result = prom_query(url, target["expr"])
                assert result, f"{where} returned nothing"
                for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
                    assert all(r["metric"].get(label) for r in result), f"{where}: no {label} label"
                for name in re.findall(r"\b(htcondor_\w+)", target["expr"]):
                    assert name in types, f"{where}: {name} is not exposed"
                for name in re.findall(r"\b(?:rate|irate|increase)\((htcondor_\w+)", target["expr"]):
                    assert types[name] == "counter", f"{where}: rate() of a {types[name]}"
                checked += 1
                rates += "rate(" in target["expr"]
    assert checked >= 15 and rates >= 1


def test_openmetrics_file_backfills_prometheus_with_event_times(
        run_home: Path, expected: tuple[list[Evaluation], Evaluation, Any], tmp_path: Path) -> None:
    evs, final, _ = expected
    om = tmp_path / "pool.om"
    assert gangliad(run_home, "--once", "--publish", "prometheus", "--openmetrics", str(om)) == 0
    text = om.read_text()
    assert text.endswith("# EOF\n")
    assert "# TYPE htcondor_schedd_jobs_completed counter\n" in text
    assert "# UNIT htcondor_pool_memory_bytes bytes\n" in text
    data = tmp_path / "prom" / "data"
    data.mkdir(parents=True)
    done = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with MonitoringServer("prometheus", tmp_path / "prom") as info:
        # (the view at the log's end shares its timestamp with the last boundary and wins)
        past = [e for e in evs if e.at < final.at]
        for ev in (past[5], past[20], past[-1]):
            jobs = next(m for m in ev.metrics if m.name == "Jobs in Pool")
            got = wait_for(lambda: prom_query(info["url"], "htcondor_pool_jobs", ev.at), 30)
            assert [float(r["value"][1]) for r in got] == [float(jobs.value)], ev.at
        completed = sum(float(m.value) for m in past[-1].metrics if m.name == "JobsCompleted")
        got = prom_query(info["url"], "sum(htcondor_schedd_jobs_completed_total)", past[-1].at)
        assert [float(r["value"][1]) for r in got] == [completed]


# --------------------------------------------------------------------------- Graphite

def test_replay_into_carbon_stores_series_at_event_timestamps(
        run_home: Path, expected: tuple[list[Evaluation], Evaluation, Any]) -> None:
    import whisper

    evs, final, _ = expected
    with MonitoringServer("graphite") as info:
        assert gangliad(run_home, "--once", "--publish", "graphite",
                        sets={"POOLLEDGER_GRAPHITE": f"127.0.0.1:{info['port']}"}) == 0
        path = Path(info["whisper_dir"]) / "htcondor" / "cm_example_org" / "Jobs_in_Pool.wsp"

        def stored() -> dict[int, float]:
            if not path.exists():
                return {}
            (start, _end, step), values = whisper.fetch(str(path), START - 60, final.at + 60)
            return {start + i * step: v for i, v in enumerate(values) if v is not None}

        want = {int(ev.at): float(next(m.value for m in ev.metrics if m.name == "Jobs in Pool"))
                for ev in evs if int(ev.at) // 60 != int(final.at) // 60}
        got = wait_for(lambda: (lambda s: s if set(want) <= set(s) else None)(stored()), 30)
    assert got, stored()
    assert {t: got[t] for t in want} == want
    assert min(want) < START + 300  # the history starts with the log, not when it was replayed


# --------------------------------------------------------------------------- outages

def test_unreachable_gmond_and_carbon_warn_once_and_retry_until_back(
        expected: tuple[list[Evaluation], Evaluation, Any]) -> None:
    evs, final, _ = expected
    err = io.StringIO()
    dead = free_port()
    graphite = GraphitePublisher("127.0.0.1", dead)
    gmond = GmondPublisher(("127.0.0.1", dead), ("127.0.0.1", dead), all_hosts=True)
    delivery = Delivery([(gmond, LIVE), (graphite, HISTORY)], err=err)
    for ev in evs[:3]:
        delivery.offer(ev)
        assert delivery.flush(force=True) is False
    lines = err.getvalue().splitlines()
    assert len(lines) == 2 and all("warning" in x and "retrying" in x for x in lines)  # one per outage
    assert sorted(delivery.undelivered()) == ["ganglia", "graphite"]
    with MonitoringServer("graphite") as carbon, MonitoringServer("gmond") as g:
        graphite.port = carbon["port"]
        gmond.send_to = ("127.0.0.1", g["udp_port"])
        gmond.xml_at = ("127.0.0.1", g["xml_port"])
        assert delivery.flush(force=True) is True
        assert "reachable again" in err.getvalue()
        hosts = wait_for(lambda: (lambda h: h if "cm.example.org" in h else None)(gmond_xml(g)))
        assert hosts
        # every held evaluation reached carbon, in order
        path = Path(carbon["whisper_dir"]) / "htcondor" / "cm_example_org" / "Jobs_in_Pool.wsp"
        assert wait_for(lambda: path.exists())
    delivery.close()


# --------------------------------------------------------------------------- CLI

def test_dry_run_lists_each_metric_like_gangliads_noop_log(
        run_home: Path, expected: tuple[list[Evaluation], Evaluation, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    _, final, _ = expected
    assert gangliad(run_home, "--once", "--dry-run") == 0
    out = capsys.readouterr().out
    jobs = next(m for m in final.metrics if m.name == "Jobs in Pool")
    assert f"noop mode: publishing Jobs in Pool={jobs.value}, group=HTCondor Pool, units=jobs" in out
    assert out.count("noop mode: publishing") == len(final.metrics)


def test_bad_metric_file_one_line_with_file_line_and_the_others_published(
        run_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "00_mine").write_text(
        '[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; ]\n'
        '[\n  Name = "Oops";\n  Value = TotalIdleJobs *;\n  TargetType = "Scheduler";\n]\n')
    rc = gangliad(run_home, "--once", "--dry-run", sets={"GANGLIAD_METRICS_CONFIG_DIR": tmp_path})
    out, err = capsys.readouterr()
    assert rc == 2
    problems = [line for line in err.splitlines() if "00_mine" in line]
    assert len(problems) == 1 and f"{tmp_path / '00_mine'}:4:" in problems[0] and "'Oops'" in problems[0]
    assert "Traceback" not in err
    assert out.count("noop mode: publishing TotalRunningJobs=") == 2  # both schedds


def test_usage_errors_exit_2(run_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gangliad(run_home, "--once", "--publish", "nagios") == 2
    assert gangliad(run_home, "--once", "--publish", "prometheus") == 2
    assert gangliad(run_home, "--once", "--dry-run", sets={"GANGLIAD_METRICS_CONFIG_DIR": "/no/such/dir"}) == 2
    err = capsys.readouterr().err
    assert "'nagios'" in err and "--openmetrics" in err and "/no/such/dir" in err
