"""CronTab scheduling and job deferral (seed 003, "Time Scheduling for Job Execution")."""
from __future__ import annotations

import calendar
import time

import pytest

from services.pool.crontab import CronTab, CronTabError
from services.pool.errors import ScenarioError
from tests.pool.helpers import run, sim_of


def at(*fields: int) -> int:
    """Epoch seconds of a UTC date and time."""
    return calendar.timegm((*fields, *(0,) * (6 - len(fields))))


def runs(fields: dict[str, str], since: int, n: int) -> list[str]:
    cron = CronTab.parse(fields)
    out: list[str] = []
    t = since
    for _ in range(n):
        t = cron.next_run(t)
        out.append(time.strftime("%a %m-%d %H:%M", time.gmtime(t)))
    return out


def test_the_seeds_field_syntax() -> None:
    assert sorted(CronTab.parse({"hour": "0-4"}).hours) == [0, 1, 2, 3, 4]
    cron = CronTab.parse({"minute": "15,20,25,30", "hour": "0-3,9-12,15"})
    assert sorted(cron.minutes) == [15, 20, 25, 30]
    assert sorted(cron.hours) == [0, 1, 2, 3, 9, 10, 11, 12, 15]
    cron = CronTab.parse({"minute": "10-30/5", "hour": "*/3"})
    assert sorted(cron.minutes) == [10, 15, 20, 25, 30]
    assert sorted(cron.hours) == [0, 3, 6, 9, 12, 15, 18, 21]
    assert sorted(CronTab.parse({"month": "*"}).months) == list(range(1, 13))
    assert CronTab.parse({"day_of_week": "7"}).days_of_week == {0}  # Sunday is 0 or 7


def test_top_of_every_hour_submitted_at_half_past_nine_runs_at_ten() -> None:
    assert runs({"minute": "0", "hour": "*"}, at(2026, 3, 2, 9, 30), 3) == [
        "Mon 03-02 10:00", "Mon 03-02 11:00", "Mon 03-02 12:00"]
    # never in the minute it is scheduled in: at 10:00:00 the next run is 11:00
    assert runs({"minute": "0"}, at(2026, 3, 2, 10, 0), 1) == ["Mon 03-02 11:00"]


def test_23_minutes_after_every_two_hours() -> None:
    fields = {"minute": "23", "hour": "0-23/2", "day_of_month": "*", "month": "*", "day_of_week": "*"}
    assert runs(fields, at(2026, 3, 2, 21, 30), 4) == [
        "Mon 03-02 22:23", "Tue 03-03 00:23", "Tue 03-03 02:23", "Tue 03-03 04:23"]


def test_may_10th_to_20th_and_the_remaining_weekday_of_may() -> None:
    # day of month OR day of week; the seed's text says "10:30pm ... Monday" but its fields
    # say hour 20 and weekday 2, which HTCondor reads as 20:30 on Tuesdays
    fields = {"minute": "30", "hour": "20", "day_of_month": "10-20", "month": "5", "day_of_week": "2"}
    assert runs(fields, at(2026, 1, 1), 14) == [
        "Tue 05-05 20:30", *(time.strftime("%a 05-%d 20:30", time.gmtime(at(2026, 5, d)))
                             for d in range(10, 21)),
        "Tue 05-26 20:30", "Tue 05-04 20:30"]


def test_every_10_and_every_6_minutes_before_noon_on_january_18th() -> None:
    fields = {"minute": "*/10,*/6", "hour": "0-11", "day_of_month": "18", "month": "1",
              "day_of_week": "*"}
    got = runs(fields, at(2026, 1, 1), 200)
    per_hour = ["00", "06", "10", "12", "18", "20", "24", "30", "36", "40", "42", "48", "50", "54"]
    assert got[:14] == [f"Sun 01-18 00:{m}" for m in per_hour]
    assert got[14 * 12 - 1] == "Sun 01-18 11:54" and got[14 * 12] == "Mon 01-18 00:00"  # 2027


def test_bad_crontab_values_are_scenario_errors_naming_the_command() -> None:
    with pytest.raises(CronTabError):
        CronTab.parse({"minute": "61"})
    with pytest.raises(ScenarioError) as err:
        sim_of({"machines": [{"name": "ep1"}], "submitters": [{"user": "u", "jobs": [
            {"arrival": {"kind": "batch"}, "duration": 60, "cron_hour": "5-2"}]}]})
    assert "submitters[0].jobs[0].cron_hour" in str(err.value)


def _cron_pool(job: dict[str, object], start: int, duration: str,
               config: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    return sim_of({"pool": {"start": start, "duration": duration}, "config": config or {},
                   "machines": [{"name": "ep1", "cpus": 1}],
                   "submitters": [{"user": "cron", "jobs": [
                       {"arrival": {"kind": "batch"}, "on_exit_remove": False, **job}]}]})


def test_a_crontab_job_runs_at_each_scheduled_time_and_stays_in_the_queue() -> None:
    start = at(2026, 3, 2, 9, 30)
    sim = _cron_pool({"duration": "10m", "cron_minute": 0, "cron_prep_time": 300}, start, "4h")
    events = run(sim, interval=60)
    submitted = next(e for e in events if e.type == "job.submitted")
    assert submitted.data.ad["DeferralTime"] == at(2026, 3, 2, 10, 0)
    assert submitted.data.ad["DeferralPrepTime"] == 300 and submitted.data.ad["CronMinute"] == "0"
    starts = [e.ts for e in events if e.type == "job.started"]
    done = [e.ts for e in events if e.type == "job.stopped" and e.data.reason == "completed"]
    # matched no earlier than (time() + SCHEDD_INTERVAL) >= (DeferralTime - CronPrepTime)
    assert at(2026, 3, 2, 9, 50) <= starts[0] < at(2026, 3, 2, 10, 0)
    # it executes at each top of the hour for its 10 minutes: 10:00, 11:00, 12:00, 13:00
    assert done == [at(2026, 3, 2, h, 10) for h in (10, 11, 12, 13)]
    job = sim.schedds["ap1.example.org"].jobs["1.0"]
    assert job.ad["JobStatus"] == 1 and job.ad["DeferralTime"] == at(2026, 3, 2, 14, 0)


def test_deferral_time_qdate_plus_60_waits_then_runs() -> None:
    start = at(2026, 3, 2, 9, 30)
    sim = _cron_pool({"duration": "2m", "deferral_time": "QDate + 60", "on_exit_remove": True},
                     start, "10m")
    events = run(sim, interval=30)
    started = next(e for e in events if e.type == "job.started")
    assert started.ts == start  # matched at once, Running while it waits on the claim
    done = next(e for e in events if e.type == "job.stopped")
    assert (done.data.reason, done.ts) == ("completed", start + 60 + 120)
    history = next(e for e in events if e.type == "job.history")
    assert history.data.ad["JobCurrentStartExecutingDate"] == start + 60


def _late(window: int):  # type: ignore[no-untyped-def]
    """A deferred job (QDate + 60) that reaches the only slot 105 s after submission, behind
    a 105 s job: 45 s past its deferral time."""
    start = at(2026, 3, 2, 9, 30)
    return sim_of({"pool": {"start": start, "duration": "10m"},
                   "machines": [{"name": "ep1", "cpus": 1}],
                   "submitters": [
                       {"user": "first", "jobs": [{"arrival": {"kind": "batch"}, "duration": 105}]},
                       {"user": "later", "jobs": [{"arrival": {"kind": "batch"}, "duration": 60,
                                                   "deferral_time": "QDate + 60",
                                                   "deferral_window": window}]}]}), start


def test_deferral_window_lets_a_late_job_run_and_a_missed_one_is_held() -> None:
    # the seed: 45 s past the deferral time with a 120 s window, the job begins at once
    sim, start = _late(120)
    events = run(sim, interval=105)
    late = [e for e in events if getattr(e.data, "job_id", None) == "2.0"]
    assert [(e.type, e.ts - start) for e in late if e.type in ("job.started", "job.stopped")] == [
        ("job.started", 105), ("job.stopped", 165)]
    # with no window it missed its execution time: evicted and put on hold
    sim, start = _late(0)
    events = run(sim, interval=105)
    stops = [e for e in events if e.type == "job.stopped" and e.data.job_id == "2.0"]
    assert [(e.data.reason, e.ts - start) for e in stops] == [("held", 105)]
    job = sim.schedds["ap1.example.org"].jobs["2.0"]
    assert (job.ad["JobStatus"], job.ad["HoldReasonCode"], job.ad["HoldReason"]) == \
        (5, 20, "Job missed deferred execution time")
    assert not [e for e in events if e.type == "job.started" and e.data.job_id == "2.0"]


def test_a_crontab_job_that_misses_its_time_waits_for_the_next_one() -> None:
    # the only slot is busy until 10:05 with a job submitted first; the 10:00 run of the
    # CronTab job (no window) is missed, so it runs at 11:00 instead (seed 003's limitations)
    start = at(2026, 3, 2, 9, 30)
    sim = sim_of({"pool": {"start": start, "duration": "2h"},
                  "machines": [{"name": "ep1", "cpus": 1}],
                  "submitters": [
                      {"user": "busy", "jobs": [{"arrival": {"kind": "batch"}, "duration": "35m"}]},
                      {"user": "cron", "jobs": [{"arrival": {"kind": "batch"}, "duration": "10m",
                                                 "cron_minute": 0, "on_exit_remove": False}]}]})
    events = run(sim, interval=60)
    done = [e.ts for e in events if e.type == "job.stopped" and e.data.job_id == "2.0"]
    assert done == [at(2026, 3, 2, 11, 10)]
    assert not [e for e in events if e.type == "job.stopped" and e.data.reason == "held"]
