"""Every configured group, at any time (issue 15): a log of slot ads and group knobs, with no
negotiation cycle yet, still shows every group of GROUP_NAMES with its quotas, computed for
the log's last event and said so (seed 000's 20/10 on 30 slots and 0.66/0.33 of 15)."""
from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from schemas.events import AdUpdated, ConfigChanged, make_event
from tests.test_cli import T0, cli

STATIC = [("GROUP_NAMES", "group_physics, group_chemistry"),
          ("GROUP_QUOTA_group_physics", "20"), ("GROUP_QUOTA_group_chemistry", "10")]
DYNAMIC = [("GROUP_NAMES", "group_physics, group_chemistry"),
           ("GROUP_QUOTA_DYNAMIC_group_physics", "0.66"),
           ("GROUP_QUOTA_DYNAMIC_group_chemistry", "0.33")]


def slots_and_knobs(path: Path, knobs: list[tuple[str, str]], slots: int) -> Path:
    evs = [make_event(ConfigChanged(k, v, "root"), ts=T0, source="admin", seq=i + 1)
           for i, (k, v) in enumerate(knobs)]
    for i in range(slots):
        name = f"slot1@ep{i}.example.org"
        evs.append(make_event(AdUpdated("Machine", name, {
            "Name": name, "MyType": "Machine", "Machine": f"ep{i}.example.org", "Cpus": 1,
            "Memory": 4096, "State": "Unclaimed", "Activity": "Idle"}),
            ts=T0 + 60, source=f"startd@ep{i}.example.org", seq=1))
    path.write_bytes(b"".join(orjson.dumps(e.to_dict()) + b"\n" for e in evs))
    return path


def test_userprio_quotas_lists_every_group_before_the_first_cycle(tmp_path: Path) -> None:
    log = slots_and_knobs(tmp_path / "static.jsonl", STATIC, 30)
    res = cli(tmp_path, "userprio", "-quotas", "--log", str(log))
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines()
            if line.startswith("group_")}
    # Effective, Config, Surplus, Subtree, Requested: nothing requested yet, yet the effective
    # quota is the one assigned, as condor_userprio shows it (issue 25 item 1: it was 0 here,
    # the allocation)
    assert rows == {"group_chemistry": ["10.00", "10.00", "no", "10.00", "0"],
                    "group_physics": ["20.00", "20.00", "no", "20.00", "0"]}
    assert "no negotiation cycle has computed the quotas" in res.stderr
    assert "computed for 2025-11-22T08:27:40Z" in res.stderr


@pytest.mark.parametrize("command", [("replay", "--json"), ("userprio", "--json")])
def test_json_lists_every_group_with_its_quotas(tmp_path: Path, command: tuple[str, str]) -> None:
    log = slots_and_knobs(tmp_path / "dynamic.jsonl", DYNAMIC, 15)
    res = cli(tmp_path, command[0], "--log", str(log), command[1])
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    groups = {g["Name"]: g for g in doc["Groups"]}
    assert set(groups) == {"<none>", "group_physics", "group_chemistry"}
    assert groups["<none>"]["SubtreeQuota"] == pytest.approx(15)  # the root: the whole pool
    assert groups["group_physics"]["SubtreeQuota"] == pytest.approx(0.66 * 15)
    assert groups["group_chemistry"]["SubtreeQuota"] == pytest.approx(0.33 * 15)
    assert groups["group_physics"]["ConfigQuota"] == pytest.approx(0.66)
    assert (groups["group_physics"]["SurplusPolicy"], groups["group_physics"]["Requested"]) == ("no", 0)
    # HTCondor's EffectiveQuota is the dynamic share assigned; nothing is allocated (no demand)
    assert groups["group_physics"]["EffectiveQuota"] == pytest.approx(0.66 * 15)
    assert groups["group_physics"]["GroupResourcesAllocated"] == 0
    assert doc["QuotasComputedAt"] == T0 + 60
