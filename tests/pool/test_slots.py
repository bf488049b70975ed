"""Slot layouts a startd builds from condor_config (seed 001, "Dividing System Resources")."""
from __future__ import annotations

import pytest

from schemas.settings import DaemonConfig
from services.pool.errors import ScenarioError, SlotConfigError
from services.pool.slots import detect, layout
from tests.pool.helpers import sim_of


def slots(knobs: dict[str, object], cpus: int = 4, memory: int = 256, disk: int = 1000,
          gpus: int = 0) -> list[dict[str, int]]:
    config = DaemonConfig(knobs)
    machine = detect(config, cpus=cpus, memory=memory, disk=disk, swap=1000, gpus=gpus)
    return [dict(s.resources, partitionable=int(s.partitionable), id=s.slot_id)
            for s in layout(config, machine)]


def test_num_slots_divides_evenly() -> None:
    out = slots({"NUM_SLOTS": 4}, cpus=8, memory=16384, disk=4000)
    assert [(s["id"], s["Cpus"], s["Memory"], s["Disk"]) for s in out] == \
        [(1, 2, 4096, 1000), (2, 2, 4096, 1000), (3, 2, 4096, 1000), (4, 2, 4096, 1000)]
    assert not any(s["partitionable"] for s in out)


def test_num_slots_cannot_exceed_cores() -> None:
    with pytest.raises(SlotConfigError) as err:
        slots({"NUM_SLOTS": 5}, cpus=4)
    assert err.value.knob == "NUM_SLOTS"


def test_default_is_one_partitionable_slot_of_everything() -> None:
    out = slots({}, cpus=8, memory=4096, disk=500)
    assert out == [{"Cpus": 8, "Memory": 4096, "Disk": 500, "Swap": 1000, "partitionable": 1, "id": 1}]


@pytest.mark.parametrize("definition", [
    "cpus=2, ram=128, swap=25%, disk=1/2",
    "cpus=1/2, memory=128, virt=25%, disk=50%",
    "c=1/2, m=50%, v=1/4, disk=1/2",
])
def test_seed_types_1_to_3_are_equivalent(definition: str) -> None:
    # seed 001: a machine with 4 cores and 256 MB of RAM
    out = slots({"SLOT_TYPE_1": definition, "NUM_SLOTS_TYPE_1": 1})
    assert (out[0]["Cpus"], out[0]["Memory"], out[0]["Swap"], out[0]["Disk"]) == (2, 128, 250, 500)


@pytest.mark.parametrize("definition", ["c=25%, m=64, v=1/4, d=25%", "25%", "1/4"])
def test_seed_types_4_to_6_are_equivalent(definition: str) -> None:
    out = slots({"SLOT_TYPE_1": definition, "NUM_SLOTS_TYPE_1": 1})
    assert (out[0]["Cpus"], out[0]["Memory"], out[0]["Swap"], out[0]["Disk"]) == (1, 64, 250, 250)


def test_memory_given_four_ways_is_the_same() -> None:
    # seed 001: with 128 MB of RAM, mem=64, 1/2, 50% all allocate 64 (auto: half, with 2 slots)
    for value in ("64", "1/2", "50%"):
        out = slots({"SLOT_TYPE_1": f"mem={value}", "NUM_SLOTS_TYPE_1": 2}, cpus=2, memory=128)
        assert [s["Memory"] for s in out] == [64, 64]
    out = slots({"SLOT_TYPE_1": "mem=auto", "NUM_SLOTS_TYPE_1": 2}, cpus=2, memory=128)
    assert [s["Memory"] for s in out] == [64, 64]


def test_auto_divides_what_explicit_shares_leave() -> None:
    # one slot takes 10% of the memory; three auto slots split the remaining 90%
    out = slots({"SLOT_TYPE_1": "cpus=1, mem=10%", "NUM_SLOTS_TYPE_1": 1,
                 "SLOT_TYPE_2": "cpus=1", "NUM_SLOTS_TYPE_2": 3}, cpus=4, memory=1000)
    assert [s["Memory"] for s in out] == [100, 300, 300, 300]
    assert [s["id"] for s in out] == [1, 2, 3, 4]


def test_blanket_value_covers_unlisted_resources() -> None:
    # seed 001: both definitions give 1 core, disk auto, everything else 50%
    a = slots({"SLOT_TYPE_1": "cpus=1, ram=1/2, swap=50%", "NUM_SLOTS_TYPE_1": 1})
    b = slots({"SLOT_TYPE_1": "cpus=1, disk=auto, 50%", "NUM_SLOTS_TYPE_1": 1})
    assert a == b == [{"Cpus": 1, "Memory": 128, "Swap": 500, "Disk": 1000, "partitionable": 0, "id": 1}]


def test_overcommitted_types_are_refused() -> None:
    with pytest.raises(SlotConfigError) as err:
        slots({"SLOT_TYPE_1": "75%", "NUM_SLOTS_TYPE_1": 2})
    assert err.value.knob == "SLOT_TYPE_1"
    with pytest.raises(SlotConfigError, match="unknown resource"):
        slots({"SLOT_TYPE_1": "bogons=2", "NUM_SLOTS_TYPE_1": 1})
    with pytest.raises(SlotConfigError, match="cannot read share"):
        slots({"SLOT_TYPE_1": "cpus=two", "NUM_SLOTS_TYPE_1": 1})


def test_custom_resources_seed_example() -> None:
    # seed 001: MACHINE_RESOURCE_Cogs; one partitionable slot with half of the Cogs and six
    # actuators, two static slots with a quarter of the Cogs and one actuator each
    out = slots({"MACHINE_RESOURCE_Cogs": 16, "MACHINE_RESOURCE_actuator": 8,
                 "SLOT_TYPE_1": "cogs=50%,actuator=6,50%", "NUM_SLOTS_TYPE_1": 1,
                 "SLOT_TYPE_1_PARTITIONABLE": True,
                 "SLOT_TYPE_2": "cogs=25%,actuator=1,25%", "NUM_SLOTS_TYPE_2": 2},
                cpus=8, memory=8000)
    assert [(s["Cogs"], s["Actuator"], s["Cpus"], s["Memory"], s["partitionable"]) for s in out] == \
        [(8, 6, 4, 4000, 1), (4, 1, 2, 2000, 0), (4, 1, 2, 2000, 0)]


def test_machine_resource_names_disables_unlisted() -> None:
    out = slots({"MACHINE_RESOURCE_Cogs": 4, "MACHINE_RESOURCE_Widgets": 2,
                 "MACHINE_RESOURCE_NAMES": "Cogs"})
    assert "Cogs" in out[0] and "Widgets" not in out[0]


def test_gpus_split_across_static_slots_with_ids() -> None:
    config = DaemonConfig({"NUM_SLOTS": 2})
    machine = detect(config, cpus=4, memory=4096, disk=100, gpus=2)
    out = layout(config, machine)
    assert [s.resources["GPUs"] for s in out] == [1, 1]
    assert [s.assigned["GPUs"] for s in out] == [("GPU-0",), ("GPU-1",)]


def test_gpu_constraint_by_id_picks_that_gpu() -> None:
    # seed 001's "@=slot" form: a static slot assigned a specific GPU by id
    config = DaemonConfig({"MACHINE_RESOURCE_GPUs": "GPU-aa, GPU-6a96bd13, GPU-bb",
                     "SLOT_TYPE_1": 'GPUs = 1 : "GPU-6a96bd13"\nCPUs = 1\nMemory = 10',
                     "NUM_SLOTS_TYPE_1": 1, "SLOT_TYPE_2": "auto", "NUM_SLOTS_TYPE_2": 2})
    out = layout(config, detect(config, cpus=3, memory=1010, disk=100))
    assert out[0].assigned["GPUs"] == ("GPU-6a96bd13",)
    assert (out[0].resources["Cpus"], out[0].resources["Memory"]) == (1, 10)
    assert [s.resources["GPUs"] for s in out[1:]] == [1, 1]
    assert sorted(out[1].assigned["GPUs"] + out[2].assigned["GPUs"]) == ["GPU-aa", "GPU-bb"]


def test_slot_ads_publish_resource_attributes() -> None:
    from tests.pool.helpers import sim_of

    sim = sim_of({"machines": [{"name": "ep1.example.org", "cpus": 4, "memory": 4096, "gpus": 2,
                                "config": {"NUM_SLOTS": 2, "MACHINE_RESOURCE_Cogs": 4}}]})
    sim.advance_to(sim.now)
    ads = {a["Name"]: a for a in sim.slot_ads()}
    a = ads["slot2@ep1.example.org"]
    assert (a["SlotID"], a["Cpus"], a["Memory"], a["TotalSlotCpus"], a["TotalCpus"]) == (2, 2, 2048, 2, 4)
    assert (a["GPUs"], a["TotalGPUs"], a["DetectedGPUs"], a["TotalSlotGPUs"], a["AssignedGPUs"]) == \
        (1, 2, 2, 1, "GPU-1")
    assert (a["Cogs"], a["TotalCogs"], a["DetectedCogs"], a["TotalSlotCogs"]) == (2, 4, 4, 2)
    assert a["State"] == "Unclaimed" and a["PartitionableSlot"] is False and a["SlotWeight"] == 2.0
    assert a["Start"] == "/Expr(true)/" and a["Requirements"] == "/Expr(START)/"


def test_startd_attrs_per_slot_seed_example() -> None:
    # seed 001 "Configuring STARTD_ATTRS on a per-slot basis": both examples at once
    sim = sim_of({"machines": [{"name": "ep1.example.org", "cpus": 3, "memory": 3072, "config": {
        "NUM_SLOTS": 3,
        "favorite_color": '"blue"', "favorite_season": '"spring"',
        "STARTD_ATTRS": "favorite_color, favorite_season",
        "SLOT1_STARTD_ATTRS": "favorite_movie", "favorite_movie": '"Casablanca"',
        "SLOT2_favorite_color": '"green"', "SLOT3_favorite_season": '"summer"',
        "STARTD_EXPRS": "IsNight", "IsNight": "ClockMin < 360"}}],
        "submitters": []})
    sim.advance_to(sim.now)
    ads = {a["Name"].split("@")[0]: a for a in sim.slot_ads()}
    got = {n: (a["favorite_color"], a["favorite_season"], a.get("favorite_movie"))
           for n, a in ads.items()}
    assert got == {"slot1": ("blue", "spring", "Casablanca"), "slot2": ("green", "spring", None),
                   "slot3": ("blue", "summer", None)}
    assert ads["slot1"]["IsNight"] == "/Expr(ClockMin < 360)/"


def test_slot_type_attrs_and_a_bad_value_names_its_knob() -> None:
    doc = {"machines": [{"name": "ep1.example.org", "cpus": 4, "memory": 4096, "config": {
        "SLOT_TYPE_1": "cpus=2", "NUM_SLOTS_TYPE_1": 1, "SLOT_TYPE_2": "cpus=2",
        "NUM_SLOTS_TYPE_2": 1, "SLOT_TYPE_2_STARTD_ATTRS": "HasScratch",
        "SLOT_TYPE_2_HasScratch": "True", "Tier": "1", "STARTD_ATTRS": "Tier",
        "SLOT_TYPE_1_Tier": "2"}}], "submitters": []}
    sim = sim_of(doc)
    sim.advance_to(sim.now)
    ads = {a["SlotTypeID"]: a for a in sim.slot_ads()}
    assert (ads[1]["Tier"], "HasScratch" in ads[1]) == (2, False)
    assert (ads[2]["Tier"], ads[2]["HasScratch"]) == (1, True)
    doc["machines"][0]["config"]["SLOT_TYPE_1_Tier"] = "2 +"  # type: ignore[index]
    with pytest.raises(ScenarioError, match=r"machines\[0\]\.config\.SLOT_TYPE_1_Tier: cannot parse"):
        sim_of(doc)
