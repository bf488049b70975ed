"""Builders for negotiator tests: slot and job ads in HTCondor's JSON form."""
from __future__ import annotations

from typing import Any


def slot(i: int, **kw: Any) -> dict[str, Any]:
    """An unclaimed 1-core static slot that starts any job fitting its memory."""
    d: dict[str, Any] = {
        "Name": f"slot{i}@host{i}.example.org", "Machine": f"host{i}.example.org",
        "SlotID": i, "Cpus": 1, "Memory": 4096, "Disk": 1_000_000,
        "State": "Unclaimed", "Activity": "Idle", "Arch": "X86_64", "OpSys": "LINUX",
        "Requirements": "/Expr(START)/", "START": "/Expr(TARGET.RequestMemory <= MY.Memory)/",
        "Rank": 0.0, "CurrentRank": 0.0,
    }
    d.update(kw)
    return d


def job(cluster: int, proc: int = 0, **kw: Any) -> dict[str, Any]:
    """An idle 1-core 1 GB job that runs on any Linux slot with enough memory."""
    d: dict[str, Any] = {
        "ClusterId": cluster, "ProcId": proc, "QDate": 1_700_000_000 + cluster, "JobPrio": 0,
        "RequestCpus": 1, "RequestMemory": 1024, "RequestDisk": 1024, "JobUniverse": 5,
        "Requirements": "/Expr(TARGET.OpSys == \"LINUX\" && TARGET.Memory >= RequestMemory)/",
    }
    d.update(kw)
    return d


def jobs(cluster: int, n: int, **kw: Any) -> list[dict[str, Any]]:
    """n procs of one cluster."""
    return [job(cluster, p, **kw) for p in range(n)]
