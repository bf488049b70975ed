"""Submit requirements and warnings (seed 001, "Submit Requirements" / "Submit Warnings")."""
from __future__ import annotations

import pytest

from services.pool.schedd import JobDescription
from services.pool.submit_policy import SubmitRejectedError, condor_submit_output
from tests.pool.helpers import sim_of

#: the seed's three example requirements, their reasons, and its OneGig warning
SEED_KNOBS = {
    "SUBMIT_REQUIREMENT_NAMES": "NotStandardUniverse, MinimalRequestMemory, NotChris, OneGig",
    "SUBMIT_REQUIREMENT_NotStandardUniverse": "JobUniverse != 1",
    "SUBMIT_REQUIREMENT_MinimalRequestMemory": "RequestMemory > 512",
    "SUBMIT_REQUIREMENT_NotChris": 'Owner != "chris"',
    "SUBMIT_REQUIREMENT_NotStandardUniverse_REASON": '"This pool does not accept standard universe jobs."',
    "SUBMIT_REQUIREMENT_MinimalRequestMemory_REASON":
        'strcat( "The job only requested ", RequestMemory, " Megabytes.  If that small amount is really enough, please contact ..." )',
    "SUBMIT_REQUIREMENT_NotChris_REASON": '"Chris, you may only submit jobs to the instructional pool."',
    "SUBMIT_REQUIREMENT_OneGig": "RequestMemory > 1024",
    "SUBMIT_REQUIREMENT_OneGig_REASON": '"As of <date>, the minimum requested memory will be 1024."',
    "SUBMIT_REQUIREMENT_OneGig_IS_WARNING": "True",
}


def _schedd(knobs: dict[str, str] = SEED_KNOBS):  # type: ignore[no-untyped-def]
    sim = sim_of({"config": dict(knobs), "machines": [{"name": "ep1", "cpus": 1}]})
    sim.advance_to(sim.now)
    return sim, sim.schedds["ap1.example.org"]


def test_standard_universe_job_gets_the_seeds_message_character_for_character() -> None:
    sim, schedd = _schedd()
    with pytest.raises(SubmitRejectedError) as err:
        schedd.submit(JobDescription(owner="alice", request_memory=2048, attrs={"JobUniverse": 1}), [60])
    assert list(err.value.lines) == [
        "Submitting job(s).",
        "ERROR: Failed to commit job submission into the queue.",
        "ERROR: This pool does not accept standard universe jobs."]
    assert schedd.jobs == {} and schedd.next_cluster == 1
    assert [e.type for e in sim.advance_to(sim.now)] == []  # nothing entered the queue


def test_requirements_are_evaluated_in_order_and_only_the_first_failure_is_reported() -> None:
    _, schedd = _schedd()
    # chris with 256 MB fails MinimalRequestMemory and NotChris: only the first is reported
    with pytest.raises(SubmitRejectedError) as err:
        schedd.submit(JobDescription(owner="chris", request_memory=256), [60])
    assert err.value.requirement == "MinimalRequestMemory"
    assert err.value.lines[-1] == ("ERROR: The job only requested 256 Megabytes.  If that small amount "
                                   "is really enough, please contact ...")
    with pytest.raises(SubmitRejectedError) as err:
        schedd.submit(JobDescription(owner="chris", request_memory=2048), [60])
    assert err.value.lines[-1] == "ERROR: Chris, you may only submit jobs to the instructional pool."
    assert len(schedd.rejections) == 2


def test_one_rejected_job_rejects_the_whole_cluster() -> None:
    _, schedd = _schedd({**SEED_KNOBS, "SUBMIT_REQUIREMENT_NAMES": "Short",
                         "SUBMIT_REQUIREMENT_Short": "ProcId < 2"})
    with pytest.raises(SubmitRejectedError) as err:
        schedd.submit(JobDescription(owner="alice", request_memory=2048), [60, 60, 60])
    assert schedd.jobs == {}
    # without a _REASON the default message names the requirement
    assert "Short" in err.value.reason
    assert [j.job_id for j in schedd.submit(JobDescription(owner="alice"), [60, 60])] == ["1.0", "1.1"]


def test_submit_warning_queues_the_job_and_prints_the_seeds_warning() -> None:
    sim, schedd = _schedd()
    jobs = schedd.submit(JobDescription(owner="alice", request_memory=768), [60])
    assert [j.job_id for j in jobs] == ["1.0"]
    assert condor_submit_output(1, 1, schedd.submit_warnings[1]) == [
        "Submitting job(s).",
        "WARNING: Committed job submission into the queue with the following warning:",
        "WARNING: As of <date>, the minimum requested memory will be 1024.",
        "",
        "1 job(s) submitted to cluster 1."]
    assert schedd.submit(JobDescription(owner="alice", request_memory=2048), [60])
    assert schedd.submit_warnings[2] == []
    assert [e.type for e in sim.advance_to(sim.now)].count("job.submitted") == 2


def test_scenario_arrivals_that_are_rejected_do_not_stop_the_simulation() -> None:
    sim = sim_of({"config": dict(SEED_KNOBS), "machines": [{"name": "ep1", "cpus": 1}],
                  "submitters": [
                      {"user": "chris", "jobs": [{"arrival": {"kind": "batch"}, "duration": 60,
                                                  "request_memory": 2048}]},
                      {"user": "alice", "jobs": [{"arrival": {"kind": "batch"}, "duration": 60,
                                                  "request_memory": 2048}]}]})
    events = sim.advance_to(sim.now + 1)
    assert [e.data.submitter for e in events if e.type == "job.submitted"] == ["alice@example.org"]
    assert [r.requirement for _, r in sim.schedds["ap1.example.org"].rejections] == ["NotChris"]


def test_a_malformed_requirement_is_a_scenario_error_naming_the_knob() -> None:
    from services.pool.errors import ScenarioError

    with pytest.raises(ScenarioError) as err:
        sim_of({"config": {"SUBMIT_REQUIREMENT_NAMES": "Bad", "SUBMIT_REQUIREMENT_Bad": "RequestMemory >"},
                "machines": [{"name": "ep1"}]})
    assert str(err.value).startswith("test.toml: config.SUBMIT_REQUIREMENT_Bad: cannot parse")


#: the seed's two transforms (job transforms, "condor_schedd Policy Configuration")
TRANSFORMS = {
    "JOB_TRANSFORM_NAMES": "AssignGroup, SL6ToDocker",
    "JOB_TRANSFORM_AssignGroup": """
   # map Owner to group using the existing accounting group attribute as requested group
   EVALSET AcctGroup = userMap("Groups",Owner,AcctGroup)
   EVALSET AccountingGroup = join(".",AcctGroup,Owner)
""",
    "JOB_TRANSFORM_SL6ToDocker": """
   # match only vanilla jobs that have WantSL6 and do not already have a DockerImage
   REQUIREMENTS JobUniverse==5 && WantSL6 && DockerImage =?= undefined
   SET  WantDocker = true
   SET  DockerImage = "SL6"
   SET  Requirements = TARGET.HasDocker && $(MY.Requirements)
""",
    "SCHEDD_CLASSAD_USER_MAP_NAMES": "Groups",
}


def _transform_pool(tmp_path, extra: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    mapfile = tmp_path / "groups.map"
    mapfile.write_text("* alice group_physics,group_chem\n* bob group_bio\n")
    sim = sim_of({"config": {**TRANSFORMS, "CLASSAD_USER_MAPFILE_Groups": str(mapfile), **(extra or {})},
                  "machines": [{"name": "ep1", "cpus": 1}]})
    sim.advance_to(sim.now)
    return sim, sim.schedds["ap1.example.org"]


def test_the_seeds_assign_group_transform_maps_owners_to_groups(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sim, schedd = _transform_pool(tmp_path)
    # alice asks for group_chem, which the map allows; bob asks for nothing and gets his group
    alice = schedd.submit(JobDescription(owner="alice", accounting_group="group_chem"), [60])[0]
    bob = schedd.submit(JobDescription(owner="bob"), [60])[0]
    # alice asking for a group the map does not give her gets her first group
    again = schedd.submit(JobDescription(owner="alice", accounting_group="group_bio"), [60])[0]
    assert (alice.ad["AcctGroup"], alice.ad["AccountingGroup"], alice.submitter) == \
        ("group_chem", "group_chem.alice", "group_chem.alice@example.org")
    assert (bob.ad["AcctGroup"], bob.ad["AccountingGroup"], bob.submitter) == \
        ("group_bio", "group_bio.bob", "group_bio.bob@example.org")
    assert again.ad["AccountingGroup"] == "group_physics.alice"
    submitted = [e.data for e in sim.advance_to(sim.now) if e.type == "job.submitted"]
    assert [d.submitter for d in submitted] == ["group_chem.alice@example.org",
                                                "group_bio.bob@example.org",
                                                "group_physics.alice@example.org"]


def test_the_seeds_sl6_to_docker_transform_applies_only_where_its_requirements_hold(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, schedd = _transform_pool(tmp_path)
    sl6 = schedd.submit(JobDescription(owner="bob", attrs={"WantSL6": True}), [60])[0]
    plain = schedd.submit(JobDescription(owner="bob"), [60])[0]
    assert (sl6.ad["WantDocker"], sl6.ad["DockerImage"]) == (True, "SL6")
    # $(MY.Requirements) is the job's own Requirements as written
    assert sl6.ad["Requirements"].text == f"TARGET.HasDocker && {plain.ad['Requirements'].text}"
    assert "WantDocker" not in plain.ad and "DockerImage" not in plain.ad


def test_transforms_run_before_submit_requirements(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, schedd = _transform_pool(tmp_path, {
        "JOB_TRANSFORM_NAMES": "AssignGroup, Mem",
        "JOB_TRANSFORM_Mem": "DEFAULT Site \"wisc\"\nSET RequestMemory = 1024\nRENAME Site = Campus\n"
                             "COPY Campus = Site2\nDELETE NiceUser",
        "SUBMIT_REQUIREMENT_NAMES": "Mem", "SUBMIT_REQUIREMENT_Mem": "RequestMemory >= 1024"})
    job = schedd.submit(JobDescription(owner="bob", request_memory=1), [60])[0]
    assert (job.ad["RequestMemory"], job.ad["Campus"], job.ad["Site2"]) == (1024, "wisc", "wisc")
    assert "Site" not in job.ad and "NiceUser" not in job.ad


def test_bad_transforms_and_missing_map_files_are_scenario_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from services.pool.errors import ScenarioError

    with pytest.raises(ScenarioError) as err:
        sim_of({"config": {"JOB_TRANSFORM_NAMES": "T", "JOB_TRANSFORM_T": "SET\nFROB x"},
                "machines": [{"name": "ep1"}]})
    assert "config.JOB_TRANSFORM_T: line 1: SET needs an attribute" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        sim_of({"config": {**TRANSFORMS, "CLASSAD_USER_MAPFILE_Groups": str(tmp_path / "nope.map")},
                "machines": [{"name": "ep1"}]})
    assert "config.CLASSAD_USER_MAPFILE_Groups: cannot read map file" in str(err.value)
