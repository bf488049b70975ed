"""Leases on the log: which of several identical services (an active negotiator and its
standbys) may write, decided by the log's own machinery rather than by a daemon of ours.

Why not condor_had: HTCondor's high-availability daemon elects a leader over its own
protocol; the log already has one. On Kafka the lease is membership of a consumer group
(`KafkaLog.lease`): the member assigned partition 0 of the topic is active, and the group
coordinator hands it to a standby once the active one stops heartbeating (kill -9 included)
within the session timeout. On the embedded log (one machine) it is a record in a file
beside the log — holder, epoch, deadline — that the holder renews while it makes progress,
as a Kafka member heartbeats: a holder that dies or is stopped (SIGSTOP, a hung disk) stops
renewing, and after `timeout` seconds a standby takes the lease over with the next epoch.
An `flock` only guards each read-modify-write of the record (milliseconds), never the
lease itself, so a stopped process cannot hold it for ever.

A lease is not a fence by itself: a holder that stalls past its deadline may still believe it
holds it. Writers therefore append inside `fence()`, which checks, under the same lock a
takeover takes, that the lease is still theirs at the epoch they took, and refuses
(`LeaseLostError`) if a standby has taken it since.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ContextManager, Protocol

from streams.log.files import open_private
from streams.log.port import LogError

__all__ = ["Lease", "FileLease", "LeaseLostError", "lease_file_name", "open_lease_file"]


class LeaseLostError(LogError):
    """An append under a lease this process no longer holds (a standby took it over)."""


class Lease(Protocol):
    """Exclusive right to act, held by at most one live process."""

    def held(self) -> bool:
        """Whether this process holds the lease now (cheap; called every poll, which renews
        it). A process that does not hold it tries to take it."""

    def fence(self) -> ContextManager[None]:
        """Run the block (an append) only if the lease is still this process's; raises
        LeaseLostError otherwise, and keeps a takeover out until the block is done."""

    def release(self) -> None:
        """Give the lease up (a standby takes it at once)."""


def lease_file_name(name: str) -> str:
    """A lease name as a file name (a daemon name like `negotiator@cm.example.org`)."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", name) + ".lease"


def open_lease_file(path: Path) -> int:
    """The lease file's descriptor, read-write, created if missing (the one place it is
    opened)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return open_private(path, os.O_RDWR | os.O_CREAT)


#: seconds a contender waits for the lease file's guard lock before passing over its holder
#: (`FileLease._locked`): held for milliseconds by a live one
GUARD_WAIT = 0.5


class FileLease:
    """A lease with a deadline, recorded in the file at `path`.

    `timeout` is the session timeout (POOLLEDGER_LEASE_TIMEOUT): the holder renews the
    deadline at each `held()`, and a record whose deadline has passed may be taken over.
    `clock` is the wall clock shared by the processes on this machine (a test may pass its
    own); a deadline further ahead than one timeout (a clock stepped back, a record from
    before a reboot) counts as expired.
    """

    def __init__(self, path: Path, *, timeout: float = 6.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.path, self.timeout, self.clock = path, timeout, clock
        try:
            self._fd: int | None = open_lease_file(path)
        except OSError as exc:
            raise LogError(f"{path}: cannot open the lease file: {exc.strerror}") from exc
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.epoch: int | None = None  # the epoch this process took, while it holds it
        self._renewed = 0.0

    # -- the record ----------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The record under the guard lock, which a live contender holds for milliseconds.
        A guard not to be had within GUARD_WAIT is passed over: its holder was stopped
        (SIGSTOP) inside those milliseconds, and waiting on it would keep every contender
        out for as long as it stays stopped. The record's deadline still decides (a stopped
        holder's lapses), and a holder resumed later finds the epoch moved on."""
        assert self._fd is not None
        give_up = time.monotonic() + min(GUARD_WAIT, self.timeout / 4)
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > give_up:
                    yield self._read()  # without the guard
                    return
                time.sleep(0.005)
        try:
            yield self._read()
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        assert self._fd is not None
        raw = os.pread(self._fd, 4096, 0)
        try:
            record = json.loads(raw)
        except ValueError:  # empty (new), or a bare flock-era pid line
            return {}
        return record if isinstance(record, dict) else {}

    def _write(self, record: dict[str, Any]) -> None:
        assert self._fd is not None
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def _mine(self, record: dict[str, Any]) -> bool:
        return (self.epoch is not None and record.get("holder") == self.holder
                and record.get("epoch") == self.epoch)

    def _expired(self, record: dict[str, Any], now: float) -> bool:
        deadline = record.get("deadline")
        if not isinstance(deadline, (int, float)):
            return True
        return not now <= deadline <= now + self.timeout

    # -- the lease -----------------------------------------------------------------------

    def _claim(self, record: dict[str, Any], now: float) -> bool:
        """Renew the lease if it is this process's at its epoch, or take it with the next
        epoch if it has lapsed and this process held none (under the guard lock)."""
        if not self._mine(record):
            if self.epoch is not None or not self._expired(record, now):
                self.epoch = None
                return False
            epoch = record.get("epoch")
            self.epoch = (epoch if isinstance(epoch, int) else 0) + 1
        self._write({"holder": self.holder, "epoch": self.epoch,
                     "deadline": now + self.timeout, "pid": os.getpid()})
        self._renewed = now
        return True

    def held(self) -> bool:
        if self._fd is None:
            return False
        if self.epoch is not None and self.clock() - self._renewed < self.timeout / 10:
            return True  # renewed a moment ago: spare the file a write every poll
        with self._locked() as record:
            return self._claim(record, self.clock())

    @contextmanager
    def fence(self) -> Iterator[None]:
        if self._fd is None:
            raise LeaseLostError(f"{self.path}: the lease was released")
        with self._locked() as record:
            stale = self.epoch
            if not self._claim(record, self.clock()):
                taken = f" by {record.get('holder')} at epoch {record.get('epoch')}"
                what = "is held" if stale is None else f"of epoch {stale} was taken over"
                raise LeaseLostError(f"{self.path}: the lease {what}{taken}")
            yield

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if self.epoch is not None:
                with self._locked() as record:
                    if self._mine(record):
                        self._write({**record, "deadline": 0.0})  # a standby takes it at once
        finally:
            os.close(self._fd)
            self._fd, self.epoch = None, None
