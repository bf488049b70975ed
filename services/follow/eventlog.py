"""A schedd's job event log (EVENT_LOG, or a user log) followed into `job.*` events.

HTCondor's own reader parses the file: `htcondor2.JobEventLog`, opened afresh at the stored
offset on every poll (its pickled state is the offset; one reader kept across polls fails on
an event that was half written when it first looked). What it returns becomes the events the
simulated schedd emits (services/pool/schedd.py), so every fold reads a real pool as it reads
the simulation:

| job event log                                   | event                                  |
|-------------------------------------------------|----------------------------------------|
| 000 submit                                      | job.submitted (JobStatus 1)            |
| 001 execute                                     | job.started                            |
| 004 evicted, 007 shadow exception, 024 reconnect failed, of a running job | job.stopped evicted |
| 005 terminated                                  | job.stopped completed                  |
| 009 aborted (condor_rm)                         | job.stopped removed                    |
| 012 held                                        | job.stopped held                       |
| 013 released                                    | job.submitted (JobStatus 1 again)      |
| 028 job ad information                          | joins the event it follows             |

What an event log does not say, and where it comes from instead:
- the submitter. A SubmitEvent names only the submitting host. The schedd writes the job
  attributes listed in EVENT_LOG_JOB_AD_INFORMATION_ATTRS after every event (event 028);
  with `Owner`, `User` and `AccountingGroup` among them the submitter is HTCondor's:
  `AccountingGroup@<UID domain>`, else `User` (`Owner@UID_DOMAIN`). Each event waits for the
  028 that may follow it: until the next event, or, in a log that has shown no 028 yet, for
  one poll at the end of what is written (then it goes without). A job whose submitter cannot be known
  is dead-lettered (file, byte offset, job id), never charged to a guessed name, unless the
  follower is told whose log it is (`--submitter`, for one user's log).
- the slot: the execute event's `SlotName` (HTCondor 23+), else the 028's `RemoteHost`, else
  the execute host's address; kept per job so its stop names the same slot.
- the slot weight: the 028's `MachineAttrSlotWeight0` (SYSTEM_JOB_MACHINE_ATTRS holds
  SlotWeight by default), else the slot's Cpus (HTCondor's default SLOT_WEIGHT), else the
  job's RequestCpus, else 1. Resources: the execute event's properties (Cpus, Memory, Disk,
  GPUs of the slot), else the job's Request* attributes.
- the schedd: the follower's `--schedd` (the schedd's Name), as job keys and history ads need.
- times: each event's own timestamp, as htcondor2 reads it (an event log written without
  ISO_DATE has no year; htcondor2 assumes the current one).

Ids are `eventlog@<name>:<seq>`, seq counted in the position, so a re-read after a crash on
Kafka yields the same ids and the ledger drops the copies. An event the reader cannot parse
(ULOG_RD_ERROR) is dead-lettered with its bytes up to the next `...` line, and reading goes on.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import htcondor2
from htcondor2 import JobEventType as T

from schemas.classads import ClassAd
from schemas.events import JobStarted, JobStopped, JobSubmitted, Payload, StopReason
from services.follow.base import Chunk, Follower, Position
from services.pool.schedd import submitter_name

__all__ = ["JobEventLogFollower", "submitter_of"]

#: attributes of an event itself, not of the job (left out of a 028's job attributes)
_EVENT_ATTRS: Final = frozenset({
    "mytype", "eventtypenumber", "eventtime", "cluster", "proc", "subproc", "triggereventtypename",
    "triggereventtypenumber", "currenttime", "submithost", "lognotes"})
#: a running job's run ended (its slot is given back), the job stays queued
_RUN_ENDED: Final = {T.JOB_EVICTED: "evicted", T.SHADOW_EXCEPTION: "evicted",
                     T.JOB_RECONNECT_FAILED: "evicted"}
_LEFT: Final = {T.JOB_TERMINATED: "completed", T.JOB_ABORTED: "removed"}
_CONVERTED: Final = frozenset({T.SUBMIT, T.EXECUTE, T.JOB_HELD, T.JOB_RELEASED,
                               *_RUN_ENDED, *_LEFT})
_SYNC: Final = b"...\n"


def _plain(value: Any) -> Any:
    """A JSON value of an event attribute, None for expressions and nested ads."""
    if isinstance(value, bool) or isinstance(value, (int, float, str)):
        return value
    return None


def _bytes(path: Path, start: int, end: int) -> bytes:
    """The bytes of one event (for its dead letter); empty if the file is gone."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))
    except OSError:
        return b""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def submitter_of(job: dict[str, Any], uid_domain: str) -> str | None:
    """HTCondor's submitter name from a job's attributes: `AccountingGroup@<domain>`, else the
    owner's (`nice-user.<owner>` for a NiceUser job; services.pool.schedd.submitter_name), the
    domain being `User`'s when the job has one, else UID_DOMAIN; None when unknown."""
    user = job.get("User")
    domain = user.rpartition("@")[2] if isinstance(user, str) and "@" in user else uid_domain
    group = job.get("AccountingGroup")
    if isinstance(group, str) and group:
        return f"{group}@{domain}"
    owner = job.get("Owner")
    if not isinstance(owner, str) or not owner:
        owner = user.rpartition("@")[0] if isinstance(user, str) and "@" in user else None
    if not owner:
        return None
    return submitter_name(owner, domain, nice_user=job.get("NiceUser") is True)[1]


class JobEventLogFollower(Follower):
    """Follows a job event log (see the module doc)."""

    kind = "eventlog"

    def __init__(self, *args: Any, schedd: str, uid_domain: str, submitter: str | None = None,
                 **kw: Any) -> None:
        self.schedd = schedd
        self.uid_domain = uid_domain
        #: the submitter of jobs whose log names none (one user's log without 028 events)
        self.submitter = submitter
        #: the offset of the event held at a clean end, and in which poll (`_waited`)
        self._held_at: tuple[int, int] | None = None
        super().__init__(*args, **kw)

    def new_file(self, carry: dict[str, Any]) -> None:
        # the jobs stay known (a rotated EVENT_LOG goes on with the same queue); an event held
        # for its 028 is emitted by the next poll of the new file as the log's next event
        carry.setdefault("jobs", {})

    # -- reading ---------------------------------------------------------------------------

    def _reader(self, path: Path, offset: int) -> htcondor2.JobEventLog:
        jel = htcondor2.JobEventLog(str(path))
        state, _ = jel.__getstate__()
        jel.__setstate__((state, offset))  # the pickle protocol: the reader at `offset`
        return jel

    def read(self, path: Path, pos: Position, final: bool) -> Chunk:
        events: list[Any] = []
        dead = []
        offset = pos.offset
        jel = self._reader(path, offset)
        fd = os.open(path, os.O_RDONLY)
        try:
            while len(events) < self.batch:
                try:
                    ev = next(jel.events(0))
                except (StopIteration, htcondor2.HTCondorException) as exc:
                    # nothing more, or an event the reader cannot parse: complete (its `...`
                    # line written, or the file rotated away) means unreadable
                    end, raw = self._skip(path, offset, final)
                    if end is None or not raw.strip():
                        if end is not None:
                            offset = end
                        if final or (end is None and not raw and not pos.carry.get("ad_info")
                                     and self._clean_end(path, offset) and self._waited(pos)):
                            # no 028 will follow (a rotated file; a log that has shown none,
                            # once the event waited a whole poll at a clean end of the file)
                            held, unknown = self.finish(pos)
                            events += held
                            dead += unknown
                        break
                    why = "not a job event" if isinstance(exc, StopIteration) else str(exc)
                    dead.append(self.dead_letter(path, offset, f"unreadable job event ({why})",
                                                 raw))
                    offset = end
                    jel.close()
                    jel = self._reader(path, offset)
                    continue
                after = jel.__getstate__()[1]
                if not final and os.pread(fd, 1, after - 1) != b"\n":
                    break  # its `...` line is not finished (the reader takes `...` at EOF)
                events += self._convert(ev, path, offset, after, pos, dead)
                offset = after
        finally:
            os.close(fd)
            jel.close()
        return Chunk(events, dead, offset)

    def _waited(self, pos: Position) -> bool:
        """Whether the held event was held at the end of the previous poll too (so no 028
        came within a poll interval); the first time, remember it and say no."""
        pending = pos.carry.get("pending")
        if pending is None:
            return False
        if self._held_at is not None and self._held_at[0] == pending["offset"]:
            return self._held_at[1] < self.polls
        self._held_at = (pending["offset"], self.polls)
        return False

    @staticmethod
    def _clean_end(path: Path, offset: int) -> bool:
        """Nothing after `offset` (no event being written)."""
        return path.stat().st_size <= offset

    def _skip(self, path: Path, offset: int, final: bool) -> tuple[int | None, bytes]:
        """The offset after the `...` line that ends the event at `offset` (None if it is not
        written yet and more may come), and the event's bytes."""
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        at = 0
        while True:
            i = data.find(_SYNC, at)
            if i < 0:
                return (offset + len(data), data) if final else (None, b"")
            if i == 0 or data[i - 1:i] == b"\n":
                return offset + i + len(_SYNC), data[:i + len(_SYNC)]
            at = i + 1

    # -- converting ------------------------------------------------------------------------

    def _convert(self, ev: Any, path: Path, offset: int, end: int, pos: Position,
                 dead: list[Any]) -> list[Any]:
        carry = pos.carry
        jobs: dict[str, dict[str, Any]] = carry.setdefault("jobs", {})
        etype = ev.type
        job_id = f"{ev.cluster}.{ev.proc}"
        out: list[Any] = []
        pending = carry.get("pending")
        if etype == T.JOB_AD_INFORMATION:
            carry["ad_info"] = True
            info = jobs.setdefault(job_id, {})
            info.update((k, v) for k, v in ((k, _plain(v)) for k, v in ev.items())
                        if v is not None and k.lower() not in _EVENT_ATTRS)
            if pending is not None and pending["job"] == job_id:
                carry["pending"] = None
                out += self._emit(pending, path, pos, dead)
            return out
        if etype not in _CONVERTED:
            return out
        if pending is not None:
            carry["pending"] = None
            out += self._emit(pending, path, pos, dead)
        props = ev.get("ExecuteProps")
        item = {"type": int(etype), "job": job_id, "ts": float(ev.timestamp), "offset": offset,
                "end": end,
                "slot": _plain(ev.get("SlotName")), "host": _plain(ev.get("ExecuteHost")),
                "props": ({k: _plain(v) for k, v in props.items() if _plain(v) is not None}
                          if isinstance(props, ClassAd) else {})}
        carry["pending"] = item  # its 028 may come next
        return out

    def finish(self, pos: Position) -> tuple[list[Any], list[Any]]:
        pending = pos.carry.get("pending")
        if pending is None:
            return [], []
        pos.carry["pending"] = None
        dead: list[Any] = []
        return self._emit(pending, self.path, pos, dead), dead

    def _emit(self, item: dict[str, Any], path: Path, pos: Position,
              dead: list[Any]) -> list[Any]:
        """The events of one job event (`item`), the job's known attributes updated."""
        jobs: dict[str, dict[str, Any]] = pos.carry.setdefault("jobs", {})
        job_id, etype, ts = item["job"], T(item["type"]), item["ts"]
        info = jobs.setdefault(job_id, {})
        submitter = submitter_of(info, self.uid_domain) or self.submitter
        if submitter is None:
            dead.append(self.dead_letter(
                path, item["offset"], f"job {job_id}: {etype.name} of a job whose submitter is "
                "unknown (no Owner, User or AccountingGroup: list them in "
                "EVENT_LOG_JOB_AD_INFORMATION_ATTRS)", _bytes(path, item["offset"], item["end"])))
            if etype in _LEFT:
                jobs.pop(job_id, None)
            return []
        payloads: list[Payload] = []
        if etype in (T.SUBMIT, T.JOB_RELEASED):
            info.pop("_slot", None)
            ad = {k: v for k, v in info.items() if not k.startswith("_") and k != "RemoteHost"}
            ad.update({"ClusterId": int(job_id.split(".")[0]),
                       "ProcId": int(job_id.split(".")[1]), "JobStatus": 1})
            ad.setdefault("QDate", int(ts))
            payloads.append(JobSubmitted(job_id=job_id, schedd=self.schedd, submitter=submitter,
                                         ad=ad))
        elif etype == T.EXECUTE:
            props: dict[str, Any] = item["props"]
            slot = item["slot"] or info.get("RemoteHost") or item["host"] or f"unknown@{job_id}"
            resources = {k: props[k] for k in ("Cpus", "Memory", "Disk", "GPUs")
                         if _number(props.get(k)) is not None}
            if not resources:
                resources = {k[len("Request"):]: info[k] for k in
                             ("RequestCpus", "RequestMemory", "RequestDisk", "RequestGPUs")
                             if _number(info.get(k)) is not None}
            weight = next((w for w in (_number(info.get("MachineAttrSlotWeight0")),
                                       _number(props.get("Cpus")),
                                       _number(info.get("RequestCpus"))) if w is not None and w > 0),
                          1.0)
            info["_slot"] = slot
            limits = info.get("ConcurrencyLimits")
            payloads.append(JobStarted(job_id=job_id, schedd=self.schedd, submitter=submitter,
                                       slot=str(slot), slot_weight=weight, resources=resources,
                                       concurrency_limits=limits if isinstance(limits, str) else ""))
        else:
            slot = info.pop("_slot", None)
            reason: StopReason
            if etype in _LEFT:
                reason = _LEFT[etype]  # type: ignore[assignment]
                jobs.pop(job_id, None)
            elif etype == T.JOB_HELD:
                reason = "held"
            elif slot is None:
                return []  # the run had already ended: nothing left to stop
            else:
                reason = _RUN_ENDED[etype]  # type: ignore[assignment]
            payloads.append(JobStopped(job_id=job_id, slot=str(slot or ""), reason=reason,
                                       schedd=self.schedd, submitter=submitter))
        return [self.event(p, ts, pos) for p in payloads]
