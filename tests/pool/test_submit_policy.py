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
