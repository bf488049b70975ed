"""Seed 000, "Running Multiple Negotiators in One Pool": a GPU negotiator and a non-GPU one,
each with its own NEGOTIATOR_SLOT_CONSTRAINT and its own accounting, on one log.

alice's jobs run only on GPU machines and bob's only on the others: alice's usage shows in
the gpu negotiator's accountant and not in the cpu one's, and vice versa; each negotiator
only ever matches slots of its own shard; `poolledger userprio -name NEG` replays the log
through that negotiator's shard and shows its accounting.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.events import AdminCommanded, AdUpdated, Envelope, Matched, NegotiationCycled, make_event
from schemas.settings import load_settings
from services.cli import main
from services.mainloop import MainLoop, RunResult
from services.negotiator.shard import (Shard, ShardFilter, admin_negotiator, admin_source,
                                       filter_events, shards_from_config)
from services.pool import parse_scenario
from services.pool.errors import ScenarioError
from streams.replay import replay
from tests.e2e.helpers import batch, events, run

CM = "cm.example.org"
GPU = "TotalGPUs > 0"
CPU = "(TotalGPUs ?: 0) == 0"
ALICE, BOB = "alice@example.org", "bob@example.org"


def _doc(**extra: Any) -> dict[str, Any]:
    return {
        "config": {"PRIORITY_HALFLIFE": 3600},
        "negotiators": [{"name": "gpu", "slot_constraint": GPU},
                        {"name": "cpu", "slot_constraint": CPU}],
        "machines": [
            {"name": "gpu{n}.example.org", "count": 3, "cpus": 1, "gpus": 1, "memory": 4096},
            {"name": "cpu{n}.example.org", "count": 4, "cpus": 1, "memory": 4096}],
        "submitters": [
            {"user": "alice", "jobs": [batch(6, "4h", request={"gpus": 1},
                                             requirements="TARGET.GPUs >= 1")]},
            {"user": "bob", "jobs": [batch(8, "4h", requirements=f"({CPU.replace('Total', 'TARGET.Total')})")]},
        ],
        **extra,
    }


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("POOLLEDGER_HOME", "POOLLEDGER_BROKER", "POOLLEDGER_CONFIG"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, MainLoop, RunResult]:
    home = tmp_path_factory.mktemp("sharded")
    loop, result = run(home, _doc(), hours=2)
    return home, loop, result


def _rec(ledger: Any, name: str, now: float) -> dict[str, Any] | None:
    return ledger.priorities(now).get(name)


def _used(rec: dict[str, Any] | None) -> bool:
    return rec is not None and float(rec["WeightedAccumulatedUsage"]) > 0


# --- the run ---------------------------------------------------------------------------------

def test_each_negotiator_accounts_only_its_own_machines(sharded: tuple[Path, MainLoop, RunResult]
                                                        ) -> None:
    _home, _loop, result = sharded
    assert set(result.negotiators) == {f"gpu@{CM}", f"cpu@{CM}"}
    gpu, cpu = result.negotiators[f"gpu@{CM}"], result.negotiators[f"cpu@{CM}"]
    end = result.end
    for ledger, user, other in ((gpu, ALICE, BOB), (cpu, BOB, ALICE)):
        mine = _rec(ledger, user, end)
        assert mine is not None
        assert float(mine["Priority"]) > 0.5 and float(mine["WeightedResourcesUsed"]) > 0
        assert float(mine["WeightedAccumulatedUsage"]) > 0
        theirs = _rec(ledger, other, end)
        assert theirs is None or (float(theirs["WeightedResourcesUsed"]) == 0
                                  and float(theirs["WeightedAccumulatedUsage"]) == 0
                                  and float(theirs["Priority"]) <= 0.5)
    # each shard's pool is its own machines
    assert {r.name.split("@")[1][:3] for r in _slots(gpu)} == {"gpu"}
    assert {r.name.split("@")[1][:3] for r in _slots(cpu)} == {"cpu"}
    # the pool-wide ledger still sees everyone's usage
    assert _used(_rec(result.ledger, ALICE, end)) and _used(_rec(result.ledger, BOB, end))


def _slots(ledger: Any) -> list[Any]:
    from streams.core.collector import current_ads
    return current_ads(ledger.pool, "Machine")


def test_each_negotiator_only_matches_its_own_slots(sharded: tuple[Path, MainLoop, RunResult]
                                                    ) -> None:
    home, _loop, _result = sharded
    evs = list(events(home))
    gpu_hosts = {f"gpu{n}.example.org" for n in range(1, 4)}
    by: dict[str, set[str]] = {}
    for e in evs:
        if isinstance(e.data, Matched):
            assert e.source == e.data.negotiator
            by.setdefault(e.data.negotiator, set()).add(e.data.slot.split("@", 1)[1])
    assert by[f"gpu@{CM}"] and by[f"gpu@{CM}"] <= gpu_hosts
    assert by[f"cpu@{CM}"] and not by[f"cpu@{CM}"] & gpu_hosts
    assert set(by) == {f"gpu@{CM}", f"cpu@{CM}"}
    cycled = {e.data.negotiator for e in evs if isinstance(e.data, NegotiationCycled)}
    assert cycled == {f"gpu@{CM}", f"cpu@{CM}"}
    # each negotiator's cycle statistics only know its own submitter's usage
    last = {e.data.negotiator: e.data for e in evs if isinstance(e.data, NegotiationCycled)}
    assert last[f"gpu@{CM}"].submitters[ALICE]["usage"] > 0
    assert last[f"gpu@{CM}"].submitters.get(BOB, {}).get("usage", 0) == 0
    assert last[f"cpu@{CM}"].submitters[BOB]["usage"] > 0
    assert last[f"cpu@{CM}"].submitters.get(ALICE, {}).get("usage", 0) == 0


def test_replay_through_a_shard_filter_equals_the_runs_ledger(
        sharded: tuple[Path, MainLoop, RunResult]) -> None:
    home, _loop, result = sharded
    settings = load_settings()
    for name in ("gpu", "cpu"):
        # the definitions come from the log (the scenario's config, recorded at boot)
        flt = ShardFilter(Shard(name))
        led = replay(filter_events(events(home), flt), settings)
        assert flt.defined
        mine = result.negotiators[f"{name}@{CM}"]
        assert led.to_json() == mine.to_json()


def test_without_negotiators_nothing_changes(tmp_path: Path) -> None:
    doc = _doc()
    del doc["negotiators"]
    loop, result = run(tmp_path, doc, hours=1)
    assert result.negotiators == {}
    names = {e.data.negotiator for e in events(tmp_path) if isinstance(e.data, Matched)}
    assert names == {f"negotiator@{CM}"}


# --- poolledger userprio -name ---------------------------------------------------------------

def _userprio(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["--home", str(home), "userprio", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_userprio_name_shows_that_negotiators_accounting(
        sharded: tuple[Path, MainLoop, RunResult], capsys: pytest.CaptureFixture[str]) -> None:
    home = sharded[0]
    rc, gpu_out, _ = _userprio(capsys, home, "-name", "gpu", "-allusers")
    assert rc == 0
    rc, cpu_out, _ = _userprio(capsys, home, "-name", "cpu", "-allusers")
    assert rc == 0
    assert gpu_out != cpu_out
    assert ALICE in gpu_out and BOB in cpu_out
    rc, out, _ = _userprio(capsys, home, "-name", "gpu", "--json")
    doc = json.loads(out)
    subs = {s["Name"]: s for s in doc["Submitters"]}
    assert float(subs[ALICE]["WeightedAccumulatedUsage"]) > 0
    assert BOB not in subs or not float(subs[BOB]["WeightedAccumulatedUsage"] or 0)
    rc, out, _ = _userprio(capsys, home, "-name", "cpu", "--json")
    subs = {s["Name"]: s for s in json.loads(out)["Submitters"]}
    assert float(subs[BOB]["WeightedAccumulatedUsage"]) > 0
    assert ALICE not in subs or not float(subs[ALICE]["WeightedAccumulatedUsage"] or 0)
    # the full daemon name works too; an unknown negotiator is an error naming the known ones
    rc, full, _ = _userprio(capsys, home, "-name", f"gpu@{CM}", "-allusers")
    assert rc == 0 and full == gpu_out
    rc, _out, err = _userprio(capsys, home, "-name", "tpu")
    assert rc == 2 and "tpu" in err and "gpu" in err and "cpu" in err
    assert err.startswith("poolledger userprio: -name: ")


# --- admin commands name their negotiator ------------------------------------------------------

def test_admin_command_for_one_negotiator_only(tmp_path: Path) -> None:
    doc = _doc(actions=[
        {"at": "10m", "kind": "userprio", "op": "setfactor", "target": ALICE, "value": 50,
         "negotiator": "gpu"},
        {"at": "10m", "kind": "userprio", "op": "setfactor", "target": BOB, "value": 20}])
    _loop, result = run(tmp_path, doc, hours=0.5)
    gpu, cpu = result.negotiators[f"gpu@{CM}"], result.negotiators[f"cpu@{CM}"]
    now = result.end
    assert float(gpu.priorities(now)[ALICE]["PriorityFactor"]) == 50
    assert ALICE not in cpu.priorities(now) or \
        float(cpu.priorities(now)[ALICE]["PriorityFactor"]) != 50
    # a command naming no negotiator applies to every one
    assert float(gpu.priorities(now)[BOB]["PriorityFactor"]) == 20
    assert float(cpu.priorities(now)[BOB]["PriorityFactor"]) == 20


def test_admin_source_convention() -> None:
    assert admin_source("userprio@h", "gpu") == "userprio@h/gpu"
    assert admin_source("userprio@h", None) == "userprio@h"
    assert admin_negotiator("userprio@h/gpu") == "gpu"
    assert admin_negotiator("userprio@h") is None
    flt = ShardFilter(Shard("gpu", GPU))
    cmd = AdminCommanded("setfactor", ALICE, 5.0)
    assert flt.accepts(make_event(cmd, ts=1.0, source="userprio@h/gpu", seq=1))
    assert not flt.accepts(make_event(cmd, ts=1.0, source="userprio@h/cpu", seq=2))
    assert flt.accepts(make_event(cmd, ts=1.0, source="userprio@h", seq=3))


def test_slot_leaving_the_shard_is_invalidated_in_it() -> None:
    flt = ShardFilter(Shard("gpu", GPU))

    def ad(gpus: int, seq: int) -> Envelope:
        return make_event(AdUpdated("Machine", "slot1@h", {"MyType": "Machine", "TotalGPUs": gpus}),
                          ts=float(seq), source="startd@h", seq=seq)

    assert flt.route(ad(1, 1)) is not None and "slot1@h" in flt.slots
    gone = flt.route(ad(0, 2))
    assert gone is not None and gone.type == "ad.invalidated" and gone.id == "startd@h:2"
    assert flt.route(ad(0, 3)) is None and not flt.slots


def test_scenario_negotiators_section_expands_into_knobs() -> None:
    doc = _doc()
    doc["pool"] = {"duration": "1h"}
    sc = parse_scenario(doc, "s.toml")
    assert sc.config["NEGOTIATOR_NAMES"] == "gpu, cpu"
    assert shards_from_config(sc.config) == [Shard("gpu", GPU), Shard("cpu", CPU)]
    bad = _doc(negotiators=[{"name": "gpu", "slot_constraint": "TotalGPUs >"}])
    bad["pool"] = {"duration": "1h"}
    with pytest.raises(ScenarioError):
        parse_scenario(bad, "s.toml")


def test_replay_and_audit_per_negotiator(sharded: tuple[Path, MainLoop, RunResult],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    home = sharded[0]
    assert main(["--home", str(home), "replay", "--negotiator", "gpu", "--json"]) == 0
    subs = {s["Name"]: s for s in json.loads(capsys.readouterr().out)["Submitters"]}
    assert float(subs[ALICE]["WeightedResourcesUsed"]) > 0
    assert BOB not in subs or not float(subs[BOB]["WeightedResourcesUsed"] or 0)
    assert main(["--home", str(home), "audit", ALICE, "--negotiator", "cpu"]) == 1
    assert "no record" in capsys.readouterr().err
    assert main(["--home", str(home), "audit", ALICE, "--negotiator", "gpu"]) == 0
    assert "Audit of alice@example.org" in capsys.readouterr().out
