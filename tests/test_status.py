"""`poolledger status` (issue 15 item 6): condor_status's layouts over the collector fold of a
log the simulated pool wrote: one 4-core partitionable machine running two 1-core jobs of
alice, one static-slot desktop in the Backfill state, and a drained machine."""
from __future__ import annotations

from pathlib import Path

import orjson

from tests.pool.helpers import run, sim_of
from tests.test_cli import cli


def pool_log(path: Path) -> Path:
    sim = sim_of({"pool": {"duration": "10m"},
                  "machines": [{"name": "ep1.example.org", "cpus": 4, "memory": 8192},
                               {"name": "desk.example.org", "cpus": 1, "config": {
                                   "NUM_SLOTS": 1, "ENABLE_BACKFILL": True, "START_BACKFILL": True}},
                               {"name": "old.example.org", "cpus": 2, "config": {"NUM_SLOTS": 2}}],
                  "submitters": [{"user": "alice", "jobs": [
                      {"arrival": {"kind": "batch", "count": 2}, "duration": "1h",
                       "requirements": 'TARGET.Machine == "ep1.example.org"'}]}],
                  "actions": [{"at": 1, "kind": "drain", "machines": "old.example.org"}]})
    events = run(sim, interval=60)
    path.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in events))
    return path


def test_default_layout_and_summary(tmp_path: Path) -> None:
    log = pool_log(tmp_path / "pool.jsonl")
    res = cli(tmp_path, "status", "--log", str(log))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["Name", "OpSys", "Arch", "State", "Activity", "LoadAv", "Mem",
                                "ActvtyTime"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:7]}
    assert rows["slot1@desk.example.org"][:4] == ["LINUX", "X86_64", "Backfill", "Busy"]
    assert rows["slot1@ep1.example.org"][2:5] == ["Unclaimed", "Idle", "0.000"]
    assert rows["slot1_1@ep1.example.org"][2:6] == ["Claimed", "Busy", "1.000", "128"]
    assert rows["slot1@old.example.org"][2:4] == ["Drained", "Idle"]
    # slots by machine, then name (condor_status's order)
    assert [line.split()[0] for line in lines[2:8]] == [
        "slot1@desk.example.org", "slot1@ep1.example.org", "slot1_1@ep1.example.org",
        "slot1_2@ep1.example.org", "slot1@old.example.org", "slot2@old.example.org"]
    total = cli(tmp_path, "status", "-total", "--log", str(log)).stdout.splitlines()
    assert total[0].split() == ["Total", "Owner", "Claimed", "Unclaimed", "Matched", "Preempting",
                                "Drain", "Backfill", "BkIdle"]
    assert total[-1].split() == ["Total", "6", "0", "2", "1", "0", "0", "2", "1", "0"]


def test_schedd_submitters_negotiator_any(tmp_path: Path) -> None:
    log = pool_log(tmp_path / "pool.jsonl")
    schedd = cli(tmp_path, "status", "-schedd", "--log", str(log)).stdout.splitlines()
    assert schedd[2].split() == ["ap1.example.org", "ap1.example.org", "2", "0", "0"]
    assert schedd[-1].split() == ["Total", "2", "0", "0"]
    subs = cli(tmp_path, "status", "-submitters", "--log", str(log)).stdout.splitlines()
    assert subs[2].split() == ["alice@example.org", "ap1.example.org", "2", "0", "0"]
    assert subs[-1].split() == ["Total", "2", "0", "0"]
    kinds = cli(tmp_path, "status", "-any", "-af", "MyType", "--log", str(log)).stdout.split()
    assert set(kinds) == {"Machine", "Scheduler", "Submitter"}


def test_long_autoformat_and_constraint(tmp_path: Path) -> None:
    log = pool_log(tmp_path / "pool.jsonl")
    res = cli(tmp_path, "status", "-af", "Name", "Cpus", "RemoteUser", "-constraint",
              "State == \"Claimed\"", "--log", str(log))
    assert res.stdout.splitlines() == ["slot1_1@ep1.example.org 1 alice@example.org",
                                       "slot1_2@ep1.example.org 1 alice@example.org"]
    res = cli(tmp_path, "status", "-af", "Name", "NoSuchAttr", "-constraint", "Draining",
              "--log", str(log))
    assert res.stdout.splitlines() == ["slot1@old.example.org undefined",
                                       "slot2@old.example.org undefined"]
    long = cli(tmp_path, "status", "-l", "-constraint", 'Name == "slot1@desk.example.org"',
               "--log", str(log)).stdout.splitlines()
    assert 'State = "Backfill"' in long and 'Name = "slot1@desk.example.org"' in long


def test_a_bad_constraint_is_one_line_and_exit_2(tmp_path: Path) -> None:
    log = pool_log(tmp_path / "pool.jsonl")
    res = cli(tmp_path, "status", "-constraint", "Cpus >", "--log", str(log))
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
    assert "-constraint 'Cpus >'" in res.stderr and "Traceback" not in res.stderr


def test_updates_stats_counts_lost_updates_from_sequence_numbers(tmp_path: Path) -> None:
    from schemas.events import AdUpdated, make_event
    from tests.test_cli import T0

    name = "vm4@ep1.example.org"
    ad: dict[str, object] = {"Name": name, "MyType": "Machine", "Machine": "ep1.example.org",
          "Cpus": 1, "State": "Unclaimed", "Activity": "Idle"}
    # the startd sent updates 1..10 but the log holds 1, 2, 3, 5, 6, 7, 9, 10: two were lost
    evs = [make_event(AdUpdated("Machine", name, ad), ts=T0 + 60 * s,
                      source="startd@ep1.example.org", seq=s) for s in (1, 2, 3, 5, 6, 7, 9, 10)]
    log = tmp_path / "lost.jsonl"
    log.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in evs))
    res = cli(tmp_path, "updates-stats", "--log", str(log))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["*** Name/Machine = 'vm4@ep1.example.org' MyType = 'Machine' ***",
                                       " Type: Main",
                                       "   Stats: Total=10, Seq=8, Lost=2 (20.00%)"]
