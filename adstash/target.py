"""The adstash sink: `job.history` events of the log -> adstash documents -> an interface.

A `streams.sink.Target`: the runner hands it batches and moves the checkpoint after `deliver`
returned. Documents carry adstash's deterministic id (`GlobalJobId#RecordTime`), so the
at-least-once delivery of the runner is exactly-once in effect. An ad that cannot be converted
and a document the store refuses are both rejections (the sink's DLQ, with the reason).
"""
from __future__ import annotations

import getpass
import platform
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import orjson

from adstash.convert import AdstashError, ConvertError, doc_id, to_doc
from adstash.interfaces import Interface, SearchEngineOptions, make_interface
from schemas.events import JobHistory
from streams.log.files import UnsafePathError, atomic_file
from streams.log.topics import EVENTS
from streams.log.port import Log
from streams.sink import (Positions, Rejection, SinkItem, Target, TargetUnavailableError, anchors,
                          anchors_hold)

__all__ = ["AdstashTarget", "CheckpointFile", "CheckpointFileError", "adstash_metadata"]


def adstash_metadata(source: str) -> dict[str, Any]:
    """adstash's `metadata.condor_adstash_*` fields for this process."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("poolledger")
    except PackageNotFoundError:
        ours = "unknown"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return {"condor_adstash_hostname": socket.getfqdn(), "condor_adstash_username": user,
            "condor_adstash_runtime": int(time.time()),
            "condor_adstash_version": f"poolledger {ours}",
            "condor_adstash_platform": platform.platform(),
            "condor_adstash_source": source}


class AdstashTarget:
    """Indexes the job ads of `job.history` events; other events are passed over."""

    topics: tuple[str, ...] = (EVENTS,)

    def __init__(self, interface: Interface, *, name: str = "adstash",
                 source: str = "poolledger log", bunch_size: int = 250) -> None:
        self.name = name
        self.interface = interface
        self.bunch_size = max(1, bunch_size)
        self.metadata = adstash_metadata(source)
        #: documents the cluster acknowledged (the events passed over are not documents)
        self.indexed = 0
        # one sender: bulk requests stay in order and one at a time, as adstash sends them
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"sink-{name}")

    @classmethod
    def from_options(cls, interface: str, options: SearchEngineOptions, *,
                     name: str | None = None) -> AdstashTarget:
        return cls(make_interface(interface, options), name=name or f"adstash-{interface}",
                   bunch_size=options.bunch_size)

    def deliver(self, items: Sequence[SinkItem], upto: Positions) -> list[Rejection]:
        """Convert in bunches and index each bunch on a worker thread while the next one is
        converted (the cluster's work and ours overlap; a bulk request waits on I/O, free of
        the GIL). Returns once every bunch was acknowledged; any bunch the cluster did not
        acknowledge makes the whole batch unacknowledged (re-sent ids overwrite themselves)."""
        rejected: list[Rejection] = []
        pending: list[tuple[Future[dict[int, str]], list[SinkItem]]] = []
        docs: list[tuple[str, dict[str, Any]]] = []
        owners: list[SinkItem] = []
        for it in items:
            payload = it.event.data
            if not isinstance(payload, JobHistory):
                continue
            try:
                doc = to_doc(payload.ad, fallback_time=it.event.ts, metadata=self.metadata)
            except ConvertError as exc:
                rejected.append(Rejection(it, str(exc)))
                continue
            if doc is None:  # DAGMan ROOT task: adstash skips it
                continue
            docs.append((doc_id(doc), doc))
            owners.append(it)
            if len(docs) >= self.bunch_size:
                pending.append((self._sender.submit(self.interface.index, docs), owners))
                docs, owners = [], []
        if docs:
            pending.append((self._sender.submit(self.interface.index, docs), owners))
        unavailable: TargetUnavailableError | None = None
        for future, who in pending:
            try:
                refused = future.result()
            except TargetUnavailableError as exc:
                unavailable = unavailable or exc
                continue
            rejected += [Rejection(who[k], reason) for k, reason in sorted(refused.items())]
            self.indexed += len(who) - len(refused)
        if unavailable is not None:
            raise unavailable
        return rejected

    def positions(self) -> Positions | None:
        return None

    def close(self) -> None:
        self._sender.shutdown(wait=True)
        self.interface.close()


class CheckpointFileError(AdstashError):
    """A `--checkpoint_file` that cannot be read or written (it names the file)."""


class CheckpointFile:
    """condor_adstash's `--checkpoint_file`: the sink's checkpoint kept in a JSON file
    (`{"topic": {"partition": next_offset}}`) instead of the log's consumer group, written
    after the wrapped target acknowledged each batch (atomically: a crash leaves the previous
    checkpoint, and the re-sent documents overwrite themselves by id). A missing file starts
    from the beginning of the log, as adstash starts without its checkpoint.

    Beside it, `<file>.anchors` names the log it counts in (`streams.sink.anchors`): a
    checkpoint of a log since replaced (a new run in the same directory) is not continued on
    the new log, which is indexed from its start (`replaced` says so)."""

    def __init__(self, target: Target, path: Path, log: Log | None = None) -> None:
        self.target = target
        self.path = Path(path)
        self.name = target.name
        self.topics = target.topics
        self.log = log
        self.anchors_path = self.path.with_name(self.path.name + ".anchors")
        self.replaced = False

    def _write(self, path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, fsync=True) as f:
                f.write(data)
        except OSError as exc:
            raise CheckpointFileError(f"--checkpoint_file {path}: cannot write: "
                                      f"{exc.strerror or exc}") from None
        except UnsafePathError as exc:
            raise CheckpointFileError(f"--checkpoint_file: {exc}") from None

    def deliver(self, items: Sequence[SinkItem], upto: Positions) -> list[Rejection]:
        rejected = self.target.deliver(items, upto)
        self._write(self.path, orjson.dumps({t: {str(p): o for p, o in parts.items()}
                                             for t, parts in upto.items()}))
        if self.log is not None:  # any anchor of this log proves it: written after is fine
            self._write(self.anchors_path, orjson.dumps(
                [[t, p, a] for (t, p), a in sorted(anchors(self.log, upto).items())]))
        return rejected

    def _of_another_log(self) -> bool:
        if self.log is None:
            return False
        try:
            stored = {(str(t), int(p)): str(a)
                      for t, p, a in orjson.loads(self.anchors_path.read_bytes())}
        except (OSError, orjson.JSONDecodeError, TypeError, ValueError):
            return False  # a checkpoint written without anchors: trusted as it is
        return not anchors_hold(self.log, stored)

    def positions(self) -> Positions:
        if self._of_another_log():
            self.replaced = True
            return {}
        try:
            raw = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as exc:
            raise CheckpointFileError(f"--checkpoint_file {self.path}: cannot read: "
                                      f"{exc}") from None
        try:
            out = {str(t): {int(p): int(o) for p, o in parts.items()}
                   for t, parts in raw.items()}
            if any(o < 0 or p < 0 for parts in out.values() for p, o in parts.items()):
                raise ValueError("negative")
            return out
        except (AttributeError, TypeError, ValueError):
            raise CheckpointFileError(f"--checkpoint_file {self.path}: not a PoolLedger "
                                      "checkpoint ({\"topic\": {\"partition\": offset}})") from None

    def close(self) -> None:
        self.target.close()
