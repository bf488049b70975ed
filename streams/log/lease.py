"""Leases on the log: which of several identical services (an active negotiator and its
standbys) may write, decided by the log's own machinery rather than by a daemon of ours.

Why not condor_had: HTCondor's high-availability daemon elects a leader over its own
protocol; the log already has one. On Kafka the lease is membership of a consumer group
(`KafkaLog.lease`): the member assigned partition 0 of the topic is active, and the group
coordinator hands it to a standby once the active one stops heartbeating (kill -9 included)
within the session timeout. On the embedded log (one machine) it is an exclusive `flock`
on a file beside the log: the kernel releases it the moment the holder dies.

A lease is not a fence: a holder that stalls past its session timeout may still write once
before it notices. Writers therefore also check the log's end before they append (see
`services.negotiator.daemon`).
"""
from __future__ import annotations

import fcntl
import os
import re
import time
from pathlib import Path
from typing import Protocol

from streams.log.files import open_private
from streams.log.port import LogError

__all__ = ["Lease", "FileLease", "lease_file_name"]


class Lease(Protocol):
    """Exclusive right to act, held by at most one live process."""

    def held(self) -> bool:
        """Whether this process holds the lease now (cheap; called every poll). A process
        that does not hold it tries to take it."""

    def release(self) -> None:
        """Give the lease up (a standby takes it at once)."""


def lease_file_name(name: str) -> str:
    """A lease name as a file name (a daemon name like `negotiator@cm.example.org`)."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", name) + ".lease"


class FileLease:
    """An exclusive `flock` on `path`, tried without blocking at each `held()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = open_private(path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise LogError(f"{path}: cannot open the lease file: {exc.strerror}") from exc
        self._held = False

    def held(self) -> bool:
        if self._held or self._fd is None:
            return self._held
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._held = True
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()} {time.time():.3f}\n".encode())  # for a curious admin
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        self._held = False
