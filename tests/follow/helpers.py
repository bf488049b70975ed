"""Shared by the follower tests: a log under a temporary home, job event log text as HTCondor
writes it (src/condor_utils/condor_event.cpp formatBody), and running the CLI."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from schemas.events import Envelope
from streams.log.events import DeadLetter, EventLog, ensure_topics, open_log
from streams.log.topics import EVENTS

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
FOLLOW_DATA = DATA / "follow"


def event_log(home: Path) -> EventLog:
    log = open_log(None, home)
    ensure_topics(log)
    return EventLog(log)


def events(elog: EventLog) -> list[Envelope]:
    return [env for _, env in elog.read(EVENTS)]


def dead(elog: EventLog) -> list[DeadLetter]:
    return elog.dead_letters(EVENTS)


def _header(number: int, job: str, clock: str) -> str:
    cluster, proc = job.split(".")
    return f"{number:03d} ({int(cluster):03d}.{int(proc):03d}.000) 2025-11-22 {clock}Z "


def job_info(job: str, clock: str, trigger: int, owner: str, **attrs: Any) -> str:
    """A JobAdInformationEvent (028) as the schedd writes it after each EVENT_LOG event."""
    cluster, proc = job.split(".")
    lines = [_header(28, job, clock) + "Job ad information event triggered.",
             f"Proc = {proc}", f'Owner = "{owner}"', f'User = "{owner}@example.org"']
    lines += [f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
              for k, v in attrs.items()]
    lines += [f"TriggerEventTypeNumber = {trigger}", f"Cluster = {cluster}", "Subproc = 0",
              "EventTypeNumber = 28"]
    return "\n".join(lines) + "\n...\n"


def submit(job: str, clock: str, owner: str = "alice") -> str:
    return (_header(0, job, clock) + "Job submitted from host: <192.0.2.10:9618?alias=ap1>\n"
            "...\n" + job_info(job, clock, 0, owner, RequestCpus=1))


def execute(job: str, clock: str, slot: str, owner: str = "alice") -> str:
    return (_header(1, job, clock) + "Job executing on host: <192.0.2.20:9618>\n"
            f"\tSlotName: {slot}\n\tCpus = 1\n\tMemory = 1024\n...\n"
            + job_info(job, clock, 1, owner, RequestCpus=1, RemoteHost=slot))


def terminate(job: str, clock: str, owner: str = "alice") -> str:
    usage = "\t\tUsr 0 00:00:00, Sys 0 00:00:00  -  "
    body = ("Job terminated.\n\t(1) Normal termination (return value 0)\n"
            + "".join(f"{usage}{w}\n" for w in ("Run Remote Usage", "Run Local Usage",
                                                 "Total Remote Usage", "Total Local Usage"))
            + "\t0  -  Run Bytes Sent By Job\n\t0  -  Run Bytes Received By Job\n"
            "\t0  -  Total Bytes Sent By Job\n\t0  -  Total Bytes Received By Job\n")
    return _header(5, job, clock) + body + "...\n" + job_info(job, clock, 5, owner)


def clock(seconds: int) -> str:
    return f"{10 + seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def job_lifecycle(n: int) -> str:
    """Submit, execute and terminate of job `n`.0 (three job.* events)."""
    job = f"{1000 + n}.0"
    return (submit(job, clock(n)) + execute(job, clock(n + 1), f"slot1_{n}@ep1.example.org")
            + terminate(job, clock(n + 2)))


def cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_argv(home, *args), capture_output=True, text=True, timeout=timeout,
                          env=cli_env(), cwd=ROOT)


def cli_argv(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", "from services.cli import main; raise SystemExit(main())",
            "--home", str(home), *args]


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}
