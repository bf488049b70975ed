"""kill -9 of a follower process mid-stream, again and again, across a rotation: every job
event of the file is on the log exactly once, in the file's order."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from streams.log.embedded import EmbeddedLog
from streams.log.topics import EVENTS
from tests.follow.helpers import cli, cli_argv, cli_env, event_log, events, job_lifecycle

JOBS = 150


def _appended(home: Path) -> int:
    log = EmbeddedLog(home / "log")
    try:
        return sum(log.end_offsets(EVENTS).values()) if EVENTS in log.topics() else 0
    finally:
        log.close()


@pytest.mark.parametrize("seed", [24, 25])
def test_kill9_mid_stream_loses_and_doubles_nothing(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path, home = tmp_path / "EventLog", tmp_path / "home"
    path.write_text("")
    # pieces of random size, cut anywhere (mid-line, mid-event), as a writer's buffer flushes;
    # EVENT_LOG rotation half way through, between two events, as the writer rotates
    pieces: list[str] = []
    for part in (range(JOBS // 2), range(JOBS // 2, JOBS)):
        text = "".join(job_lifecycle(n) for n in part)
        cuts = sorted(rng.sample(range(1, len(text)), 29))
        pieces += [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    argv = cli_argv(home, "follow", "events", "--schedd", "ap1.example.org", "--interval",
                    "0.02", str(path))
    kills = mid_stream = 0
    proc = subprocess.Popen(argv, env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for k, piece in enumerate(pieces):
            if k == len(pieces) // 2:
                os.rename(path, tmp_path / "EventLog.old")
                path.write_text("")
            with open(path, "a") as out:
                out.write(piece)
            if k % 6 == 5:
                before = _appended(home)
                deadline = time.monotonic() + 20
                while _appended(home) == before and time.monotonic() < deadline:
                    time.sleep(0.005)  # until this process commits something...
                time.sleep(rng.uniform(0, 0.03))  # ...then kill it somewhere in its work
                mid_stream += _appended(home) < 3 * JOBS
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                proc = subprocess.Popen(argv, env=cli_env(), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    r = cli(home, "follow", "events", "--schedd", "ap1.example.org", "--once", str(path))
    assert r.returncode == 0, r.stderr
    assert kills == 10 and mid_stream >= 8
    elog = event_log(home)
    evs = events(elog)
    expected = [(t, f"{1000 + n}.0") for n in range(JOBS)
                for t in ("job.submitted", "job.started", "job.stopped")]
    got = [(e.type, e.data.job_id) for e in evs]
    assert [x for x in expected if x not in got] == [] and len(evs) == 3 * JOBS, r.stdout
    assert [(e.type, e.data.job_id) for e in evs] == expected
    assert [e.seq for e in evs] == list(range(1, 3 * JOBS + 1))
    assert len({e.id for e in evs}) == 3 * JOBS
    assert elog.dead_letters(EVENTS) == []
