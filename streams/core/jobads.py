"""The job-ad fold: each queued job's ClassAd as submitted, for the negotiator.

Why a fold of its own: the demand fold (`jobs`) keeps a job's status and weight, not its ad,
but the matchmaker needs the ad (Requirements, Rank, Request*, JobPrio, ConcurrencyLimits,
QDate, ...). Folded here, by every runner, it is part of the ledger a snapshot restores, so a
negotiator started from a snapshot offers the same jobs as one that folded the whole log.

An ad is kept by job key (`schedd#cluster.proc`) from `job.submitted` until the job leaves
the queue (`job.stopped` completed/removed naming its schedd, or its `job.history` ad). The
ad is stored as the event carried it (not copied): events are immutable.

It is kept out of the ledger's canonical JSON (`Ledger.to_json`, whose digests the runners
and the golden tests compare): the ads are the log's own input, and the snapshot stores them
beside it (`Ledger.to_snapshot`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from schemas.events import JobHistory, JobStopped, JobSubmitted

__all__ = ["JobAdsState", "on_submitted", "on_stopped", "on_history"]

_LEAVES: Final = frozenset({"completed", "removed"})


@dataclass(slots=True)
class JobAdsState:
    """Queued jobs' ads by job key, with the schedd that submitted them."""

    ads: dict[str, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {k: {"schedd": s, "ad": dict(a)} for k, (s, a) in sorted(self.ads.items())}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> JobAdsState:
        return cls({str(k): (str(v["schedd"]), dict(v["ad"])) for k, v in doc.items()})


def on_submitted(state: JobAdsState, data: JobSubmitted, key: str) -> None:
    """The job of key `key` (`jobs.job_key`) is queued with its ad."""
    state.ads[key] = (data.schedd, data.ad)


def on_stopped(state: JobAdsState, data: JobStopped, key: str) -> None:
    """The job of key `key` (`jobs.job_key`) stopped: it leaves if it completed or was
    removed (a stop naming no schedd leaves that to its history ad)."""
    if data.reason in _LEAVES and data.schedd:
        _leave(state.ads, key)


def on_history(state: JobAdsState, data: JobHistory, named: tuple[str, str]) -> None:
    """The job named by the history ad's GlobalJobId (`host#cluster.proc#qdate`) leaves,
    under its schedd's daemon name or its bare host name. `named` is what
    `jobs.history_job` read of the ad: its job id is `cluster.proc` when both are integers."""
    ad = data.ad
    gid = ad.get("GlobalJobId")
    cluster, proc = ad.get("ClusterId"), ad.get("ProcId")
    if not isinstance(gid, str) or cluster is None:
        return
    host, sep, rest = gid.partition("#")
    if sep and "#" in rest:  # two '#' at least
        job = named[0] if type(cluster) is int and type(proc) is int else f"{cluster}.{proc}"
        _leave(state.ads, f"schedd@{host}#{job}")
        _leave(state.ads, f"{host}#{job}")


def _leave(ads: dict[str, tuple[str, Mapping[str, Any]]], key: str) -> None:
    # not ads.pop(key, None): the compiled core calls that as a method by name
    if key in ads:
        del ads[key]
