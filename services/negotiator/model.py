"""The negotiator's plain input snapshot, configuration and result types.

The matchmaker is designed against this snapshot rather than the accountant/quota/limit
folds' internals, so it stays a pure function that a replay can re-run exactly: everything a
cycle reads (priorities, quotas, limits, ads, idle jobs, `now`) is in `CycleInput`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

import classad2

from schemas.config import to_bool, to_float, to_int
from services.negotiator.errors import InvalidInputError

Ad = Union[Mapping[str, Any], classad2.ClassAd]
ROOT_GROUP = "<none>"
CONCURRENCY_LIMIT_DEFAULT = 2308032.0

DEFAULT_PRE_JOB_RANK = (
    "(10000000 * My.Rank) + (1000000 * (RemoteOwner =?= UNDEFINED)) - (100000 * Cpus) - Memory")
DEFAULT_POST_JOB_RANK = (
    "(RemoteOwner =?= UNDEFINED) * (ifThenElse(isUndefined(KFlops), 1000, Kflops) - SlotID"
    " - 1.0e10 * (Offline =?= True))")
DEFAULT_PREEMPTION_RANK = (
    "(RemoteUserPrio * 1000000) - ifThenElse(isUndefined(TotalJobRuntime), 0, TotalJobRuntime)")


@dataclass(frozen=True, slots=True)
class SubmitterInput:
    """A submitter as the accountant sees it at cycle start.

    `eup` is the effective user priority (lower is better); `weighted_usage` the weighted
    slots it holds now; `floor` 0 = none, `ceiling` -1 = unlimited.
    """

    name: str
    eup: float
    weighted_usage: float = 0.0
    group: str = ROOT_GROUP
    floor: float = 0.0
    ceiling: float = -1.0
    priority_factor: float = 1000.0
    schedd: str = ""


@dataclass(frozen=True, slots=True)
class GroupInput:
    """A group's effective quota (surplus included, from quotas.py) and weighted usage."""

    name: str
    quota: float
    usage: float = 0.0
    autoregroup: bool = False
    accept_surplus: bool = False


@dataclass(frozen=True)
class CycleInput:
    """Everything one negotiation cycle reads.

    `jobs` maps submitter name to its idle job ads; `slots` are machine ads (HTCondor JSON
    form dicts or classad2 ClassAds). Without `groups` the pool is one `<none>` group.
    `group_order` is the GROUP_SORT_EXPR order (empty: starvation order computed here).
    Concurrency limits: `limit_max` maps lowercased names to maxima, or is a callable
    (e.g. `LimitsConfig.max_for`); `limit_usage` None rebuilds counts from claimed slots.
    """

    now: float
    cycle: int
    submitters: Sequence[SubmitterInput]
    slots: Sequence[Ad]
    jobs: Mapping[str, Sequence[Ad]]
    groups: Sequence[GroupInput] = ()
    group_order: Sequence[str] = ()
    limit_max: Mapping[str, float] | Callable[[str], float] = field(default_factory=dict)
    limit_default: float = CONCURRENCY_LIMIT_DEFAULT
    limit_prefix_default: Mapping[str, float] = field(default_factory=dict)
    limit_usage: Mapping[str, float] | None = None
    #: jobs each schedd (by host, "schedd@" optional) may still start: its MAX_JOBS_RUNNING
    #: less its running jobs; once its matches reach that the schedd offers no more jobs
    #: (HTCondor's schedd ends the negotiation). Absent: no limit.
    schedd_room: Mapping[str, int] = field(default_factory=dict)


_T = TypeVar("_T")


def _typed(name: str, text: str, convert: Callable[[str], _T]) -> _T:
    """Knob text converted as the settings convert it (schemas.config: the one typed path)."""
    try:
        return convert(text.strip())
    except ValueError as exc:
        raise InvalidInputError(f"{name.upper()}: {exc}: {text!r}") from None


#: HTCondor's older spellings of the group round-robin knobs, read when the current name is
#: unset (as GroupEntry.cpp does).
_OLDER_SPELLINGS = {"group_quota_max_allocation_rounds": "hfs_max_allocation_rounds",
                    "group_quota_round_robin_rate": "hfs_round_robin_rate"}


@dataclass(frozen=True)
class NegotiatorConfig:
    """Negotiator knobs (HTCondor names, lowercased), with HTCondor's defaults.

    `significant_attributes` None uses `DEFAULT_SIGNIFICANT_ATTRIBUTES`; referenced
    attributes are always added. `fast_path` False evaluates everything with classad2.
    """

    negotiator_pre_job_rank: str = DEFAULT_PRE_JOB_RANK
    negotiator_post_job_rank: str = DEFAULT_POST_JOB_RANK
    preemption_requirements: str = "False"
    preemption_rank: str = DEFAULT_PREEMPTION_RANK
    negotiator_consider_preemption: bool = True
    #: ALLOW_PSLOT_PREEMPTION: dynamic slots are preempted only as a group, through their
    #: partitionable slot, for jobs with WantPslotPreemption
    allow_pslot_preemption: bool = False
    negotiator_slot_constraint: str | None = None
    negotiate_all_jobs_in_cluster: bool = False
    significant_attributes: tuple[str, ...] | None = None
    group_quota_max_allocation_rounds: int = 3
    #: GROUP_QUOTA_ROUND_ROBIN_RATE: each allocation round raises every group's limit by this
    #: many slots at a time (GroupEntry.cpp's round robin), so groups competing for the same
    #: slots share them; None (HTCondor's DBL_MAX) negotiates each group once for its limit.
    group_quota_round_robin_rate: float | None = None
    negotiator_strict_enforce_quota: bool = True
    negotiator_use_slot_weights: bool = True
    max_spins: int = 200
    fast_path: bool = True
    #: Negotiation time limits in seconds (HTCondor NEGOTIATOR_MAX_TIME_PER_*), measured with
    #: the clock injected into `negotiate`; a limit is reached once the time spent equals it.
    negotiator_max_time_per_submitter: float = 60.0
    negotiator_max_time_per_schedd: float = 120.0
    negotiator_max_time_per_cycle: float = 1200.0
    negotiator_max_time_per_piespin: float = 120.0
    #: Processes a cycle may use (NEGOTIATOR_WORKERS): above 1, a large cycle sorts its job
    #: queues in a forked child too when a core is idle; the result is the serial one.
    negotiator_workers: int = 2

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, str]) -> NegotiatorConfig:
        """Build from condor_config-style knob names (case-insensitive); unknown knobs ignored."""
        low = {k.lower(): v for k, v in knobs.items()}
        kw: dict[str, Any] = {}
        for name in ("negotiator_pre_job_rank", "negotiator_post_job_rank",
                     "preemption_requirements", "preemption_rank", "negotiator_slot_constraint"):
            if name in low:
                kw[name] = low[name]
        for name in ("negotiator_consider_preemption", "negotiate_all_jobs_in_cluster",
                     "negotiator_strict_enforce_quota", "negotiator_use_slot_weights",
                     "allow_pslot_preemption"):
            if name in low:
                kw[name] = _typed(name, low[name], to_bool) if low[name].strip() else False
        for new, old in _OLDER_SPELLINGS.items():
            if not low.get(new, "").strip() and low.get(old, "").strip():
                low[new] = low[old]
        if "group_quota_max_allocation_rounds" in low:
            kw["group_quota_max_allocation_rounds"] = _typed(
                "group_quota_max_allocation_rounds", low["group_quota_max_allocation_rounds"], to_int)
        if low.get("group_quota_round_robin_rate", "").strip():
            rate = _typed("group_quota_round_robin_rate", low["group_quota_round_robin_rate"],
                          to_float)
            if not rate >= 1:
                raise InvalidInputError(f"GROUP_QUOTA_ROUND_ROBIN_RATE: must be at least 1: {rate}")
            kw["group_quota_round_robin_rate"] = rate
        for name in ("negotiator_max_time_per_submitter", "negotiator_max_time_per_schedd",
                     "negotiator_max_time_per_cycle", "negotiator_max_time_per_piespin"):
            if name in low:
                kw[name] = _typed(name, low[name], to_float)
        if "negotiator_workers" in low:
            kw["negotiator_workers"] = _typed("negotiator_workers", low["negotiator_workers"],
                                              to_int)
        if "significant_attributes" in low:
            kw["significant_attributes"] = tuple(
                a for a in low["significant_attributes"].replace(",", " ").split() if a)
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class MatchRecord:
    """One match: job `job_id` of `submitter` goes to `slot` (a dynamic slot name when carved
    from partitionable `pslot`), for `reason`, preempting the claim of `preempts`."""

    job_id: str
    schedd: str
    submitter: str
    group: str
    slot: str
    reason: str
    preempts: str | None
    weight: float
    autocluster: int
    pslot: str | None = None


@dataclass(frozen=True, slots=True)
class DynamicSlot:
    """A dynamic slot carved from a partitionable slot this cycle, and what the pslot has left."""

    name: str
    pslot: str
    job_id: str
    cpus: float
    memory: float
    disk: float
    weight: float
    pslot_cpus_left: float
    pslot_memory_left: float
    pslot_disk_left: float


@dataclass
class SubmitterStats:
    """Per-submitter outcome of the cycle (condor_userprio / NegotiationCycled statistics)."""

    matches: int = 0
    weight: float = 0.0
    rejections: int = 0
    limit: float = 0.0
    usage_end: float = 0.0
    floor_matches: int = 0
    #: the time limit that stopped this submitter's negotiation early, if one did
    #: ("submitter time limit exceeded", "schedd time limit exceeded", "cycle time limit reached")
    time_limit: str | None = None


@dataclass(frozen=True, slots=True)
class AutoclusterRejection:
    """Why an autocluster's jobs did not match, for `poolledger why`."""

    submitter: str
    autocluster: int
    reasons: Mapping[str, int]
    example_job: str
    attributes: Mapping[str, Any]
    #: `schedd#job_id` of every job rejected in this autocluster, in the order tried
    jobs: tuple[str, ...] = ()


@dataclass(frozen=True)
class CycleResult:
    """The outcome of one cycle; counters are independent of wall-clock duration."""

    cycle: int
    now: float
    matches: tuple[MatchRecord, ...]
    submitters: Mapping[str, SubmitterStats]
    rejections: tuple[AutoclusterRejection, ...]
    dynamic_slots: tuple[DynamicSlot, ...]
    counters: Mapping[str, int]
    pool_size: float
    #: Negotiation time limits that were reached, empty when none was: `submitters` and
    #: `schedds` (names stopped for the rest of the cycle), `piespins` (spins ended early)
    #: and `cycle_time_limit_reached` (True when the cycle itself was ended).
    time_limits: Mapping[str, Any] = field(default_factory=dict)

    def matched_slots(self, submitter: str | None = None) -> list[str]:
        """Slot names matched (optionally for one submitter), in match order."""
        return [m.slot for m in self.matches if submitter is None or m.submitter == submitter]

    def count_by_submitter(self) -> dict[str, int]:
        """Number of matches per submitter."""
        out: dict[str, int] = {}
        for m in self.matches:
            out[m.submitter] = out.get(m.submitter, 0) + 1
        return out
