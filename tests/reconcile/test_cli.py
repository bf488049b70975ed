"""`poolledger reconcile`, `audit` and the drift metrics over a simulated run shadowed by a
"real" negotiator: its Accounting ads appended to the log in condor_negotiator's form
(Priority = EUP, LastUpdate), alice's agreeing, bob's 10% too high."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ganglia.gangliad import Gangliad
from ganglia.metrics import GangliadConfig, load_metrics
from ganglia.prometheus import PrometheusExporter
from schemas.settings import load_settings
from services.cli import main
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS
from streams.replay import replay
from tests.reconcile.helpers import events_of, negotiator_ad, simulated

REAL = "negotiator@real.example.org"
ALICE = "alice@example.org"
BOB = "group_physics.bob@example.org"


def _real_ad(rec: dict[str, Any], ts: float, last_update: float, off: float = 1.0) -> Any:
    env = negotiator_ad(rec["Name"], ts, last_update=last_update,
                        rup=rec["Priority"] * off, factor=rec["PriorityFactor"],
                        ResourcesUsed=rec["ResourcesUsed"],
                        WeightedResourcesUsed=rec["WeightedResourcesUsed"],
                        AccumulatedUsage=rec["AccumulatedUsage"],
                        WeightedAccumulatedUsage=rec["WeightedAccumulatedUsage"])
    env.data.ad["NegotiatorName"] = REAL
    return env


@pytest.fixture(scope="module")
def shadowed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """(home, t): the run, then the real negotiator's reports at t + 60, t + 120, t + 180
    describing PoolLedger's records at t (the run's last event time)."""
    home = tmp_path_factory.mktemp("shadow")
    log_dir = simulated(home)
    led = replay(events_of(log_dir), load_settings())
    t = led.now
    assert t is not None
    recs = led.priorities(t)
    appended = []
    for i, ts in enumerate((t + 60, t + 120, t + 180)):
        appended.append(_real_ad(recs[ALICE], ts, t))
        if i < 2:  # bob: 10% too high twice
            appended.append(_real_ad(recs[BOB], ts, t, off=1.10))
    log = EmbeddedLog(log_dir)
    try:
        EventLog(log).append(EVENTS, appended)
    finally:
        log.close()
    return home, t


def _run(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    status = main(["--home", str(home), *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_reconcile_shows_drift_and_since_when(shadowed: tuple[Path, float],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    home, t = shadowed
    status, out, err = _run(capsys, home, "reconcile", "--negotiator", REAL, "--json")
    assert status == 1, err
    doc = json.loads(out)
    rows = {r["name"]: r for r in doc["rows"]}
    assert set(rows) == {ALICE, BOB} and doc["tolerance"] == 0.01
    assert rows[ALICE]["drifting"] == [] and rows[ALICE]["since"] is None
    assert rows[ALICE]["last_agreed"] == t + 180 and rows[ALICE]["reports"] == 3
    bob = rows[BOB]
    assert bob["drifting"] == ["Priority", "EffectivePriority"] and bob["since"] == t + 60
    assert bob["drift_seconds"] == doc["now"] - (t + 60) == 120
    prio = bob["attributes"]["Priority"]
    assert prio["relative"] == pytest.approx(-0.1 / 1.1, rel=1e-9) and prio["drifting"]
    assert bob["attributes"]["WeightedAccumulatedUsage"]["difference"] == 0.0

    status, out, _ = _run(capsys, home, "reconcile", "--negotiator", "negotiator@real.example.org")
    assert status == 1
    line = next(ln for ln in out.splitlines() if ln.startswith(BOB))
    assert "Priority,EffectivePriority" in line and "-9.09%" in line
    assert f"Reconciliation with {REAL}: 2 submitters and groups, 1 drifting beyond 0.01" in out


def test_reconcile_options(shadowed: tuple[Path, float],
                           capsys: pytest.CaptureFixture[str]) -> None:
    home, _t = shadowed
    # a looser tolerance: a what-if fold, no drift, exit 0
    status, out, err = _run(capsys, home, "reconcile", "--negotiator", REAL, "--tolerance", "0.2")
    assert status == 0 and "0 drifting beyond 0.2" in out and err == ""
    # PoolLedger's own negotiator: no drift; "negotiator" alone names both (the part before '@')
    status, out, _ = _run(capsys, home, "reconcile", "--negotiator", "negotiator@cm.example.org")
    assert status == 0 and "0 drifting" in out and REAL not in out
    status, out, _ = _run(capsys, home, "reconcile", "--negotiator", "negotiator")
    assert status == 1 and REAL in out and "negotiator@cm.example.org" in out
    status, out, _ = _run(capsys, home, "reconcile", "-constraint", "DriftSeconds > 60", "--json")
    assert status == 1 and [r["name"] for r in json.loads(out)["rows"]] == [BOB]
    status, out, _ = _run(capsys, home, "reconcile", "--drifting", "--json")
    assert [r["name"] for r in json.loads(out)["rows"]] == [BOB]
    for bad in (["--tolerance", "nan"], ["--tolerance", "x"], ["-constraint", "Drifting &&"]):
        status, out, err = _run(capsys, home, "reconcile", *bad)
        assert status == 2 and out == "" and len(err.splitlines()) == 1, err
    status, _, err = _run(capsys, home, "reconcile", "--negotiator", "nobody")
    assert status == 1 and "no Accounting ads of negotiator 'nobody'" in err


def test_audit_tells_when_the_drift_started(shadowed: tuple[Path, float],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    home, t = shadowed
    status, out, err = _run(capsys, home, "audit", BOB)
    assert status == 0, err
    lines = [ln for ln in out.splitlines() if REAL in ln]
    assert len(lines) == 1 and " started " in lines[0]
    assert "Priority,EffectivePriority (since" in lines[0]
    status, out, _ = _run(capsys, home, "audit", ALICE)
    assert [ln.split()[2] for ln in out.splitlines() if REAL in ln] == ["agrees"]


def test_drift_metrics_through_the_exporter(shadowed: tuple[Path, float]) -> None:
    """gangliad --reconcile's evaluation at the log's end, scraped from the real exporter."""
    home, t = shadowed
    settings = load_settings()
    defs, problems = load_metrics(None)
    assert not problems
    daemon = Gangliad(defs, GangliadConfig.from_settings(settings), settings, reconcile=True)
    for env in events_of(home / "log"):
        daemon.feed(env)
    final = daemon.flush()
    assert final is not None and final.at == t + 180
    drifting = {(m.labels, m.value) for m in final.metrics if m.family.name == "htcondor_accounting_drifting"
                and m.machine == REAL}
    assert {dict(lab).get("submitter"): v for lab, v in drifting} == {ALICE: 0, BOB: 1}
    plain = Gangliad(defs, GangliadConfig.from_settings(settings), settings)
    for env in events_of(home / "log"):
        plain.feed(env)
    plain_final = plain.flush()
    assert plain_final is not None
    assert not [m for m in plain_final.metrics if m.family.name.startswith("htcondor_accounting_")]
    exporter = PrometheusExporter("127.0.0.1", 0)
    try:
        exporter.publish(final.metrics, final.at)
        text = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics",
                                      timeout=10).read().decode()
    finally:
        exporter.close()
    seconds = [ln for ln in text.splitlines()
               if ln.startswith("htcondor_accounting_drift_seconds{") and BOB in ln and REAL in ln]
    assert len(seconds) == 1 and float(seconds[0].rsplit(" ", 1)[1]) == 120.0
    assert 'machine="real.example.org"' in seconds[0]  # the negotiator's host; its name in `negotiator`
    prio = [ln for ln in text.splitlines()
            if ln.startswith("htcondor_accounting_priority_drift_ratio{") and BOB in ln and REAL in ln]
    assert len(prio) == 1 and float(prio[0].rsplit(" ", 1)[1]) == pytest.approx(-0.1 / 1.1)


def test_named_negotiators_agree_with_their_own_shards(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A pool with two negotiators (NEGOTIATOR_NAMES): each one's ads agree exactly with its
    shard's accounting (-name), and disagree with the whole pool's (the union of both)."""
    home = tmp_path / "sharded"
    assert main(["run", "sharded", "--out", str(home), "--hours", "1"]) == 0
    capsys.readouterr()
    for shard in ("gpu", "cpu"):
        status, out, err = _run(capsys, home, "reconcile", "-name", shard, "--tolerance", "0",
                                "--json")
        rows = json.loads(out)["rows"]
        assert status == 0 and rows and not err, err
        assert {r["negotiator"] for r in rows} == {f"{shard}@cm.example.org"}
    status, out, _ = _run(capsys, home, "reconcile", "--json")
    assert status == 1 and {r["negotiator"] for r in json.loads(out)["rows"] if r["drifting"]} == {
        "gpu@cm.example.org", "cpu@cm.example.org"}
