"""condor_config semantics the simulated daemons rely on, and policy knobs changing at runtime."""
from __future__ import annotations

import os

import pytest

from schemas.errors import ConfigError
from schemas.settings import DaemonConfig
from tests.pool.test_states import SLOT, match, pool, rel


def test_macros_expand_recursively_and_case_insensitively() -> None:
    c = DaemonConfig({"start": "$(StateTimer) > 10 * $(minute)"})
    assert c.get("START") == "(time() - EnteredCurrentState) > 10 * 60"
    assert c.get("missing") is None and c.get("X", "d") == "d"
    assert DaemonConfig({"A": "$(UNDEFINED_THING)x"}).get("A") == "x"
    assert DaemonConfig({"A": "$(NOPE:7)"}).get("A") == "7"


def test_self_reference_means_the_layer_below() -> None:
    # seed 001's test-job policy, appended in a later config file
    c = DaemonConfig({"START": "KeyboardIdle > 900"}, {"START": '($(START)) || Owner == "coltrane"'})
    assert c.get("START") == '(KeyboardIdle > 900) || Owner == "coltrane"'
    c.set("START", "($(START)) && False")
    assert c.get("START") == '((KeyboardIdle > 900) || Owner == "coltrane") && False'


def test_cycles_and_bad_values_are_errors() -> None:
    with pytest.raises(ConfigError, match="cycle: A -> B -> A"):
        DaemonConfig({"A": "$(B)", "B": "$(A)"}).get("A")
    with pytest.raises(ConfigError) as err:
        DaemonConfig({"MATCH_TIMEOUT": "soon"}).number("MATCH_TIMEOUT", 120)
    assert err.value.knob == "MATCH_TIMEOUT" and err.value.source == "scenario"
    assert DaemonConfig({"X": "10 * $(MINUTE)"}).number("X", 0) == 600


def test_desktop_policy_owner_and_unclaimed_follow_start() -> None:
    # POLICY : Desktop: IS_OWNER = (START =?= False); START needs 15 idle minutes. The owner
    # types from 1000 s for 10 min: the slot is Owner at the next UPDATE_INTERVAL poll, and
    # Unclaimed again once KeyboardIdle passes StartIdleTime.
    sim = pool(config={"START": "KeyboardIdle > $(StartIdleTime)", "IS_OWNER": "(START =?= False)"},
               actions=[{"at": 1000, "kind": "owner_active", "machines": "*", "for": "10m"}])
    events = sim.advance_to(sim.scenario.start + 4000)
    seq = rel(sim, events)
    assert seq[:2] == [(0, "Owner", "Idle"), (0, "Unclaimed", "Idle")]
    assert seq[2] == (1000, "Owner", "Idle")  # owner activity is noticed at once
    assert seq[3][1:] == ("Unclaimed", "Idle") and 1600 + 900 < seq[3][0] <= 1600 + 900 + 300


def test_unscoped_job_attributes_fall_back_to_the_job() -> None:
    # seed 001: START = KeyboardIdle > 15 min || Owner == "coltrane" leaves the Owner state
    # (FALSE || UNDEFINED is UNDEFINED) and admits coltrane's jobs while the owner types
    sim = pool(config={"START": 'KeyboardIdle > $(StartIdleTime) || Owner == "coltrane"',
                       "IS_OWNER": "(START =?= False)"},
               users=("coltrane", "alice"),
               actions=[{"at": 0, "kind": "owner_active", "machines": "*", "for": "1h"}])
    events = sim.advance_to(sim.now)
    assert rel(sim, events)[-1] == (0, "Unclaimed", "Idle")
    events = match(sim, "2.0", "alice@example.org")
    assert rel(sim, events)[-1] == (0, "Unclaimed", "Idle")  # refused
    events = match(sim, "1.0", "coltrane@example.org")
    assert rel(sim, events)[-1] == (0, "Claimed", "Busy")


def test_vanilla_variant_wins_for_vanilla_jobs() -> None:
    sim = pool(config={"WANT_SUSPEND": True, "SUSPEND": "False", "SUSPEND_VANILLA": "$(KeyboardBusy)",
                       "CONTINUE": "False"},
               actions=[{"at": 100, "kind": "owner_active", "machines": "*", "for": "1h"}])
    sim.advance_to(sim.now)
    events = match(sim) + sim.advance_to(sim.scenario.start + 200)
    assert (100, "Claimed", "Suspended") in rel(sim, events)


def test_config_change_reaches_the_startds_and_the_log() -> None:
    sim = pool(actions=[{"at": 100, "kind": "config", "knob": "START", "value": "False", "by": "ops"}])
    events = sim.advance_to(sim.scenario.start + 100)
    changed = [e for e in events if e.type == "config.changed"]
    assert [(c.data.knob, c.data.value, c.data.by, c.source) for c in changed] == \
        [("START", "False", "ops", "admin@cm.example.org")]
    ad = sim.slot_ads()[0]
    assert ad["Start"] == "/Expr(false)/" and ad["Name"] == SLOT
    events = match(sim)
    assert rel(sim, events)[-1] == (100, "Unclaimed", "Idle")  # refused by the new START


def test_pool_config_is_on_the_log_at_start() -> None:
    sim = pool()
    sim.scenario.config  # noqa: B018 - the scenario has no [config]: nothing to emit
    assert [e for e in sim.advance_to(sim.now) if e.type == "config.changed"] == []


def test_negotiator_interval_follows_config_changes() -> None:
    sim = pool(actions=[{"at": 100, "kind": "config", "knob": "NEGOTIATOR_INTERVAL", "value": 300}])
    assert sim.config.number("NEGOTIATOR_INTERVAL") == 60
    sim.advance_to(sim.scenario.start + 100)
    assert sim.config.number("NEGOTIATOR_INTERVAL") == 300


def test_daemons_start_from_the_one_knob_table() -> None:
    from schemas.knobs import declared

    c = DaemonConfig()
    for knob in declared():
        if knob.default.strip():
            assert c.raw(knob.name) == knob.default, knob.name
        else:
            assert not c.defined(knob.name), knob.name  # an empty default is "detect", not set
    assert c.get("IS_OWNER") == "False"  # seed 001: dedicated machines never enter Owner
    assert c.number("HOUR") == 3600 and c.number("MachineMaxVacateTime") == 600
    assert c.boolean("CONSUMPTION_POLICY") is False and c.number("CLAIM_WORKLIFE") == 1200
    sim = pool()
    for host, startd in sim.startds.items():  # UID_DOMAIN's default is $(FULL_HOSTNAME): each its own
        assert startd.config.get("FULL_HOSTNAME") == host
        assert startd.config.get("UID_DOMAIN") == sim.scenario.uid_domain  # the scenario's, as before


def test_consumption_knobs_are_declared_with_htcondors_defaults(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # param_info.in's defaults, which a consumption policy leaving one out consumes by; every
    # spelling of the policy (per slot type, per custom resource) is a knob, not "unknown knob"
    from services.cli import main
    for var in [v for v in os.environ if v.startswith("POOLLEDGER_")]:
        monkeypatch.delenv(var)
    assert main(["config", "show", "CONSUMPTION_CPUS", "CONSUMPTION_MEMORY", "CONSUMPTION_DISK"]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if " = " in line] == [
        "CONSUMPTION_CPUS = quantize(target.RequestCpus, {1})",
        "CONSUMPTION_MEMORY = quantize(target.RequestMemory, {128})",
        "CONSUMPTION_DISK = quantize(target.RequestDisk, {1024})"]
    assert main(["--set", "SLOT_TYPE_2_CONSUMPTION_POLICY=True", "--set", "CONSUMPTION_GPUS=1",
                 "--set", "SLOT_TYPE_2_CONSUMPTION_MEMORY=TARGET.RequestMemory",
                 "config", "show", "SLOT_TYPE_2_CONSUMPTION_POLICY"]) == 0
    assert capsys.readouterr().out.startswith("SLOT_TYPE_2_CONSUMPTION_POLICY = True\n")
