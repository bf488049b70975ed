"""Pie-slice arithmetic: how many weighted slots each submitter may take in one spin.

Pure functions, no I/O. A submitter's share of the pie is proportional to 1/EUP among the
submitters still negotiating in the group; its limit is that share of the pie minus what it
already uses, capped by its ceiling headroom (Ceiling - int(usage)); the pie left is the sum
of the limits, capped by the group's room under its quota (REFERENCE "Negotiation").
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EPSILON = 1e-6  # tolerance for float shares: 49.999999995 of a 50-slot pie is 50


@dataclass(frozen=True, slots=True)
class Slice:
    """One submitter's standing at the start of a spin."""

    name: str
    eup: float
    usage: float
    ceiling: float = -1.0
    floor: float = 0.0


def ceiling_headroom(ceiling: float, usage: float) -> float:
    """Room under a submitter ceiling (-1 = none): Ceiling - int(usage), never negative."""
    if ceiling < 0:
        return float("inf")
    return max(0.0, ceiling - int(usage))


def shares(slices: Sequence[Slice]) -> list[float]:
    """share_i = (1/EUP_i) / sum_j (1/EUP_j); EUPs at or below zero count as the minimum."""
    inv = [1.0 / max(s.eup, EPSILON) for s in slices]
    total = sum(inv)
    return [v / total for v in inv] if total > 0 else [0.0 for _ in slices]


def spin_limits(slices: Sequence[Slice], pie_size: float, group_room: float) -> tuple[list[float], float]:
    """Per-submitter limits for one spin and the pie left (sum of limits, capped by the room).

    limit_i = max(0, share_i * pie_size - usage_i), then capped by the ceiling headroom.
    """
    limits = []
    for s, share in zip(slices, shares(slices)):
        limit = max(0.0, share * pie_size - s.usage)
        limits.append(min(limit, ceiling_headroom(s.ceiling, s.usage)))
    pie_left = min(sum(limits), max(0.0, group_room))
    return limits, pie_left


def floor_limits(slices: Sequence[Slice], group_room: float) -> tuple[list[float], float]:
    """Limits for the below-floor round: what brings each submitter up to its floor (capped by
    its ceiling); only submitters whose usage is under their floor take part."""
    limits = [min(max(0.0, s.floor - s.usage), ceiling_headroom(s.ceiling, s.usage)) for s in slices]
    return limits, min(sum(limits), max(0.0, group_room))


def spin_order(slices: Sequence[Slice], limits: Sequence[float]) -> list[int]:
    """Indices in negotiation order: EUP ascending, then usage/(usage+limit), then name."""
    def key(i: int) -> tuple[float, float, str]:
        s, lim = slices[i], limits[i]
        denom = s.usage + lim
        return (s.eup, s.usage / denom if denom > 0 else 0.0, s.name)
    return sorted(range(len(slices)), key=key)
