"""gangliad's metric language: every attribute of seed 000's list, over hand-made daemon ads
(exact numbers), and the default metric set over a simulated run (fast path == classad2)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from ganglia.errors import MetricConfigError
from ganglia.families import SNAKE_CASE
from ganglia.gangliad import Gangliad
from ganglia.graphite import graphite_path
from ganglia.metrics import Evaluator, GangliadConfig, load_metrics, parse_metrics
from schemas.settings import load_settings
from streams.core.collector import current_ads
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.topics import EVENTS
from tests.ganglia.helpers import evaluations, simulate

SCHEDD = {"MyType": "Scheduler", "Name": "ap1.example.org", "Machine": "ap1.example.org",
          "MyAddress": "<10.0.0.5:9618>", "TotalRunningJobs": 7, "TotalIdleJobs": 3,
          "TotalHeldJobs": 1, "MaxJobsRunning": 20, "Owner_alice_Bytes": 10, "Owner_bob_Bytes": 32}
SCHEDD2 = {"MyType": "Scheduler", "Name": "schedd2@ap2.example.org", "Machine": "ap2.example.org",
           "TotalRunningJobs": 5, "TotalIdleJobs": 0, "TotalHeldJobs": 0, "MaxJobsRunning": 10}
SLOT1 = {"MyType": "Machine", "Name": "slot1@ep1.example.org", "Machine": "ep1.example.org",
         "SlotID": 1, "TotalCpus": 8, "TotalMemory": 2048, "State": "Claimed", "Cpus": 8}
SLOT2 = {"MyType": "Machine", "Name": "slot2@ep1.example.org", "Machine": "ep1.example.org",
         "SlotID": 2, "TotalCpus": 8, "TotalMemory": 2048, "State": "Unclaimed", "Cpus": 1}
DYN1 = {"MyType": "Machine", "Name": "slot1_1@ep2.example.org", "Machine": "ep2.example.org",
        "SlotID": 1, "DynamicSlot": True, "TotalCpus": 4, "State": "Claimed", "Cpus": 2}
SUBMITTER = {"MyType": "Submitter", "Name": "group_a.alice@example.org",
             "ScheddName": "ap1.example.org", "RunningJobs": 4, "IdleJobs": 2}
NEGOTIATOR = {"MyType": "Negotiator", "Name": "negotiator@cm.example.org", "Machine": "cm.example.org",
              "LastNegotiationCycleMatches0": 12, "ConcurrencyLimit_xsw": 3.0,
              "ConcurrencyLimit_db_small": 1.0}
COLLECTOR = {"MyType": "Collector", "Name": "collector@cm.example.org", "Machine": "cm.example.org",
             "HostsTotal": 3}
ADS = [("Scheduler", SCHEDD), ("Scheduler", SCHEDD2), ("Machine", SLOT1), ("Machine", SLOT2),
       ("Machine", DYN1), ("Submitter", SUBMITTER), ("Negotiator", NEGOTIATOR),
       ("Collector", COLLECTOR)]


def run(text: str, ads: list[tuple[str, dict[str, Any]]] = ADS, **cfg: Any) -> Any:
    defs, problems = parse_metrics(text, "m.conf")
    assert not problems, problems
    fast = Evaluator(defs, GangliadConfig(**cfg)).evaluate(ads, 60.0, "cm.example.org")
    naive = Evaluator(defs, GangliadConfig(**cfg), fast=False).evaluate(ads, 60.0, "cm.example.org")
    assert fast.metrics == naive.metrics and fast.warnings == naive.warnings
    return fast


def one(ev: Any, name: str, machine: str | None = None) -> Any:
    found = ev.by_name(name, machine)
    assert len(found) == 1, (name, machine, [(m.name, m.machine) for m in ev.metrics])
    return found[0]


def test_value_defaults_to_the_attribute_named_and_type_is_inferred() -> None:
    ev = run('[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; ]'
             '[ Name = "Frac"; Value = TotalRunningJobs / real(MaxJobsRunning); TargetType = "Scheduler"; ]'
             '[ Name = "Full"; Value = TotalIdleJobs == 0; TargetType = "Scheduler"; ]'
             '[ Name = "Who"; Value = Machine; TargetType = "Scheduler"; ]')
    m = one(ev, "TotalRunningJobs", "ap1.example.org")
    assert (m.value, m.type, m.group, m.title) == (7, "int32", "HTCondor Schedd", "TotalRunningJobs")
    assert (one(ev, "Frac", "ap1.example.org").value, one(ev, "Frac", "ap1.example.org").type) == (0.35, "float")
    full = one(ev, "Full", "schedd2@ap2.example.org")
    assert (full.value, full.type) == (1, "int8")  # booleans are published as int8 0/1
    assert one(ev, "Who", "ap1.example.org").type == "string"


def test_machine_and_ip_defaults() -> None:
    ev = run('[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; ]'
             '[ Name = "RunningJobs"; TargetType = "Submitter"; ]'
             '[ Name = "HostsTotal"; TargetType = "Collector"; ]')
    a = one(ev, "TotalRunningJobs", "ap1.example.org")
    assert a.ip == "10.0.0.5"  # from MyAddress of the daemons on that machine
    b = one(ev, "TotalRunningJobs", "schedd2@ap2.example.org")
    assert b.ip == "schedd2@ap2.example.org"  # a name@host daemon name is its own "IP"
    assert one(ev, "RunningJobs").machine == "ap1.example.org"  # a submitter's schedd
    assert one(ev, "HostsTotal").machine == "cm.example.org"  # the collector: its Machine


def test_target_type_slot1_any_and_lists() -> None:
    ev = run('[ Name = "TotalCpus"; TargetType = "Machine_slot1"; ]'
             '[ Name = "Slots"; Value = 1; Aggregate = "sum"; TargetType = "Machine"; ]'
             '[ Name = "Ads"; Value = 1; Aggregate = "SUM"; TargetType = "Any"; ]'
             '[ Name = "Two"; Value = 1; Aggregate = "sum"; TargetType = "Collector, Negotiator"; ]')
    cpus = ev.by_name("TotalCpus")
    # slot 1 only, never a dynamic slot, filed under the machine, not the slot
    assert [(m.machine, m.value) for m in cpus] == [("ep1.example.org", 8)]
    assert one(ev, "Slots").value == 3
    assert one(ev, "Ads").value == len(ADS)
    assert one(ev, "Two").value == 2


def test_verbosity_above_gangliad_verbosity_is_skipped() -> None:
    text = ('[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; ]'
            '[ Name = "TotalIdleJobs"; Verbosity = 1; TargetType = "Scheduler"; ]'
            '[ Name = "TotalHeldJobs"; Verbosity = 2; TargetType = "Scheduler"; ]')
    assert {m.name for m in run(text).metrics} == {"TotalRunningJobs"}
    assert {m.name for m in run(text, verbosity=1).metrics} == {"TotalRunningJobs", "TotalIdleJobs"}


def test_requirements_and_gangliad_requirements() -> None:
    text = '[ Name = "TotalRunningJobs"; Requirements = TotalRunningJobs > 6; TargetType = "Scheduler"; ]'
    assert [m.machine for m in run(text).metrics] == ["ap1.example.org"]
    text = '[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; ]'
    assert [m.machine for m in run(text, requirements='Machine == "ap2.example.org"').metrics] == \
        ["schedd2@ap2.example.org"]


def test_regex_one_metric_per_matching_attribute_with_group_substitution() -> None:
    ev = run('[ Regex = "Owner_([^_]*)_Bytes"; Title = "\\\\1 bytes"; Desc = "bytes of \\\\1";'
             '  Value = Regex * 2; TargetType = "Scheduler"; ]'
             '[ Regex = "ConcurrencyLimit_(.+)"; Name = "Limit \\\\1"; PrometheusName = "in_use";'
             '  TargetType = "Negotiator"; ]')
    alice = one(ev, "Owner_alice_Bytes")
    assert (alice.value, alice.title, alice.desc) == (20, "alice bytes", "bytes of alice")
    assert one(ev, "Owner_bob_Bytes").value == 64
    limits = {m.name: (m.value, dict(m.labels)["match"]) for m in ev.metrics
              if m.family.name == "htcondor_in_use"}
    assert limits == {"Limit xsw": (3.0, "xsw"), "Limit db_small": (1.0, "db_small")}


def test_regex_is_anchored_at_the_start() -> None:
    ev = run('[ Regex = "Bytes"; TargetType = "Scheduler"; ]')
    assert ev.metrics == []


def test_aggregates_sum_avg_min_max_and_aggregate_group() -> None:
    ev = run('[ Name = "Jobs in Pool"; Value = TotalRunningJobs + TotalIdleJobs; Aggregate = "SUM"; TargetType = "Scheduler"; ]'
             '[ Name = "Avg"; Value = TotalRunningJobs; Aggregate = "avg"; Type = "float"; TargetType = "Scheduler"; ]'
             '[ Name = "Min"; Value = TotalRunningJobs; Aggregate = "min"; TargetType = "Scheduler"; ]'
             '[ Name = "Max"; Value = TotalRunningJobs; Aggregate = "max"; TargetType = "Scheduler"; ]'
             '[ Name = strcat(State, " Slots"); Value = 1; Aggregate = "sum"; TargetType = "Machine"; ]'
             '[ Name = strcat(Machine, " cpus"); Value = Cpus; Aggregate = "sum"; AggregateGroup = Machine;'
             '  Machine = Machine; TargetType = "Machine"; ]')
    jobs = one(ev, "Jobs in Pool")
    assert (jobs.value, jobs.machine, jobs.group, jobs.aggregate) == (15, "cm.example.org", "HTCondor Pool", True)
    assert one(ev, "Avg").value == 6.0
    assert (one(ev, "Min").value, one(ev, "Max").value) == (5, 7)
    assert (one(ev, "Claimed Slots").value, one(ev, "Unclaimed Slots").value) == (2, 1)
    per_machine = {m.machine: m.value for m in ev.metrics if m.name.endswith(" cpus")}
    assert per_machine == {"ep1.example.org": 9, "ep2.example.org": 2}


def test_scale_units_group_cluster_derivative_and_type() -> None:
    ev = run('[ Name = "TotalMemory"; Scale = 1048576; Type = "float"; Units = "bytes";'
             '  Group = "Mine"; Cluster = "c1"; Derivative = true; TargetType = "Machine_slot1"; ]'
             '[ Name = "TotalCpus"; Scale = 2; TargetType = "Machine_slot1"; ]')
    mem = one(ev, "TotalMemory")
    assert (mem.value, mem.type, mem.units, mem.group, mem.cluster, mem.derivative) == \
        (2048 * 1048576.0, "float", "bytes", "Mine", "c1", True)
    assert mem.text == "2.14748e+09"  # %g, as gangliad formats reals
    assert one(ev, "TotalCpus").value == 16


def test_tmax_dmax_and_lifetime() -> None:
    ev = run('[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; Requirements = Machine == "ap1.example.org"; ]'
             '[ Name = "TotalIdleJobs"; Lifetime = 300; TargetType = "Scheduler"; Requirements = Machine == "ap1.example.org"; ]',
             interval=60.0)
    a, b = one(ev, "TotalRunningJobs"), one(ev, "TotalIdleJobs")
    assert (a.tmax, a.dmax) == (120, 86400)  # TMAX = 2 x interval; DMAX = max(min lifetime, 3 TMAX)
    assert b.dmax == 300
    long = run('[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; ]', interval=20000.0)
    assert long.metrics[0].dmax == 120000


def test_per_execute_node_metrics_false_keeps_aggregates() -> None:
    text = ('[ Name = "TotalCpus"; TargetType = "Machine_slot1"; ]'
            '[ Name = "Cpus in Pool"; Value = TotalCpus; Aggregate = "sum"; TargetType = "Machine_slot1"; ]')
    ev = run(text, per_execute_node_metrics=False)
    assert [m.name for m in ev.metrics] == ["Cpus in Pool"]
    assert one(ev, "Cpus in Pool").value == 8


def test_a_value_that_fails_to_evaluate_is_skipped_with_a_counted_warning() -> None:
    ev = run('[ Name = "Bad"; Value = TotalRunningJobs / "x"; TargetType = "Scheduler"; ]'
             '[ Name = "Inf"; Value = real("inf"); TargetType = "Scheduler"; ]'
             '[ Name = "Missing"; Value = NoSuchAttribute; TargetType = "Scheduler"; ]'
             '[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; ]')
    assert {m.name for m in ev.metrics} == {"TotalRunningJobs"}
    counts: dict[str, int] = {}
    for key, n in ev.warnings.items():
        metric = key.split(": ", 1)[1].split(":")[0]
        counts[metric] = counts.get(metric, 0) + n
    assert counts == {"metric 'Bad'": 2, "metric 'Inf'": 2}  # one per schedd; absent is no error
    assert not any(isinstance(m.value, float) and not math.isfinite(m.value) for m in ev.metrics)


def test_malformed_metric_file_names_file_line_and_metric_and_keeps_the_others(tmp_path: Path) -> None:
    (tmp_path / "10_good").write_text('[ Name = "TotalRunningJobs"; TargetType = "Scheduler"; ]\n')
    (tmp_path / "20_bad").write_text(
        '[\n  Name = "Fine";\n  TargetType = "Scheduler";\n]\n'
        '[\n  Name = "Broken";\n  Value = TotalIdleJobs +;\n  TargetType = "Scheduler";\n]\n'
        '[ Name = "NoTarget"; ]\n'
        '[ Name = "BadAgg"; Aggregate = "median"; TargetType = "Scheduler"; ]\n')
    (tmp_path / ".hidden").write_text("garbage")
    defs, problems = load_metrics(tmp_path)
    assert [d.label for d in defs] == ["TotalRunningJobs", "Fine"]
    text = [str(p) for p in problems]
    assert len(text) == 3
    assert text[0].startswith(f"{tmp_path / '20_bad'}:7:") and "'Broken'" in text[0]
    assert text[1] == f"{tmp_path / '20_bad'}:10: metric 'NoTarget': no TargetType"
    assert text[2].startswith(f"{tmp_path / '20_bad'}:11: metric 'BadAgg': Aggregate 'median'")


def test_missing_metrics_dir_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(MetricConfigError, match="not a directory"):
        load_metrics(tmp_path / "nope")


def test_default_metrics_over_a_simulated_run(tmp_path: Path) -> None:
    log = simulate(tmp_path)
    evs, final, daemon = evaluations(log)
    # the fast path gives classad2's own answers for every interval of the run
    evs_naive, final_naive, _ = evaluations(log, fast=False)
    assert [e.metrics for e in evs] == [e.metrics for e in evs_naive]
    assert final.metrics == final_naive.metrics
    assert not final.warnings
    # boundaries are whole GANGLIAD_INTERVALs of event time
    assert all(e.at % 60 == 0 for e in evs) and len(evs) >= 39
    from streams.core.collector import current_ads
    schedds = current_ads(daemon.state, "Scheduler")
    running = sum(r.ad["TotalRunningJobs"] for r in schedds)
    idle = sum(r.ad["TotalIdleJobs"] for r in schedds)
    assert one(final, "Jobs in Pool").value == running + idle
    assert one(final, "Held Jobs in Pool").value == 2
    assert one(final, "Cpus in Pool").value == 3 * 2 + 8
    slots = [r for r in current_ads(daemon.state, "Machine")]
    assert one(final, "Pool Slot Count").value == len(slots)
    # a replay yields the same series
    again, _, _ = evaluations(log)
    assert [(e.at, e.metrics) for e in again] == [(e.at, e.metrics) for e in evs]


def test_default_metrics_file_covers_the_ground() -> None:
    defs, problems = load_metrics(None)
    assert not problems
    kinds = {t for d in defs for t in d.target_types}
    assert {"scheduler", "machine_slot1", "machine", "negotiator", "submitter", "accounting",
            "collector"} <= kinds
    labels = {d.label for d in defs}
    assert {"Jobs in Pool", "Cpus in Pool", "Pool Slot Count", "LastNegotiationCycleDuration0",
            "LastNegotiationCycleMatches0", "LastNegotiationCycleRejections0",
            "LastNegotiationCycleNumSchedulers0"} <= labels
    assert any(d.has("regex") for d in defs) and any(d.verbosity > 0 for d in defs)


def test_duplicated_and_out_of_order_events_give_the_same_series(tmp_path: Path) -> None:
    from ganglia.gangliad import Gangliad
    from schemas.settings import load_settings
    from streams.log.embedded import EmbeddedLog
    from streams.log.events import EventLog
    from streams.log.topics import EVENTS

    log_dir = simulate(tmp_path)
    want, final, _ = evaluations(log_dir)
    source = EmbeddedLog(log_dir)
    try:
        events = [env for _rec, env in EventLog(source).read(EVENTS)]
    finally:
        source.close()
    settings = load_settings()
    defs, _ = load_metrics(None)
    daemon = Gangliad(defs, GangliadConfig.from_settings(settings), settings)
    got = []
    for i, env in enumerate(events):
        got += daemon.feed(env)
        if i % 7 == 0:
            got += daemon.feed(env)  # redelivered
            got += daemon.feed(events[max(0, i - 50)])  # an old one again, out of order
    assert [(e.at, e.metrics) for e in got] == [(e.at, e.metrics) for e in want]
    end = daemon.flush()
    assert end is not None and end.metrics == final.metrics


# --------------------------------------------------------------------------- Prometheus families

def _collector_updates_after_the_first_dropped(log_dir: Path) -> list[Any]:
    """The run's events without the Collector's later updates: its one ad expires after
    CLASSAD_LIFETIME, as a pool's does when the collector stops forwarding its own ad."""
    source = EmbeddedLog(log_dir)
    try:
        events = [env for _rec, env in EventLog(source).read(EVENTS)]
    finally:
        source.close()
    out, seen = [], False
    for env in events:
        if getattr(env.data, "ad_type", None) == "Collector":
            if seen:
                continue
            seen = True
        out.append(env)
    return out


def _fold(events: list[Any], **knobs: Any) -> list[Any]:
    settings = load_settings(overrides={k: str(v) for k, v in knobs.items()}) if knobs else load_settings()
    defs, _ = load_metrics(None)
    daemon = Gangliad(defs, GangliadConfig.from_settings(settings), settings)
    evs = [ev for env in events for ev in daemon.feed(env)]
    final = daemon.flush()
    assert final is not None
    return [*evs, final]


def test_pool_aggregates_keep_the_collectors_host_when_its_ad_is_gone(tmp_path: Path) -> None:
    events = _collector_updates_after_the_first_dropped(simulate(tmp_path))
    settings = load_settings()
    defs, _ = load_metrics(None)
    daemon = Gangliad(defs, GangliadConfig.from_settings(settings), settings)
    evs, without = [], 0
    for env in events:
        for ev in daemon.feed(env):
            evs.append(ev)
            without += not current_ads(daemon.state, "Collector")
    assert without >= 20  # most evaluations see no Collector ad (it expired after 900 s)
    aggregates = [m for ev in evs for m in ev.metrics if m.aggregate]
    assert {m.machine for m in aggregates} == {"cm.example.org"}
    assert {graphite_path(m, "htcondor") for m in aggregates if m.name == "Jobs in Pool"} == \
        {"htcondor.cm_example_org.Jobs_in_Pool"}
    # every family has one label set over the whole run: no series split
    label_sets: dict[str, set[tuple[str, ...]]] = {}
    for ev in evs:
        for m in ev.metrics:
            label_sets.setdefault(m.family.name, set()).add(tuple(k for k, _ in m.labels))
    assert {name for name, sets in label_sets.items() if len(sets) > 1} == set()
    assert label_sets["htcondor_pool_jobs"] == {("machine",)}
    assert label_sets["htcondor_group_running_jobs"] == {("group", "machine")}


def test_collector_host_names_the_aggregates_from_the_first_evaluation(tmp_path: Path) -> None:
    events = [env for env in _collector_updates_after_the_first_dropped(simulate(tmp_path))
              if getattr(env.data, "ad_type", None) != "Collector"]
    plain = _fold(events)
    assert {m.machine for ev in plain for m in ev.metrics if m.aggregate} == {"localhost"}  # never known
    pinned = _fold(events, COLLECTOR_HOST="cm.example.org:9618")
    assert {m.machine for ev in pinned for m in ev.metrics if m.aggregate} == {"cm.example.org"}


def test_families_follow_prometheus_naming_and_machine_is_the_host(tmp_path: Path) -> None:
    evs, final, daemon = evaluations(simulate(tmp_path))
    hosts = {r.ad["Machine"] for r in current_ads(daemon.state) if isinstance(r.ad.get("Machine"), str)}
    families: dict[str, Any] = {}
    for ev in [*evs, final]:
        for m in ev.metrics:
            families.setdefault(m.family.name, m.family)
            assert dict(m.labels)["machine"] in hosts | {"cm.example.org"}, (m.name, m.labels)
            assert families[m.family.name] == m.family  # one type and HELP per family
    assert all(SNAKE_CASE.match(n) and n.startswith("htcondor_") for n in families)
    assert all((f.kind == "counter") == n.endswith("_total") for n, f in families.items())
    assert {n for n, f in families.items() if f.kind == "counter"} == {
        "htcondor_schedd_jobs_submitted_total", "htcondor_schedd_jobs_started_total",
        "htcondor_schedd_jobs_completed_total"}
    memory = families["htcondor_pool_memory_bytes"]
    assert (memory.unit, memory.factor) == ("bytes", 1.0)
    assert families["htcondor_negotiator_last_cycle_duration_seconds"].unit == "seconds"
    # the HELP of a per-submitter family names no submitter
    names = {v for ev in evs for m in ev.metrics for k, v in m.labels if k in ("submitter", "group", "schedd")}
    for f in families.values():
        assert f.help and not [n for n in names if n in f.help], (f.name, f.help)
    assert families["htcondor_group_effective_quota"].help == "Effective quota of an accounting group"
    # the Ganglia names stay gangliad's
    assert {"Jobs in Pool", "Memory in Pool", "TotalRunningJobs", "alice@example.org-RunningJobs"} <= \
        {m.name for m in final.metrics}


def test_prometheus_attributes_defaults_and_errors() -> None:
    ev = run('[ Name = "Memory in Pool"; Value = TotalMemory; Aggregate = "SUM"; Units = "bytes";'
             '  Scale = 1048576; Type = "float"; TargetType = "Machine_slot1"; ]'
             '[ Name = "JobsCompleted"; Value = 3; Derivative = true; TargetType = "Scheduler"; ]'
             '[ Name = "Frac"; Value = 0.5; Scale = 100; Units = "%"; Type = "float"; TargetType = "Scheduler"; ]'
             '[ Name = strcat(Name, "-RunningJobs"); Value = RunningJobs; PrometheusName = "submitter_jobs";'
             '  PrometheusLabel_kind = "running"; Desc = strcat("jobs of ", Name); TargetType = "Submitter"; ]')
    hosts = run('[ Name = "HostsTotal"; TargetType = "Collector"; ]').metrics[0].family
    assert (hosts.name, hosts.kind) == ("htcondor_total_hosts", "gauge")  # `_total` is a counter's
    mem = one(ev, "Memory in Pool")
    assert (mem.family.name, mem.family.kind, mem.family.unit) == ("htcondor_memory_in_pool_bytes", "gauge", "bytes")
    done = ev.by_name("JobsCompleted")[0].family
    assert (done.name, done.kind) == ("htcondor_jobs_completed_total", "counter")  # Derivative: a counter
    frac = ev.by_name("Frac")[0]
    assert (frac.family.name, frac.family.factor, frac.value) == ("htcondor_frac_ratio", 0.01, 50.0)
    sub = one(ev, "group_a.alice@example.org-RunningJobs")
    assert sub.family.name == "htcondor_submitter_jobs" and dict(sub.labels)["kind"] == "running"
    assert sub.family.help == "condor_gangliad metric submitter_jobs"  # Desc names the submitter
    for bad, why in (('PrometheusName = "JobsInPool";', "snake_case"),
                     ('PrometheusName = strcat("x", Name);', "string literal"),
                     ('PrometheusType = "histogram";', "PrometheusType"),
                     ('PrometheusName = "x_total";', "only a counter"),
                     ('PrometheusHelp = Name;', "PrometheusHelp"),
                     ('PrometheusLabel_machine = Name;', "machine")):
        _, problems = parse_metrics(f'[ Name = "X"; {bad} TargetType = "Scheduler"; ]', "m.conf")
        assert len(problems) == 1 and why in str(problems[0]) and "m.conf:1" in str(problems[0]), (bad, problems)


def test_a_family_keeps_one_help_type_and_unit_across_files(tmp_path: Path) -> None:
    """Two metrics naming one Prometheus family with another HELP (or type): the later is
    skipped with a problem naming both places, never published under the first's HELP."""
    from ganglia.metrics import load_metrics

    (tmp_path / "10_a").write_text('[ Name = "A"; Value = 1; PrometheusName = "pool_things";'
                                   ' PrometheusHelp = "Things in the pool"; TargetType = "Scheduler"; ]\n')
    (tmp_path / "20_b").write_text('[ Name = "B"; Value = 2; PrometheusName = "pool_things";'
                                   ' PrometheusHelp = "Other things"; TargetType = "Scheduler"; ]\n'
                                   '[ Name = "C"; Value = 3; PrometheusName = "pool_things";'
                                   ' PrometheusHelp = "Things in the pool"; TargetType = "Scheduler"; ]\n')
    defs, problems = load_metrics(tmp_path)
    assert [d.label for d in defs] == ["A", "C"]
    assert len(problems) == 1
    text = str(problems[0])
    assert "20_b:1" in text and "10_a:1" in text and "htcondor_pool_things" in text
