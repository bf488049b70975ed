"""`follow events`: job event logs in HTCondor's formats, read by htcondor2.JobEventLog, become
the job.* events the folds read; growth, bad input, rotation and truncation."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson
import pytest

from services.follow.eventlog import JobEventLogFollower, submitter_of
from streams.log.events import EventLog
from tests.follow.helpers import (FOLLOW_DATA, cli, dead, event_log, events, execute,
                                  job_lifecycle, submit, terminate)


def follower(elog: EventLog, path: Path, **kw: object) -> JobEventLogFollower:
    kw.setdefault("schedd", "ap1.example.org")
    kw.setdefault("uid_domain", "example.org")
    return JobEventLogFollower(elog, path, **kw)  # type: ignore[arg-type]


def summary(elog: EventLog) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for e in events(elog):
        d = e.data
        out.append((e.type, d.job_id, d.submitter, getattr(d, "slot", None),
                    getattr(d, "reason", None)))
    return out


def test_schedd_event_log_becomes_job_events(tmp_path: Path) -> None:
    """A schedd's EVENT_LOG with job ad information (028) events: every lifecycle event of the
    four jobs, with HTCondor's submitter names, slots, weights and resources."""
    elog = event_log(tmp_path / "home")
    f = follower(elog, FOLLOW_DATA / "EventLog")
    report = f.poll()
    f.flush()
    a, e = "alice@example.org", "group_physics.einstein@example.org"
    s1, s2, s3, s4 = (f"slot1_{k}@ep{h}.example.org" for k, h in ((1, 1), (2, 2), (3, 1), (4, 2)))
    assert summary(elog) == [
        ("job.submitted", "101.0", a, None, None),
        ("job.submitted", "101.1", a, None, None),
        ("job.stopped", "101.1", a, "", "held"),
        ("job.submitted", "101.1", a, None, None),       # released: idle again
        ("job.started", "101.0", a, s1, None),
        ("job.started", "101.1", a, s3, None),
        ("job.submitted", "102.0", e, None, None),       # AccountingGroup@domain
        ("job.started", "102.0", e, s4, None),
        ("job.submitted", "103.0", "bob@example.org", None, None),
        ("job.stopped", "103.0", "bob@example.org", "", "removed"),   # condor_rm while idle
        ("job.stopped", "101.1", a, s3, "evicted"),      # shadow exception
        ("job.started", "101.1", a, s3, None),
        ("job.stopped", "101.0", a, s1, "evicted"),      # "Job was evicted."
        ("job.started", "101.0", a, s2, None),
        ("job.stopped", "102.0", e, s4, "removed"),      # condor_rm while running
        ("job.stopped", "101.1", a, s3, "completed"),
        ("job.stopped", "101.0", a, s2, "completed"),
    ]
    assert report.events == 17 and report.dead == 0 and dead(elog) == []
    evs = events(elog)
    started = [e for e in evs if e.type == "job.started"]
    assert [s.data.slot_weight for s in started] == [2.0, 1.0, 4.0, 1.0, 2.0]
    assert started[0].data.resources == {"Cpus": 2, "Memory": 4096, "Disk": 100000}
    assert started[2].data.concurrency_limits == "xsw"
    assert evs[0].ts == 1763805600.0 and evs[-1].ts == 1763809200.0   # 10:00Z and 11:00Z
    assert evs[0].data.ad["GlobalJobId"] == "ap1.example.org#101.0#1763805600"
    assert [e.id for e in evs] == [f"eventlog@{FOLLOW_DATA / 'EventLog'}:{k}" for k in range(1, 18)]
    assert f.pos.offset == (FOLLOW_DATA / "EventLog").stat().st_size


def test_followed_log_folds_into_usage(tmp_path: Path) -> None:
    """The events fold as the simulation's do: the weighted usage of each submitter is the
    sum of its runs x slot weight, from the event log's own timestamps."""
    home = tmp_path / "home"
    r = cli(home, "follow", "events", "--schedd", "ap1.example.org", "--once",
            str(FOLLOW_DATA / "EventLog"))
    assert r.returncode == 0, r.stderr
    assert "17 events appended, 0 dead-lettered" in r.stdout
    r = cli(home, "userprio", "-allusers", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["Name"]: row for row in orjson.loads(r.stdout)["Submitters"]}
    # alice: 101.0 ran 10:00:10-10:30 and 10:31-11:00 on 2-core slots, 101.1 10:07-10:20
    # and 10:21-10:50 on one core; einstein's 102.0 10:11-10:40 on 4 cores
    alice = (1790 + 1740) * 2 + 780 + 1740
    assert rows["alice@example.org"]["WeightedAccumulatedUsage"] == pytest.approx(alice)
    assert rows["group_physics.einstein@example.org"]["WeightedAccumulatedUsage"] == \
        pytest.approx(1740 * 4)


def test_manual_quick_start_log(tmp_path: Path) -> None:
    """The user manual's example log (no year in its dates, no 028 events): with the
    submitter given, submit, execute and terminate become three events; the image size
    event is not a lifecycle event."""
    elog = event_log(tmp_path / "home")
    f = follower(elog, FOLLOW_DATA / "quick-start.log", submitter="kris@example.org")
    assert f.poll().events == 2  # the last event waits one poll for a 028 that may follow
    assert f.poll().events == 1
    evs = events(elog)
    assert [(e.type, e.data.job_id) for e in evs] == [
        ("job.submitted", "6.0"), ("job.started", "6.0"), ("job.stopped", "6.0")]
    assert evs[1].data.slot == "<192.0.2.5:43051?PrivNet=cs.wisc.edu>"   # no SlotName: the host
    assert evs[2].data.reason == "completed" and evs[2].data.slot == evs[1].data.slot
    assert evs[2].ts - evs[0].ts == 27   # 10:49:04 .. 10:49:31


def test_unknown_submitter_is_dead_lettered_with_file_and_offset(tmp_path: Path) -> None:
    """HTCondor's own test log (condor_tests/python_bindings/test_log.txt): its 028 events
    carry no Owner, so the submitter cannot be known: each submit is dead-lettered naming the
    file, byte offset and job, none is charged to a guessed name."""
    path = FOLLOW_DATA / "condor_tests_test_log.txt"
    elog = event_log(tmp_path / "home")
    f = follower(elog, path)
    report = f.poll()
    assert report.events == 0 and report.dead == 2
    reasons = [d.reason for d in dead(elog)]
    assert reasons[0].startswith(f"{path} (byte 0): job 236467.0: SUBMIT")
    second = path.read_bytes().index(b"000 (236468.000.000)")
    assert reasons[1].startswith(f"{path} (byte {second}): job 236468.0: SUBMIT")
    assert "EVENT_LOG_JOB_AD_INFORMATION_ATTRS" in reasons[0]
    data = path.read_bytes()
    assert dead(elog)[0].raw == data[:data.index(b"\n...\n") + 5]  # the event's own bytes


@pytest.mark.parametrize("job, submitter", [
    ({"Owner": "alice", "User": "alice@cs.example.org"}, "alice@cs.example.org"),
    ({"Owner": "alice"}, "alice@example.org"),                       # UID_DOMAIN
    ({"User": "alice@cs.example.org"}, "alice@cs.example.org"),
    ({"Owner": "a", "User": "a@d", "AccountingGroup": "group_x.a"}, "group_x.a@d"),
    ({"Owner": "a", "User": "a@d", "NiceUser": True}, "nice-user.a@d"),
    ({"Cmd": "/bin/true"}, None),
])
def test_submitter_of_job_attributes(job: dict[str, object], submitter: str | None) -> None:
    assert submitter_of(job, "example.org") == submitter


def test_growing_log_half_written_event_waits(tmp_path: Path) -> None:
    """An event cut in the middle (the writer is still at it) is not consumed; completed, it
    is read once."""
    path = tmp_path / "EventLog"
    text = job_lifecycle(1)
    cut = text.index("Job executing") + 10
    path.write_text(text[:cut])
    elog = event_log(tmp_path / "home")
    f = follower(elog, path)
    f.poll()
    assert [e.type for e in events(elog)] == ["job.submitted"]
    assert f.pos.offset < cut
    with open(path, "a") as out:
        out.write(text[cut:])
    f.poll()
    assert [e.type for e in events(elog)] == ["job.submitted", "job.started", "job.stopped"]
    assert f.poll().events == 0


def test_garbage_event_dead_lettered_and_reading_goes_on(tmp_path: Path) -> None:
    """Bytes that are no job event, and an event the reader refuses (ULOG_RD_ERROR), go to
    the DLQ with the file and byte offset; the events after them are read."""
    path = tmp_path / "EventLog"
    broken = "005 (002.000.000) 2025-11-22 10:00:09Z Job terminated.\n\tnonsense\n...\n"
    good, garbage = job_lifecycle(1), "this is not\na job event\n...\n"
    path.write_text(good + garbage + broken + job_lifecycle(2))
    elog = event_log(tmp_path / "home")
    f = follower(elog, path)
    report = f.poll()
    assert report.events == 6 and report.dead == 2
    first, second = (d.reason for d in dead(elog))
    assert first.startswith(f"{path} (byte {len(good)}): unreadable job event (not a job event)")
    assert second.startswith(f"{path} (byte {len(good) + len(garbage)}): unreadable job event")
    assert dead(elog)[0].raw == garbage.encode()


def test_rotation_finishes_the_old_file(tmp_path: Path) -> None:
    """EVENT_LOG rotation (the file renamed to .old, a new one started): what was appended to
    the old file after the last poll is still read, then the new file from its start."""
    path = tmp_path / "EventLog"
    path.write_text(job_lifecycle(1))
    elog = event_log(tmp_path / "home")
    f = follower(elog, path)
    f.poll()
    with open(path, "a") as out:
        out.write(job_lifecycle(2))
    os.rename(path, tmp_path / "EventLog.old")
    path.write_text(job_lifecycle(3))
    report = f.poll()
    assert report.rotations == 1 and report.events == 6
    assert "finished the old file as" in report.notes[0]
    jobs = [e.data.job_id for e in events(elog)]
    assert jobs == ["1001.0"] * 3 + ["1002.0"] * 3 + ["1003.0"] * 3
    assert f.poll().events == 0


def test_truncation_restarts_at_zero(tmp_path: Path) -> None:
    """A file truncated in place (size below the position) is read again from 0, and said."""
    path = tmp_path / "EventLog"
    path.write_text(job_lifecycle(1) + job_lifecycle(2))
    elog = event_log(tmp_path / "home")
    f = follower(elog, path)
    f.poll()
    with open(path, "r+") as out:
        out.truncate(0)
        out.write(job_lifecycle(3))
    report = f.poll()
    assert report.truncations == 1 and "truncated" in report.notes[0]
    assert [e.data.job_id for e in events(elog)][-3:] == ["1003.0"] * 3
    assert len(events(elog)) == 9


def test_resumes_from_stored_position(tmp_path: Path) -> None:
    """A new follower (a restarted process) goes on after the last committed event, with the
    jobs it knew (the stop names the slot of the start read by the previous process)."""
    path = tmp_path / "EventLog"
    path.write_text(submit("7.0", "10:00:00") + execute("7.0", "10:00:05", "slot1@ep9"))
    home = tmp_path / "home"
    elog = event_log(home)
    follower(elog, path).poll()
    elog.log.close()
    with open(path, "a") as out:
        out.write(terminate("7.0", "10:10:00"))
    elog = event_log(home)
    follower(elog, path).poll()
    evs = events(elog)
    assert [e.type for e in evs] == ["job.submitted", "job.started", "job.stopped"]
    assert evs[2].data.slot == "slot1@ep9" and evs[2].seq == 3


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = cli(home, "follow", "events", "--once", str(tmp_path / "missing"))
    assert r.returncode == 1 and r.stderr.strip() == \
        f"poolledger follow: {tmp_path / 'missing'}: no such file"
    shutil.copy(FOLLOW_DATA / "quick-start.log", tmp_path / "q.log")
    r = cli(home, "follow", "events", "--interval", "0", str(tmp_path / "q.log"))
    assert r.returncode == 2 and "--interval 0: must be positive" in r.stderr
    # a job log without submitter: dead letters, exit 1, nothing appended
    r = cli(home, "follow", "events", "--once", str(tmp_path / "q.log"))
    assert r.returncode == 1 and "0 events appended, 3 dead-lettered" in r.stdout
    assert "Traceback" not in r.stderr
    # --once on a file whose last event is half written: said, left for the next run
    half = tmp_path / "half.log"
    text = job_lifecycle(1)
    half.write_text(text[:-20])
    r = cli(home, "follow", "events", "--once", str(half))
    assert r.returncode == 0, r.stderr
    start = text.rindex("028 (")  # the terminate's job ad information, cut short
    assert f"note: {half}: {len(text) - 20 - start} bytes after byte {start} are not a " \
        "complete record yet" in r.stdout
    assert "3 events appended" in r.stdout  # the terminate no longer waits for it


def test_a_poll_at_any_byte_loses_and_doubles_nothing(tmp_path: Path) -> None:
    """The file read while the writer is anywhere in an event (mid-line, between an event
    and its 028, at a `...` without its newline), then completed: each job event once."""
    text = job_lifecycle(1) + job_lifecycle(2)
    ends = [i + 4 for i in range(len(text)) if text.startswith("...\n", i)]
    # around each event's end (where a poll meets the next event or its 028), and inside one;
    # a cut inside an event costs a second (htcondor2's reader waits for the rest once)
    cuts = sorted({c for e in ends[:-1] for c in (e - 3, e - 1, e, e + 9)} | {150, 1300})
    for cut in cuts:
        work = tmp_path / str(cut)
        work.mkdir()
        path = work / "EventLog"
        path.write_text(text[:cut])
        elog = event_log(work / "home")
        f = follower(elog, path)
        f.poll()
        with open(path, "a") as out:
            out.write(text[cut:])
        f.poll()
        f.flush()
        got = [(e.type, e.data.job_id, e.data.submitter) for e in events(elog)]
        assert got == [(t, j, "alice@example.org") for j in ("1001.0", "1002.0")
                       for t in ("job.submitted", "job.started", "job.stopped")], cut
        assert dead(elog) == [], cut
        elog.log.close()
