"""The fold is pure (issue 10, reproduction 8): ClassAd `time()` reads the event time in the
folds and the cycle's `now` in the negotiator, never the wall clock; nondeterministic knob
values are refused naming the knob; `$ENV()` is resolved by the issuer, never by a fold."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from streams.core.errors import EventRejectedError

from schemas.classads import at_time, evaluate
from schemas.config import resolve_env
from schemas.errors import ConfigError
from schemas.events import AdUpdated, ConfigChanged, JobSubmitted, make_event
from schemas.settings import load_settings
from services.negotiator.service import JobAds, run_cycle
from streams.core.ledger import Ledger
from streams.core.collector import pool_size
from tests.negotiator.ads import job, slot

T0 = 1_763_800_000.0
WEIGHT = "Cpus + (time() % 7)"


def _slot_updates() -> list:  # type: ignore[type-arg]
    """Seven 2-core slots whose updates lie one second apart: int(ts) % 7 runs through 0..6."""
    base = int(T0) - int(T0) % 7
    return [make_event(AdUpdated("Machine", f"slot1@ep{i}", {**slot(i), "Cpus": 2}),
                       ts=float(base + i), source=f"startd@ep{i}", seq=1) for i in range(7)]


def test_slot_weight_with_time_folds_at_event_time_identically_twice() -> None:
    settings = load_settings(config_path=[], env={}, overrides={"SLOT_WEIGHT": WEIGHT})
    events = _slot_updates()
    first = Ledger(settings)
    for env in events:
        first.apply(env)
    time.sleep(1.1)  # a wall-clock time() would now give other remainders
    second = Ledger(settings)
    for env in events:
        second.apply(env)
    assert first.to_json() == second.to_json()
    expected = sum(2 + int(e.ts) % 7 for e in events)  # evaluation at each event's time
    assert pool_size(first.pool) == expected == 7 * 2 + 21
    assert [evaluate(WEIGHT, e.data.ad, now=e.ts) for e in events] == [2 + k for k in range(7)]


def test_slot_weight_from_a_config_changed_is_evaluated_at_its_event_time() -> None:
    events = _slot_updates()
    change_at = events[-1].ts + 3  # int % 7 == 2 + 7*0 ... whatever it is, the same for all
    events.append(make_event(ConfigChanged("SLOT_WEIGHT", WEIGHT, "admin"), ts=change_at,
                             source="admin@cm", seq=1))
    led = Ledger(load_settings(config_path=[], env={}))
    for env in events:
        led.apply(env)
    assert led.knobs == {"SLOT_WEIGHT": WEIGHT}  # applied, not refused
    assert pool_size(led.pool) == 7 * (2 + int(change_at) % 7)


def test_negotiator_evaluates_time_at_the_cycles_now() -> None:
    """A job that may start only before a date between the cycle's `now` and today's wall
    clock: judged at the cycle's now it matches; judged by the wall clock it never would."""
    deadline = int(T0) + 3600
    assert deadline < time.time()
    ledger = Ledger(load_settings(config_path=[], env={}))
    ads = JobAds()
    ad = job(1, Requirements=f"/Expr(time() < {deadline} && TARGET.Memory >= RequestMemory)/")
    events = [make_event(AdUpdated("Machine", "slot1@host1.example.org", slot(1)), ts=T0,
                         source="startd@host1", seq=1),
              make_event(JobSubmitted("1.0", "schedd@ap1", "alice@example.org", ad), ts=T0,
                         source="schedd@ap1", seq=1)]
    for env in events:
        ledger.apply(env)  # the job-ad fold is the ledger's
    payloads = run_cycle(ledger, None, T0 + 60, 1, job_ads=ads, clock=None)
    assert [p.TYPE for p in payloads].count("match") == 1
    late = run_cycle(ledger, None, deadline + 60.0, 2, job_ads=ads, clock=None)
    assert [p.TYPE for p in late].count("match") == 0  # now past the job's deadline


def test_one_rewrite_for_every_evaluator() -> None:
    assert at_time("Cpus + (TIME( ) % 7)", 1000.9) == "Cpus + (1000 % 7)"
    assert at_time("time() - EnteredCurrentState", "CurrentTime") == \
        "CurrentTime - EnteredCurrentState"
    assert at_time("Cpus", 5.0) == "Cpus"
    from schemas.classads import evaluate_policy  # the simulated daemons' evaluator uses it too

    assert evaluate_policy("time() % 7", {}, None, 1000) == 1000 % 7


@pytest.mark.parametrize("knob, value, word", [
    ("SLOT_WEIGHT", "Cpus + random(3)", "random()"),
    ("GROUP_SORT_EXPR", "Random() * 2", "random()"),
    ("PRIORITY_HALFLIFE", "$RANDOM_INTEGER(1, 10)", "$RANDOM_INTEGER()"),
    ("NEGOTIATOR_INTERVAL", "$RANDOM_CHOICE(10, 20)", "$RANDOM_CHOICE()"),
])
def test_nondeterministic_knob_values_are_refused_naming_the_knob(
        tmp_path: Path, knob: str, value: str, word: str) -> None:
    conf = tmp_path / "condor_config"
    conf.write_text(f"{knob} = {value}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(config_path=str(conf), env={})
    assert err.value.knob == knob and word in str(err.value) and "nondeterministic" in str(err.value)
    res = subprocess.run([sys.executable, "-m", "services.cli", "--config", str(conf), "config",
                          "show", knob], capture_output=True, text=True)
    assert res.returncode == 2 and knob in res.stderr and f"{conf}:1" in res.stderr


def test_config_changed_values_must_be_deterministic_and_env_free() -> None:
    settings = load_settings(config_path=[], env={})
    for value, word in (("random() > 0.5", "random()"), ("$ENV(HALFLIFE)", "$ENV()")):
        with pytest.raises(ConfigError) as err:
            settings.with_overrides({"START": value})
        assert err.value.knob == "START" and word in str(err.value)
    # the fold refuses it, so the folding process's environment never matters
    # (rejected: the runners dead-letter it with this reason)
    led = Ledger(settings)
    with pytest.raises(EventRejectedError, match=r"\$ENV\(\)"):
        led.apply(make_event(ConfigChanged("PRIORITY_HALFLIFE", "$ENV(HALFLIFE)", "admin"),
                             ts=T0, source="admin@cm", seq=1))
    assert "PRIORITY_HALFLIFE" not in led.knobs and led.rejected == 1 and led.applied == 0
    assert led.acct_cfg.priority_halflife == 86400.0


def test_env_is_resolved_when_the_scenario_issues_its_config(tmp_path: Path) -> None:
    assert resolve_env("$ENV(HL) * 2 + $(X)", {"HL": "3600"}) == "3600 * 2 + $(X)"
    src = (Path(__file__).resolve().parents[1] / "scenarios" / "small.toml").read_text()
    scen = tmp_path / "env.toml"
    scen.write_text(src.replace("[config]\n", "[config]\nPRIORITY_HALFLIFE = \"$ENV(PL_HL)\"\n", 1))
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "services.cli", "run", str(scen), "--hours", "1",
                          "--out", str(out), "--quiet"], capture_output=True, text=True,
                         env={**__import__("os").environ, "PL_HL": "7200"})
    assert res.returncode == 0, res.stderr
    import json

    changes = [json.loads(line)["data"] for line in (out / "events.jsonl").read_text().splitlines()
               if '"config.changed"' in line]
    halflife = [c for c in changes if c["knob"] == "PRIORITY_HALFLIFE"]
    assert halflife == [{"knob": "PRIORITY_HALFLIFE", "value": "7200", "by": "scenario",
                         "claimed_by": ""}]  # v2 (issue 28): no import, no claim
