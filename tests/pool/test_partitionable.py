"""Partitionable slots carve dynamic slots per request (seed 001, "Dynamic Provisioning")."""
from __future__ import annotations

from schemas.events import Matched
from services.pool.sim import PoolSim
from tests.pool.helpers import run, sim_of

BIG = 1_000_000


def match(job_id: str, slot: str, submitter: str = "alice@example.org") -> Matched:
    return Matched(negotiator="n", cycle=1, job_id=job_id, schedd="schedd@ap1.example.org",
                   submitter=submitter, group="<none>", slot=slot, reason="NoPreemption")


def pslot_pool(jobs: list[dict[str, object]], gpus: int = 0) -> PoolSim:
    return sim_of({
        "machines": [{"name": "ep7.example.org", "cpus": 10, "memory": 10240, "disk": BIG,
                      "gpus": gpus,
                      "config": {"SLOT_TYPE_1": "100%", "NUM_SLOTS_TYPE_1": 1,
                                 "SLOT_TYPE_1_PARTITIONABLE": True}}],
        "submitters": [{"user": "alice", "jobs": jobs}]})


def test_seed_example_3_cpus_1024_mb_leaves_7_and_9216() -> None:
    sim = pslot_pool([{"arrival": {"kind": "batch", "count": 2}, "duration": "1h",
                       "request_cpus": 3, "request_memory": 1024, "request_disk": 10240}])
    t = sim.now
    sim.advance_to(t)
    pslot = "slot1@ep7.example.org"
    ads = {a["Name"]: a for a in sim.slot_ads()}
    assert (ads[pslot]["Cpus"], ads[pslot]["Memory"], ads[pslot]["Disk"]) == (10, 10240, BIG)
    assert ads[pslot]["PartitionableSlot"] is True and ads[pslot]["SlotType"] == "Partitionable"

    events = sim.apply_match(match("1.0", pslot), t)
    ads = {a["Name"]: a for a in sim.slot_ads()}
    assert (ads[pslot]["Cpus"], ads[pslot]["Memory"], ads[pslot]["Disk"]) == (7, 9216, BIG - 10240)
    assert ads[pslot]["TotalSlotCpus"] == 10 and ads[pslot]["State"] == "Unclaimed"
    d = ads["slot1_1@ep7.example.org"]
    assert (d["Cpus"], d["Memory"], d["Disk"], d["DynamicSlot"], d["SlotType"]) == \
        (3, 1024, 10240, True, "Dynamic")
    assert (d["State"], d["Activity"], d["SlotID"], d["SlotWeight"]) == ("Claimed", "Busy", 1, 3.0)
    started = [e.data for e in events if e.type == "job.started"]
    assert started[0].slot == "slot1_1@ep7.example.org"
    assert started[0].resources == {"Cpus": 3, "Memory": 1024, "Disk": 10240}
    assert started[0].slot_weight == 3.0

    sim.apply_match(match("1.1", pslot), t)
    ads = {a["Name"]: a for a in sim.slot_ads()}
    assert "slot1_2@ep7.example.org" in ads
    assert (ads[pslot]["Cpus"], ads[pslot]["Memory"], ads[pslot]["NumDynamicSlots"]) == (4, 8192, 2)

    events = sim.advance_to(t + 3600)
    gone = [e.data.name for e in events if e.type == "ad.invalidated" and e.data.ad_type == "Machine"]
    assert gone == ["slot1_1@ep7.example.org", "slot1_2@ep7.example.org"]
    ads = {a["Name"]: a for a in sim.slot_ads()}
    assert list(ads) == [pslot]
    assert (ads[pslot]["Cpus"], ads[pslot]["Memory"], ads[pslot]["Disk"]) == (10, 10240, BIG)


def test_requests_are_quantized_and_refused_when_too_big() -> None:
    sim = pslot_pool([{"arrival": {"kind": "batch", "count": 1}, "duration": "1h",
                       "request_memory": 1000, "request_disk": 1},
                      {"arrival": {"kind": "batch", "count": 1}, "duration": "1h",
                       "request_cpus": 11}])
    t = sim.now
    sim.advance_to(t)
    sim.apply_match(match("1.0", "slot1@ep7.example.org"), t)
    ads = {a["Name"]: a for a in sim.slot_ads()}
    d = ads["slot1_1@ep7.example.org"]
    assert (d["Memory"], d["Disk"]) == (1024, 1024)  # MODIFY_REQUEST_EXPR_* quantize 128 / 1024
    events = sim.apply_match(match("2.0", "slot1@ep7.example.org"), t)
    assert not [e for e in events if e.type == "job.started"]
    assert [j.job_id for j in sim.idle_jobs()] == ["2.0"]


def test_gpus_are_carved_with_their_ids() -> None:
    sim = pslot_pool([{"arrival": {"kind": "batch", "count": 1}, "duration": "1h",
                       "request": {"gpus": 1}}], gpus=2)
    t = sim.now
    sim.advance_to(t)
    events = sim.apply_match(match("1.0", "slot1@ep7.example.org"), t)
    ads = {a["Name"]: a for a in sim.slot_ads()}
    assert (ads["slot1_1@ep7.example.org"]["GPUs"], ads["slot1_1@ep7.example.org"]["AssignedGPUs"]) == \
        (1, "GPU-0")
    assert (ads["slot1@ep7.example.org"]["GPUs"], ads["slot1@ep7.example.org"]["AssignedGPUs"]) == \
        (1, "GPU-1")
    started = [e.data for e in events if e.type == "job.started"][0]
    assert started.resources["GPUs"] == 1


def test_consumption_policy_sizes_dynamic_slots() -> None:
    # seed 001: an 8-core partitionable slot with 4 GPUs and a consumption policy
    sim = sim_of({
        "machines": [{"name": "ep7.example.org", "cpus": 8, "memory": 8192, "gpus": 4,
                      "config": {"SLOT_TYPE_1": "cpus=8, gpus=4", "NUM_SLOTS_TYPE_1": 1,
                                 "SLOT_TYPE_1_PARTITIONABLE": True,
                                 "SLOT_TYPE_1_CONSUMPTION_POLICY": True,
                                 "CONSUMPTION_MEMORY": "quantize(target.RequestMemory, {1000})"}}],
        "submitters": [{"user": "alice", "jobs": [{"arrival": {"kind": "batch", "count": 1},
                                                   "duration": "1h", "request_cpus": 2,
                                                   "request_memory": 1500, "request": {"gpus": 2}}]}]})
    t = sim.now
    sim.advance_to(t)
    sim.apply_match(match("1.0", "slot1@ep7.example.org"), t)
    ads = {a["Name"]: a for a in sim.slot_ads()}
    d = ads["slot1_1@ep7.example.org"]
    assert (d["Cpus"], d["Memory"], d["GPUs"]) == (2, 2000, 2)
    assert (ads["slot1@ep7.example.org"]["Cpus"], ads["slot1@ep7.example.org"]["GPUs"]) == (6, 2)


def test_slot_type_slot_weight_overrides_slot_weight_per_type() -> None:
    # a 2-cpu static slot of type 1 (SLOT_WEIGHT = Cpus) and a 6-cpu 12 GB partitionable slot
    # of type 2 weighed by memory (SLOT_TYPE_2_SLOT_WEIGHT = Memory / 1024): its dynamic
    # slots keep their type's weight
    sim = sim_of({"machines": [{"name": "ep1", "cpus": 8, "memory": 16384, "config": {
        "SLOT_TYPE_1": "cpus=2, memory=4096", "NUM_SLOTS_TYPE_1": 1,
        "SLOT_TYPE_2": "cpus=6, memory=12288", "NUM_SLOTS_TYPE_2": 1,
        "SLOT_TYPE_2_PARTITIONABLE": True, "SLOT_TYPE_2_SLOT_WEIGHT": "Memory / 1024"}}],
        "submitters": [{"user": "u", "jobs": [{"arrival": {"kind": "batch", "count": 2},
                                               "duration": "1h", "request_memory": 3072}]}]})
    sim.advance_to(sim.now)
    weights = {a["Name"]: a["SlotWeight"] for a in sim.slot_ads()}
    assert weights == {"slot1@ep1": 2.0, "slot2@ep1": 12.0}
    events = run(sim, until=sim.now + 60)
    started = {e.data.slot: e.data.slot_weight for e in events if e.type == "job.started"}
    assert started == {"slot1@ep1": 2.0, "slot2_1@ep1": 3.0}


def test_consumption_policy_without_consumption_memory_or_disk_uses_htcondors_defaults() -> None:
    # CONSUMPTION_POLICY with only CONSUMPTION_CPUS: memory and disk are consumed by
    # param_info.in's CONSUMPTION_MEMORY = quantize(target.RequestMemory, {128}) and
    # CONSUMPTION_DISK = quantize(target.RequestDisk, {1024}), not by nothing:
    # 1000 MB -> 8 * 128 = 1024, 5000 KB -> 5 * 1024 = 5120; cpus 1 -> quantize(1, {2}) = 2.
    # A custom resource left out consumes the job's request, 0 when it has none (Resource.cpp).
    sim = sim_of({
        "machines": [{"name": "ep7.example.org", "cpus": 8, "memory": 8192, "disk": 100_000,
                      "gpus": 2,
                      "config": {"SLOT_TYPE_1": "cpus=8", "NUM_SLOTS_TYPE_1": 1,
                                 "SLOT_TYPE_1_PARTITIONABLE": True, "CONSUMPTION_POLICY": True,
                                 "CONSUMPTION_CPUS": "quantize(target.RequestCpus, {2})"}}],
        "submitters": [{"user": "alice", "jobs": [{"arrival": {"kind": "batch", "count": 1},
                                                   "duration": "1h", "request_cpus": 1,
                                                   "request_memory": 1000, "request_disk": 5000}]}]})
    t = sim.now
    sim.advance_to(t)
    pslot = "slot1@ep7.example.org"
    ad = {a["Name"]: a for a in sim.slot_ads()}[pslot]
    assert (ad["Cpus"], ad["Memory"], ad["Disk"]) == (8, 8192, 100_000)
    assert ad["MachineResources"].split()[:3] == ["Cpus", "Memory", "Disk"]
    assert {k: "".join(str(ad[k]).split()) for k in ("ConsumptionMemory", "ConsumptionDisk")} == {
        "ConsumptionMemory": "/Expr(quantize(target.RequestMemory,{128}))/",
        "ConsumptionDisk": "/Expr(quantize(target.RequestDisk,{1024}))/"}
    assert "".join(str(ad["ConsumptionGPUs"]).split()) == \
        "/Expr(ifthenelse(target.RequestGPUsisundefined,0,target.RequestGPUs))/"
    sim.apply_match(match("1.0", pslot), t)
    ads = {a["Name"]: a for a in sim.slot_ads()}
    assert (ads[pslot]["Cpus"], ads[pslot]["Memory"], ads[pslot]["Disk"]) == \
        (8 - 2, 8192 - 1024, 100_000 - 5120)
    d = ads["slot1_1@ep7.example.org"]
    assert (d["Cpus"], d["Memory"], d["Disk"], d["GPUs"]) == (2, 1024, 5120, 0)
    assert ads[pslot]["GPUs"] == 2
