"""One negotiation cycle, as HTCondor's condor_negotiator runs it, as a pure function.

Order of work (REFERENCE "Negotiation", seed 000): pool size = sum of SlotWeight; a
below-floor round (one spin, each submitter up to its floor); then every group in group
order, each with pie = min(pool, quota) and room = quota - group usage, spinning the pie in
EUP order while the pie left shrinks or submitters drop out; then `<none>` with the whole
pool for autoregroup submitters. Each submitter offers its idle jobs in schedd order; each
job gets the best slot by NEGOTIATOR_PRE_JOB_RANK, job Rank, NEGOTIATOR_POST_JOB_RANK,
preemption state and PREEMPTION_RANK among the slots matching both ways. In a group's first
spin (preemption considered) a submitter at its limit goes on for slots whose startd RANK
strictly prefers its jobs, and a rank preemption is never held to the submitter limit
(HTCondor's `ignore_submitter_limit`). Partitionable slots with a consumption policy are
matched as HTCondor's negotiator does (`_cp_match`); with ALLOW_PSLOT_PREEMPTION a job may
preempt several dynamic slots through their partitionable slot (`_pslot_preemption`).

Time limits (NEGOTIATOR_MAX_TIME_PER_SUBMITTER/_SCHEDD/_PIESPIN/_CYCLE) are measured with a
clock injected into `negotiate` (the matchmaker never reads the time itself; the default clock
never advances, so no limit is ever reached and results stay reproducible). The clock is read
once at cycle start, once at each pie spin start (the floor round counts as a spin), and just
before and just after each job is tried; the time between those last two readings is charged
to the submitter and to the job's schedd. Before each job: once the cycle has run
`_per_cycle` seconds the cycle ends; once the spin has run `_per_piespin` the spin ends (the
next spin starts afresh); once the submitter has been charged `_per_submitter`, its remaining
jobs are rejected with "submitter time limit exceeded" and it is done for the cycle; once the
job's schedd has been charged `_per_schedd`, every remaining job of that schedd (any
submitter) is rejected with "schedd time limit exceeded". As in HTCondor, a limit counts as
exceeded once the time spent reaches it. Hits are reported in `CycleResult.time_limits`.

Speed comes from computing each autocluster's match list once (requirements both ways and
all rank keys, over columns of slot ads with `fastmatch`, classad2 for anything else), then
walking a sorted candidate list; partitionable slots that get carved are re-checked per row.
The cost follows the distinct slot and job shapes, not their product: slots fall into
equivalence classes on the attributes an expression can read (`_SlotTable.classes`), each
expression is evaluated once per class and per distinct job side and shared by every
autocluster with that side, and a match list is built per class and spread over its slots.
Memory is bounded: idle jobs are ids plus an autocluster, and live match lists and shared
values are kept in LRUs of fixed size (an evicted list is rebuilt, to the same picks).
"""
from __future__ import annotations

import functools
import itertools
import math
import multiprocessing
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import classad2
import numpy as np
import numpy.typing as npt

from schemas.classads import evaluation_problem
from schemas.events import Matched, NegotiationCycled
from services.negotiator.autocluster import (
    DEFAULT_SIGNIFICANT_ATTRIBUTES,
    ORDER_ATTRS,
    Autoclusters,
    order_key,
    prio_key,
    referenced_names,
)
from services.negotiator.errors import InvalidInputError
from services.negotiator.fastmatch import (
    ColumnSide,
    ConstSide,
    Evaluator,
    ExprText,
    NotCompilableError,
    column_from_values,
    pair_eval,
    rank_values,
    truth_mask,
    value_rank,
    value_truth,
)
from services.negotiator.fastmatch import Col
from services.negotiator.model import (
    ROOT_GROUP,
    Ad,
    AutoclusterRejection,
    CycleInput,
    CycleResult,
    DynamicSlot,
    GroupInput,
    MatchRecord,
    NegotiatorConfig,
    SubmitterInput,
    SubmitterStats,
)
from services.negotiator.piespin import EPSILON, Slice, floor_limits, spin_limits, spin_order
from streams.core.limits import ConcurrencyLimitError, limit_increments, parse_limits
from streams.gcpolicy import long_fold

IntArr = npt.NDArray[np.intp]
FloatArr = npt.NDArray[np.float64]

REJ_CONCURRENCY = "concurrency limit {} reached"
REJ_PREEMPTION_REQ = "PREEMPTION_REQUIREMENTS == False"
REJ_PRIORITY = "insufficient priority"
REJ_LIMIT = "submitter limit exceeded"
REJ_NO_MATCH = "no match found"
#: Jobs left when their submitter (schedd) used up NEGOTIATOR_MAX_TIME_PER_SUBMITTER (_SCHEDD);
#: HTCondor logs "Reached deadline ... stopping negotiation" / "skipped because of time limits".
REJ_SUBMITTER_TIME = "submitter time limit exceeded"
REJ_SCHEDD_TIME = "schedd time limit exceeded"
#: Why a submitter with jobs left stopped when NEGOTIATOR_MAX_TIME_PER_CYCLE ended the cycle.
CYCLE_TIME_LIMIT = "cycle time limit reached"
#: Rejection precedence (REFERENCE): the first reason observed in this order is reported.
_PRECEDENCE = ("concurrency", REJ_PREEMPTION_REQ, REJ_PRIORITY, REJ_LIMIT, REJ_NO_MATCH,
               REJ_SUBMITTER_TIME, REJ_SCHEDD_TIME)
_EXPR_JSON = re.compile(r"/Expr\((.*)\)/\Z", re.S)
#: a dynamic slot's name -> its partitionable slot's: slot1_3@host -> slot1@host
_DSLOT_NAME = re.compile(r"^(.*)_\d+(@.*)$")
_NOTE_PREQ, _NOTE_PRIO = 1, 2
_SMALL_BATCH = 8
_RESORT_AT = 256
_RESOURCES = ("cpus", "memory", "disk")
#: slot attributes the preemption state of a match reads besides expressions
_SORT_ATTRS = ("cpus", "memory", "disk", "currentrank", "remoteuserprio", "remoteuser",
               "remoteowner", "accountinggroup", "state", "activity", "partitionableslot",
               "slotweight", "rank", "requirements", "start")
#: memory for live match lists (`_Cycle.requests`)
_REQUEST_BYTES = 512 << 20
#: memory for expression values per slot class kept across requests (`_Engine._per_class`)
_CLASS_VALUE_BYTES = 256 << 20
#: `_SlotTable.dslot_form`: SlotWeight is not an expression (a dynamic slot weighs its
#: cpus), an expression naming cpus/memory/disk (0/1/2), or anything else
_SW_CPUS, _SW_OTHER = 3, 4
T = TypeVar("T")

#: entries of `_Engine._of_ad` before it starts over (a few per live request)
_AD_MEMO_ENTRIES = 1 << 16
#: idle jobs in a cycle from which `negotiator_workers` > 1 sorts job queues on two cores
#: when one is idle (below it a fork costs more than it saves)
_PARALLEL_MIN_JOBS = 20_000
#: match lists the child of `_Cycle._start_prefetch` has sent and the parent not received, at
#: most (each up to a few MB), and lists one child builds before the next is forked from the
#: cycle as it is then
_LOOKAHEAD, _EPOCH = 4, 32
#: entries of `_Engine._pair_values` before it starts over
_PAIR_MEMO_ENTRIES = 1 << 18
#: rows `_Engine._scan` looks at first (the best available row is usually among them: each
#: numpy step over a short slice costs less), then at a time
_FIRST_SCAN, _SCAN = 32, 512
#: claimed-slot summaries `_Engine._claimed_matches` keeps (one per distinct job side)
_CLAIMED_SUMMARIES = 256
#: carved pslot shapes one request keeps the match data of (`_Engine._recheck`)
_RECHECKED_ENTRIES = 256

#: an attribute a slot ad does not have (its column reads it as undefined)
_ABSENT = object()

#: ClassAd's eval() reads attributes named by a computed string: no slot classes for it
_EVAL_CALL = re.compile(r"\beval\s*\(", re.I)


# ---------------------------------------------------------------------------------------------
# Ads as value dicts


#: value types `ad_values` takes as they are (but strings holding an expression)
_PLAIN_TYPES = frozenset({bool, int, float, str, type(None)})


def ad_values(ad: Ad) -> dict[str, Any]:
    """Lowercased attribute -> literal Python value (None = UNDEFINED) or `ExprText`."""
    out: dict[str, Any] = {}
    if isinstance(ad, classad2.ClassAd):
        for key in ad:
            v = ad[key]
            if isinstance(v, classad2.Value):
                out[key.lower()] = None if v == classad2.Value.Undefined else ExprText("error")
            elif isinstance(v, (bool, int, float, str)):
                out[key.lower()] = v
            else:
                out[key.lower()] = ExprText(str(ad.lookup(key)))
        return out
    if type(ad) is dict and _PLAIN_TYPES.issuperset(map(type, ad.values())):
        # the usual ad (a slot ad: 20,000 of them a cycle): keys lowered in one C-level
        # pass, then only expression strings looked at; names alike but for case (the last
        # counts) or not strings are left to the general loop
        try:
            plain = dict(zip(_lowered(tuple(ad)), ad.values()))
        except TypeError:
            plain = {}
        if len(plain) == len(ad):
            for key, v in ad.items():
                if v.__class__ is str and v.startswith("/Expr(") and (x := _expr_text(v)):
                    plain[key.lower()] = x
            return plain
    for key, v in ad.items():
        if isinstance(v, str):
            m = _EXPR_JSON.match(v)
            out[key.lower()] = ExprText(m.group(1)) if m else v
        elif v is None or isinstance(v, (bool, int, float)):
            out[key.lower()] = v
        elif isinstance(v, classad2.ExprTree):
            out[key.lower()] = ExprText(str(v))
        elif isinstance(v, (dict, list, tuple)):
            from schemas.classads import ad_from_json
            tmp = ad_from_json({key: v})
            out[key.lower()] = ExprText(str(tmp.lookup(key)))
        else:
            raise InvalidInputError(f"attribute {key}: unsupported value {type(v).__name__}")
    return out


@functools.lru_cache(maxsize=1024)
def _lowered(names: tuple[str, ...]) -> tuple[str, ...]:
    """Attribute names lowercased, once per distinct list of names (slot ads of one type
    share theirs)."""
    return tuple(map(str.lower, names))


@functools.lru_cache(maxsize=1 << 14)
def _expr_text(v: str) -> ExprText | None:
    """The expression a JSON string `/Expr(...)/` holds, once per distinct text (thousands
    of slot ads share a few Requirements and SlotWeight texts)."""
    m = _EXPR_JSON.match(v)
    return ExprText(m.group(1)) if m else None


def values_ad(values: Mapping[str, Any]) -> classad2.ClassAd:
    """A classad2 ClassAd holding `values` (for the classad2 path)."""
    ad = classad2.ClassAd()
    for key, v in values.items():
        if isinstance(v, ExprText):
            try:
                ad[key] = classad2.ExprTree(v.text)
            except Exception as exc:
                raise InvalidInputError(f"attribute {key}: cannot parse {v.text!r}") from exc
        elif v is None:
            ad[key] = classad2.ExprTree("undefined")
        else:
            ad[key] = v
    return ad


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _int_if_whole(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def _cp_assets(v: Mapping[str, Any]) -> tuple[str, ...]:
    """A partitionable slot's consumption-policy assets, or () when it has no policy.

    As HTCondor's negotiator decides it: the slot lists its assets in MachineResources and
    defines Consumption<Asset> for each of them (swap is never consumed)."""
    names = v.get("machineresources")
    if not isinstance(names, str):
        return ()
    assets = tuple(a.lower() for a in names.replace(",", " ").split() if a.lower() != "swap")
    if not assets or any(f"consumption{a}" not in v for a in assets):
        return ()
    return assets


def _remote_submitter(v: Mapping[str, Any]) -> str | None:
    """Who a claimed slot is charged to: AccountingGroup@domain, else RemoteUser."""
    user = v.get("remoteuser") or v.get("remoteowner")
    if not isinstance(user, str):
        return None
    group = v.get("accountinggroup")
    if isinstance(group, str) and "@" in group:
        return group  # HTCondor's slot ads carry "group.user@uid_domain" already
    if isinstance(group, str) and group:
        _, at, domain = user.rpartition("@")
        return f"{group}@{domain}" if at else group
    return user



# ---------------------------------------------------------------------------------------------
# The slot table: slot ads as columns


class _SlotTable:
    """All slot ads of the cycle, their state, weights and lazily built attribute columns.

    Rows sharing the same expression-valued attributes form an evaluation group (a slot
    equivalence class for the column evaluator: literal attributes vary per row, expressions
    are the same text). Partitionable slots change as they are carved; each change is
    appended to `changes` so cached match lists re-check exactly those rows.
    """

    def __init__(self, slots: Sequence[Ad]) -> None:
        self.vals = [ad_values(s) for s in slots]
        self.n = len(self.vals)
        self.names = [str(v.get("name", f"slot{i}")) for i, v in enumerate(self.vals)]
        self.ads: list[classad2.ClassAd | None] = [None] * self.n
        self._cols: dict[str, tuple[Col, npt.NDArray[np.bool_]]] = {}
        self.changes: list[int] = []
        self.pslot = np.array([v.get("partitionableslot") is True for v in self.vals], dtype=bool)
        #: pslot row -> the assets of its consumption policy (lowercased MachineResources
        #: names, swap left out), for pslots that define Consumption<Asset> for every one
        self.cp: dict[int, tuple[str, ...]] = {}
        for p in np.flatnonzero(self.pslot):
            pv = self.vals[int(p)]
            assets = _cp_assets(pv)
            if assets:
                self.cp[int(p)] = assets
            for res in (*_RESOURCES, *assets):
                if isinstance(pv.get(res), ExprText):
                    pv[res] = _num(values_ad(pv).eval(res)) or 0.0
        self.is_cp = np.zeros(self.n, dtype=bool)
        self.is_cp[list(self.cp)] = True
        self.claimed = np.zeros(self.n, dtype=bool)
        self.usable = np.zeros(self.n, dtype=bool)
        for i, v in enumerate(self.vals):
            state = str(v.get("state", "Unclaimed")).lower()
            activity = str(v.get("activity", "Idle")).lower()
            if state == "unclaimed":
                self.usable[i] = True
            elif state in ("claimed", "preempting") and activity != "idle" and not self.pslot[i]:
                self.usable[i] = True
                self.claimed[i] = True
        sigs: dict[tuple[tuple[str, str], ...], int] = {}
        self.group = np.zeros(self.n, dtype=np.intp)
        self.group_exprs: list[dict[str, str]] = []
        for i, v in enumerate(self.vals):
            sig = tuple(sorted((k, x.text) for k, x in v.items() if isinstance(x, ExprText)))
            gid = sigs.get(sig)
            if gid is None:
                gid = sigs[sig] = len(self.group_exprs)
                self.group_exprs.append(dict(sig))
            self.group[i] = gid
        self.group_rows = [np.flatnonzero(self.group == g) for g in range(len(self.group_exprs))]
        self.remote_sub = [_remote_submitter(v) for v in self.vals]
        #: remote_sub as integers (-1: none), to compare a submitter with many rows at once
        self.remote_names: dict[str | None, int] = {None: -1}
        self.remote_code = np.fromiter(
            (self.remote_names.setdefault(x, len(self.remote_names) - 1) for x in self.remote_sub),
            dtype=np.intp, count=self.n)
        #: per pslot row, what a dynamic slot's SlotWeight reads (`dslot_weights`)
        self.dslot_form: dict[int, int] = {}
        for p in np.flatnonzero(self.pslot):
            sw = self.vals[int(p)].get("slotweight")
            text = sw.text.strip().lower() if isinstance(sw, ExprText) else None
            self.dslot_form[int(p)] = (_SW_CPUS if sw is None or not isinstance(sw, ExprText)
                                       else _RESOURCES.index(text) if text in _RESOURCES
                                       else _SW_OTHER)
        self.use_weights = True
        self.weight = np.zeros(self.n)
        self._codes: dict[str, IntArr] = {}
        self._classes: dict[tuple[frozenset[str], bool], tuple[IntArr, IntArr]] = {}
        #: every attribute any request's evaluation reads (a request's own are
        #: `_Engine._request_names`), set by the cycle; None when an expression reads
        #: attributes by computed name
        self.sort_names: frozenset[str] | None = None
        self._expr_texts: dict[str, list[str]] | None = None
        self._present: set[str] | None = None
        #: `_raw_columns`, once read (kept in step by `update`)
        self._raw: dict[str, tuple[npt.NDArray[np.object_], npt.NDArray[np.bool_]]] | None = None

    def compute_weights(self, use_weights: bool) -> None:
        """SlotWeight per row (default Cpus); all 1.0 without NEGOTIATOR_USE_SLOT_WEIGHTS."""
        self.use_weights = use_weights
        for i, v in enumerate(self.vals):
            self.weight[i] = self._weight_of(i, v) if use_weights else 1.0

    def _weight_of(self, i: int, v: Mapping[str, Any]) -> float:
        sw = v.get("slotweight")
        if sw is None:
            return max(0.0, _num(v.get("cpus")) or 0.0) if "cpus" in v else 1.0
        if isinstance(sw, ExprText):
            text = sw.text.strip().lower()
            x = _num(v.get(text)) if text in v else _num(values_ad(v).eval("slotweight"))
        else:
            x = _num(sw)
        return x if x is not None and x >= 0 else 1.0

    def dslot_weight(self, i: int, cpus: float, memory: float, disk: float) -> float:
        """The weight of a dynamic slot of this size carved from pslot row i."""
        if not self.use_weights:
            return 1.0
        v = dict(self.vals[i])
        v.update({"cpus": _int_if_whole(cpus), "memory": _int_if_whole(memory),
                  "disk": _int_if_whole(disk)})
        if isinstance(v.get("slotweight"), ExprText):
            return self._weight_of(i, v)
        return float(cpus)

    def dslot_weights(self, rows: IntArr, cpus: FloatArr, memory: FloatArr, disk: FloatArr
                      ) -> FloatArr:
        """`dslot_weight` for many pslot rows: by columns where SlotWeight reads the slot's
        size (the default Cpus, or an expression naming cpus, memory or disk)."""
        if not self.use_weights:
            return np.ones(len(rows))
        form = np.fromiter((self.dslot_form[int(r)] for r in rows), dtype=np.intp,
                           count=len(rows))
        size = np.stack((cpus, memory, disk))
        picked = size[np.minimum(form, 2), np.arange(len(rows))]
        out = np.where(form == _SW_CPUS, cpus, np.where(picked >= 0, picked, 1.0))
        for k in np.flatnonzero(form == _SW_OTHER):
            out[k] = self.dslot_weight(int(rows[k]), cpus[k], memory[k], disk[k])
        return out

    def ad(self, i: int) -> classad2.ClassAd:
        """The classad2 ad of row i (built on first use, rebuilt after a change)."""
        ad = self.ads[i]
        if ad is None:
            ad = self.ads[i] = values_ad(self.vals[i])
        return ad

    def column(self, name: str) -> tuple[Col, npt.NDArray[np.bool_]]:
        """The literal column of attribute `name` over all rows, and where it is present."""
        hit = self._cols.get(name)
        if hit is None and name not in self.present():
            # a job attribute a slot expression reads, say: no row to look at
            n = self.n
            hit = self._cols[name] = (Col("undef", np.zeros(n), np.ones(n, dtype=bool),
                                          np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)),
                                      np.zeros(n, dtype=bool))
        if hit is None:
            obj, has = self._raw_columns()[name]
            raw = obj.tolist()
            if ExprText in set(map(type, raw)):
                raw = [None if x.__class__ is ExprText else x for x in raw]
            hit = self._cols[name] = (column_from_values(raw), has.copy())
        return hit

    def _raw_columns(self) -> dict[str, tuple[npt.NDArray[np.object_], npt.NDArray[np.bool_]]]:
        """Every attribute's value per row (None where absent) and where it is present.

        Read from the ads in one pass, rows with the same attribute names (the few slot
        types) transposed together: each ad is visited once, not once per attribute, which
        costs a fraction as much at 20,000 ads (their dicts do not stay in the CPU's caches)."""
        if self._raw is None:
            by_names: dict[tuple[str, ...], list[int]] = {}
            for i, v in enumerate(self.vals):
                by_names.setdefault(tuple(v), []).append(i)
            raw: dict[str, tuple[npt.NDArray[np.object_], npt.NDArray[np.bool_]]] = {}
            for names, rows in by_names.items():
                at = np.asarray(rows, dtype=np.intp)
                for name, col in zip(names, zip(*[tuple(self.vals[i].values()) for i in rows])):
                    hit = raw.get(name)
                    if hit is None:
                        hit = raw[name] = (np.full(self.n, None, dtype=object),
                                           np.zeros(self.n, dtype=bool))
                    hit[0][at] = np.fromiter(col, dtype=object, count=len(rows))
                    hit[1][at] = True
            self._raw = raw
        return self._raw

    def present(self) -> set[str]:
        """Every attribute name some slot ad has."""
        if self._present is None:
            self._present = set().union(*self.vals)
        return self._present

    def update(self, i: int, changes: Mapping[str, Any]) -> None:
        """Change literal attributes of row i (a carved pslot), keeping columns in step."""
        self.vals[i].update(changes)
        if self._present is not None:
            self._present.update(changes)
        if self._raw is not None:
            for name, v in changes.items():
                raw = self._raw.get(name)
                if raw is None:
                    raw = self._raw[name] = (np.full(self.n, None, dtype=object),
                                             np.zeros(self.n, dtype=bool))
                raw[0][i], raw[1][i] = v, True
        self.ads[i] = None
        for name, v in changes.items():
            hit = self._cols.get(name)
            if hit is None:
                continue
            col, has = hit
            x = _num(v)
            if col.kind == "num" and x is not None:
                col.val[i], col.isint[i], col.undef[i], col.bad[i] = x, isinstance(v, int), False, False
                has[i] = True
            else:
                del self._cols[name]
        self.changes.append(i)

    def claim_values(self, rows: IntArr) -> tuple[FloatArr, FloatArr]:
        """CurrentRank (0 if undefined) and RemoteUserPrio (NaN if undefined) of `rows`,
        what a preemption is judged by besides expressions."""
        cur_col = self.column("currentrank")[0]
        cur = (np.where(cur_col.undef[rows], 0.0, cur_col.val[rows]) if cur_col.kind == "num"
               else np.zeros(len(rows)))
        prio_col = self.column("remoteuserprio")[0]
        rprio = (np.where(prio_col.undef[rows], np.nan, prio_col.val[rows])
                 if prio_col.kind == "num" else np.full(len(rows), np.nan))
        return cur, rprio

    def codes(self, name: str) -> IntArr:
        """Attribute `name` as an integer per row: equal codes mean the same value of the same
        type (0: absent, 1: undefined or an expression, whose text the evaluation group
        tells), so rows with equal codes are indistinguishable to it. Rows the column cannot
        describe exactly get codes of their own."""
        hit = self._codes.get(name)
        if hit is None:
            col, has = self.column(name)
            if col.kind == "num":
                base = np.unique(col.val, return_inverse=True)[1].reshape(-1) * 2 + col.isint
            elif col.kind == "str":
                # by a dict, not np.unique: sorting fixed-width unicode costs ten times more
                vals = col.val.tolist()
                ids = {v: i for i, v in enumerate(dict.fromkeys(vals))}
                base = np.fromiter(map(ids.__getitem__, vals), dtype=np.intp, count=len(vals))
            else:
                base = col.val.astype(np.intp)
            hit = base.astype(np.intp) + 2
            hit[col.undef] = 1
            hit[~has] = 0
            bad = np.flatnonzero(col.bad)
            hit[bad] = int(hit.max(initial=0)) + 1 + np.arange(len(bad))
            self._codes[name] = hit
        return hit

    def classes(self, names: frozenset[str], pool_claimed: bool = False
                ) -> tuple[IntArr, IntArr]:
        """Slot equivalence classes on `names`: (class per row, first row of each class).

        Rows in one class are in the same evaluation group and hold the same values of every
        attribute in `names`, so any expression reading only those attributes has the same
        value on all of them. Partitionable slots (carved during the cycle) are classes of
        their own, so a class stays valid as the cycle changes them. With `pool_claimed`
        every claimed slot is in one class (`_Engine.build`: when none can be preempted, a
        request's match data on them is one note)."""
        hit = self._classes.get((names, pool_claimed))
        if hit is None:
            key = np.where(self.pslot, np.arange(1, self.n + 1), 0)
            _, key = np.unique(key, return_inverse=True)
            bound = int(key.max(initial=0)) + 1  # key < bound
            # the codes are combined as digits of one integer (renumbered only when it
            # would overflow); a code alike on every row splits nothing and is left out
            for name in (*sorted(names), None):
                extra = self.group if name is None else self.codes(name)
                lo, hi = int(extra.min(initial=0)), int(extra.max(initial=0))
                if lo == hi:
                    continue
                if bound * (hi + 1) >= 1 << 62:
                    key = np.unique(key, return_inverse=True)[1].reshape(-1)
                    bound = int(key.max(initial=0)) + 1
                key = key * (hi + 1) + extra
                bound *= hi + 1
            if pool_claimed:
                key[self.claimed] = -1
            first, key = np.unique(key, return_index=True, return_inverse=True)[1:]
            hit = self._classes[(names, pool_claimed)] = (key.reshape(-1).astype(np.intp),
                                                          first.astype(np.intp))
        return hit

    def expr_texts(self) -> dict[str, list[str]]:
        """Attribute -> the distinct expression texts it has in any slot ad."""
        if self._expr_texts is None:
            out: dict[str, list[str]] = {}
            for exprs in self.group_exprs:
                for name, text in exprs.items():
                    if text not in out.setdefault(name, []):
                        out[name].append(text)
            self._expr_texts = out
        return self._expr_texts

    def side(self, gid: int, rows: IntArr) -> ColumnSide:
        """A column side over `rows` (all in evaluation group `gid`)."""
        return ColumnSide(self.column, self.group_exprs[gid], rows)


# ---------------------------------------------------------------------------------------------
# One autocluster's match list


@dataclass
class _Request:
    """An autocluster negotiating in one context: its ad and cached match list.

    Match data is held per slot class (`cls`: row -> class, from `_SlotTable.classes` on
    every attribute it is computed from, or one class per row), since the rows of a class
    share it: `cand` (matches both ways, fits, preemptable if claimed), `keys` (pre job rank,
    job Rank, post job rank, preemption state 2/1/0, PREEMPTION_RANK), `weight` (what the
    match costs; a carved dynamic slot's weight for pslots, the drop in SlotWeight under a
    consumption policy), `res` (the cpus/memory/disk a pslot match takes: the request, or
    what the policy consumes) and `note` (why a matching claimed slot is not preemptable).
    A partitionable slot, the only row that changes, is a class of its own. `cp` maps a
    consumption-policy pslot row to every asset it consumes. `order` is the candidate rows
    sorted best first; `dirty` rows changed since and are compared separately until the
    next re-sort.
    """

    ac: int
    values: dict[str, Any]
    n: int
    ad: classad2.ClassAd | None = None
    cls: IntArr = field(init=False)
    cand: npt.NDArray[np.bool_] = field(init=False)
    keys: FloatArr = field(init=False)
    weight: FloatArr = field(init=False)
    res: FloatArr = field(init=False)
    note: npt.NDArray[np.int8] = field(init=False)
    order: IntArr = field(init=False)
    ptr: int = 0
    seen: int = 0
    dirty: set[int] = field(default_factory=set)
    dirty_mask: npt.NDArray[np.bool_] = field(init=False)
    cp: dict[int, dict[str, float]] = field(default_factory=dict)
    #: the slot attributes its match data is computed from (`_Engine._request_names`)
    names: frozenset[str] | None = None
    #: bytes its arrays took when built (`_Cycle.request_bytes`)
    size: int = 0
    #: `cls` pools the claimed slots (`_SlotTable.classes`, `_Engine.build`)
    pooled: bool = False
    #: a carved pslot's match data by its shape (`_Engine._recheck`)
    rechecked: dict[int, tuple[bool, FloatArr, FloatArr, float, int]] = field(
        default_factory=dict)

    def __post_init__(self) -> None:
        self.alloc(np.zeros(self.n, dtype=np.intp), 0)  # `_Engine.build` sizes it
        self.order = np.zeros(0, dtype=np.intp)
        self.dirty_mask = np.zeros(self.n, dtype=bool)

    def alloc(self, cls: IntArr, m: int) -> None:
        """Empty match data for `m` slot classes, row -> class `cls`."""
        self.cls = cls
        self.cand = np.zeros(m, dtype=bool)
        self.keys = np.zeros((m, 5))
        self.weight = np.zeros(m)
        self.res = np.zeros((m, 3))
        self.note = np.zeros(m, dtype=np.int8)

    def classad(self) -> classad2.ClassAd:
        if self.ad is None:
            self.ad = values_ad(self.values)
        return self.ad

    def nbytes(self) -> int:
        """Bytes its own arrays take (`cls` is the slot table's, shared)."""
        return sum(a.nbytes for a in (self.cand, self.keys, self.weight, self.res, self.note,
                                      self.order, self.dirty_mask))

    def resort(self, rows: IntArr, c: IntArr | None = None) -> None:
        """Order the candidate `rows` (of classes `c`, if known) best first (keys
        descending, then row).

        The distinct keys are sorted once per class, and the rows by their class's place,
        which a stable integer sort keeps in row order. With a NaN key (unequal to itself)
        or a few rows, every row is sorted by its keys."""
        if c is None:
            c = self.cls[rows]
        mark = np.zeros(len(self.cand), dtype=bool)
        mark[c] = True
        uq = np.flatnonzero(mark)
        kk = self.keys[uq]
        if len(rows) > _SMALL_BATCH and not np.isnan(kk).any():
            o = np.lexsort((-kk[:, 4], -kk[:, 3], -kk[:, 2], -kk[:, 1], -kk[:, 0]))
            step = np.any(kk[o][1:] != kk[o][:-1], axis=1)
            place = np.empty(len(mark), dtype=np.intp)
            place[uq[o]] = np.concatenate(([0], np.cumsum(step)))
            rank = place[c]
            small = rank.astype(np.uint16) if len(uq) < 65536 else rank
            self.order = rows[np.argsort(small, kind="stable")]
        else:
            k = self.keys[c]
            self.order = rows[np.lexsort((rows, -k[:, 4], -k[:, 3], -k[:, 2], -k[:, 1],
                                          -k[:, 0]))]
        self.ptr = 0
        for r in self.dirty:
            self.dirty_mask[r] = False
        self.dirty.clear()


class _Engine:
    """Evaluates match lists: the column path first, classad2 for the rest."""

    def __init__(self, table: _SlotTable, cfg: NegotiatorConfig, avail: npt.NDArray[np.bool_],
                 counters: dict[str, int]) -> None:
        self.table = table
        self.cfg = cfg
        self.avail = avail
        self.counters = counters
        self._exprs: dict[str, classad2.ExprTree] = {}
        self._class_values: dict[Any, tuple[npt.NDArray[Any], list[int]]] = {}
        self._class_bytes = 0
        self._slot_refs_cache: dict[tuple[str, tuple[tuple[str, str], ...]],
                                    frozenset[str] | None] = {}
        self._ad_memo: dict[tuple[int, frozenset[str] | None], tuple[Mapping[str, Any], Any]] = {}
        #: classad2 results by expression and the values of every attribute it can read on
        #: both sides: shared by every request and row alike in those (`_classad`)
        self._pair_values: dict[Any, Any] = {}
        #: the available claimed slots when none of them can be a candidate of any request
        #: (no startd RANK above CurrentRank, PREEMPTION_REQUIREMENTS False), set by the
        #: cycle: they stay available all cycle and `build` pools them in one slot class
        self.claimed_rows: IntArr | None = None
        #: every claimed slot's row
        self.claimed_idx = np.flatnonzero(table.claimed)
        #: per `claimed_rows`: RemoteUser code, RemoteUserPrio, CurrentRank (`claimed_values`)
        self.claimed_codes: IntArr = np.zeros(0, dtype=np.intp)
        self.claimed_prio: FloatArr = np.zeros(0)
        self.claimed_cur: FloatArr = np.zeros(0)
        self._claimed_summaries: dict[Any, tuple[int, float, float, list[int]] | None] = {}
        #: carved pslot shapes (`_shape`)
        self._shapes: dict[Any, int] = {}
        self._next_shape = 0

    def expr(self, text: str) -> classad2.ExprTree:
        tree = self._exprs.get(text)
        if tree is None:
            try:
                tree = self._exprs[text] = classad2.ExprTree(text)
            except Exception as exc:
                raise InvalidInputError(f"cannot parse expression {text!r}") from exc
        return tree

    # -- one expression over rows ---------------------------------------------------------

    def vec(self, text: str, slot_owns: bool, mode: str, gid: int, rows: IntArr,
            values: Mapping[str, Any], jad: Callable[[], classad2.ClassAd],
            force_classad: bool = False) -> npt.NDArray[Any]:
        """`text` evaluated for each row (slot) against one ad (`values`), converted by `mode`:
        'truth' (matches), 'rank' (float, non-numbers 0) or 'num' (float, NaN if not a number).

        Evaluated once per slot class on the attributes the value can depend on (`_slot_refs`)
        and spread over the class's rows: the cost follows the distinct slot shapes. Off the
        forced classad2 path, the per-class values are kept for every request whose ad has the
        same values of those attributes (`_per_class`), so autoclusters share them."""
        names = self._slot_refs(text, values)
        if names is not None and not force_classad:
            cls = self.table.classes(names)[0]
            return self._per_class(text, slot_owns, mode, names, values, jad)[cls[rows]]
        if names is not None and len(rows) > _SMALL_BATCH:
            cls, first = self.table.classes(names)
            c = cls[rows]
            mark = np.zeros(len(first), dtype=bool)
            mark[c] = True
            uniq = np.flatnonzero(mark)
            if len(uniq) < len(rows):
                res = self._vec_rows(text, slot_owns, mode, gid, first[uniq], values, jad,
                                     force_classad)
                pos = np.empty(len(first), dtype=np.intp)
                pos[uniq] = np.arange(len(uniq))
                return res[pos[c]]
        return self._vec_rows(text, slot_owns, mode, gid, rows, values, jad, force_classad)

    def _per_class(self, text: str, slot_owns: bool, mode: str, names: frozenset[str],
                   values: Mapping[str, Any], jad: Callable[[], classad2.ClassAd]
                   ) -> npt.NDArray[Any]:
        """`text`'s value for every slot class on `names`, for a request ad with `values`:
        computed once per distinct job side, brought up to date with the partitionable slots
        carved since (each a class of its own); least recently used dropped past a budget."""
        key = (text, slot_owns, mode, names, self._job_side(values, names))
        t = self.table
        hit = self._class_values.pop(key, None)
        if hit is None:
            cls, first = t.classes(names)
            res: npt.NDArray[Any] = np.zeros(len(first), dtype=bool if mode == "truth" else float)
            self._fill(res, first, np.arange(len(first)), text, slot_owns, mode, values, jad)
            hit = (res, [len(t.changes)])
            self._class_bytes += res.nbytes
            while self._class_bytes > _CLASS_VALUE_BYTES and self._class_values:
                self._class_bytes -= next(iter(self._class_values.values()))[0].nbytes
                del self._class_values[next(iter(self._class_values))]
        elif hit[1][0] < len(t.changes):
            rows = np.unique(np.asarray(t.changes[hit[1][0]:], dtype=np.intp))
            self._fill(hit[0], rows, t.classes(names)[0][rows], text, slot_owns, mode, values,
                       jad)
            hit[1][0] = len(t.changes)
        self._class_values[key] = hit
        return hit[0]

    def _fill(self, out: npt.NDArray[Any], rows: IntArr, at: IntArr, text: str,
              slot_owns: bool, mode: str, values: Mapping[str, Any],
              jad: Callable[[], classad2.ClassAd]) -> None:
        """out[at] = `text` over `rows`, evaluation group by evaluation group."""
        groups = self.table.group[rows]
        for gid in np.flatnonzero(np.bincount(groups)):  # np.unique, without a sort
            sel = np.flatnonzero(groups == gid)
            out[at[sel]] = self._vec_rows(text, slot_owns, mode, int(gid), rows[sel], values,
                                          jad)

    def _job_side(self, values: Mapping[str, Any], names: frozenset[str]) -> tuple[Any, ...]:
        """The request ad's values of `names` (with their types), which is all an expression
        reading only `names` sees of it."""
        return self._of_ad(values, names, lambda: tuple(
            (nm, type(values[nm]), values[nm]) for nm in sorted(names) if nm in values))

    def _of_ad(self, values: Mapping[str, Any], tag: frozenset[str] | None,
               compute: Callable[[], T]) -> T:
        """compute() for the request ad `values` (never changed once built), kept per ad and
        `tag`: a request's evaluation asks for the same keys once per expression and slot
        row re-check. The ad is held with its entry, so its id cannot be reused meanwhile."""
        k = (id(values), tag)
        hit = self._ad_memo.get(k)
        if hit is not None and hit[0] is values:
            return cast(T, hit[1])
        out = compute()
        if len(self._ad_memo) >= _AD_MEMO_ENTRIES:
            self._ad_memo.clear()
        self._ad_memo[k] = (values, out)
        return out

    def _slot_refs(self, text: str, values: Mapping[str, Any]) -> frozenset[str] | None:
        """Every slot attribute `text`'s value can read (through the slots' and the job's
        expression attributes), or None when it may read attributes by computed name."""
        jexprs = self._of_ad(values, None, lambda: tuple(sorted(
            (k, v.text) for k, v in values.items() if isinstance(v, ExprText))))
        key = (text, jexprs)
        if key in self._slot_refs_cache:
            return self._slot_refs_cache[key]
        slot_exprs = self.table.expr_texts()
        job_exprs = dict(jexprs)
        todo: list[str] = [text]
        names: set[str] = set()
        out: frozenset[str] | None = None
        while todo:
            t = todo.pop()
            if _EVAL_CALL.search(t):
                break
            mine, other = referenced_names(t)
            for nm in (mine | other) - names:
                names.add(nm)
                todo.extend(slot_exprs.get(nm, ()))
                if nm in job_exprs:
                    todo.append(job_exprs[nm])
        else:
            out = frozenset(names)
        self._slot_refs_cache[key] = out
        return out

    def _vec_rows(self, text: str, slot_owns: bool, mode: str, gid: int, rows: IntArr,
                  values: Mapping[str, Any], jad: Callable[[], classad2.ClassAd],
                  force_classad: bool = False) -> npt.NDArray[Any]:
        """`vec` row by row (columns over `rows`, classad2 where those cannot decide)."""
        if self.cfg.fast_path and not force_classad:
            try:
                side = self.table.side(gid, rows)
                const = ConstSide(values, len(rows))
                ev = Evaluator()
                col = ev.eval(text, side, const) if slot_owns else ev.eval(text, const, side)
            except NotCompilableError:
                pass
            else:
                self.counters["rows_column"] += len(rows)
                if mode == "truth":
                    out: npt.NDArray[Any] = truth_mask(col)
                elif mode == "rank":
                    out = rank_values(col)
                else:
                    out = np.where((col.kind == "num") & ~col.undef, col.val, np.nan).astype(float)
                if col.bad.any():
                    bad = np.flatnonzero(col.bad)
                    out[bad] = self._classad(text, slot_owns, mode, gid, rows[bad], values, jad, False)
                return out
        return self._classad(text, slot_owns, mode, gid, rows, values, jad, True)

    def _classad(self, text: str, slot_owns: bool, mode: str, gid: int, rows: IntArr,
                 values: Mapping[str, Any], jad: Callable[[], classad2.ClassAd],
                 dedupe: bool) -> npt.NDArray[Any]:
        tree = self.expr(text)
        out: npt.NDArray[Any] = np.zeros(len(rows), dtype=bool if mode == "truth" else float)
        refs = self._slot_refs(text, values) if dedupe else None
        names = sorted(refs) if refs is not None else None
        cache: dict[Any, Any] = {}
        if refs is not None:
            # the value is a function of the attributes in `refs` on both sides, so one
            # computed for another request or row with the same values is this one (carved
            # pslots re-checked by `refresh` meet the same few shapes again and again)
            cache = self._pair_values
            if len(cache) >= _PAIR_MEMO_ENTRIES:
                cache.clear()
            head = (text, slot_owns, mode, self._job_side(values, refs))
        vals = self.table.vals
        for k, r in enumerate(rows):
            key: Any = ((head, tuple([repr(vals[r].get(nm)) for nm in names]))
                        if names is not None else int(r))
            res = cache.get(key)
            if res is None:
                self.counters["pairs_classad"] += 1
                slot, job = self.table.ad(int(r)), jad()
                v = pair_eval(tree, slot, job) if slot_owns else pair_eval(tree, job, slot)
                if mode == "truth":
                    res = value_truth(v)
                elif mode == "rank":
                    res = value_rank(v)
                else:
                    res = float(v) if isinstance(v, (int, float)) and not isinstance(
                        v, (bool, classad2.Value)) else math.nan
                cache[key] = res
            out[k] = res
        return out

    # -- a request's match list ------------------------------------------------------------

    def evaluate(self, req: _Request, rows: IntArr, submitter: str, eup: float,
                 force_classad: bool = False) -> None:
        """(Re)compute `req`'s per-row match data for `rows`."""
        t, cfg = self.table, self.cfg
        cls = req.cls
        req.cand[cls[rows]] = False
        req.note[cls[rows]] = 0
        if len(rows) == 0:
            return
        groups = t.group[rows]
        for gid in np.flatnonzero(np.bincount(groups)):  # np.unique, without a sort
            r = rows[groups == gid]
            g = int(gid)

            def vec(text: str, slot_owns: bool, mode: str, rr: IntArr) -> npt.NDArray[Any]:
                return self.vec(text, slot_owns, mode, g, rr, req.values, req.classad,
                                force_classad)

            cp_rows = r[t.is_cp[r]]
            r = r[~t.is_cp[r]]
            if len(r):
                r = r[vec("MY.Requirements", False, "truth", r)]
            if len(r):
                r = r[vec("MY.Requirements", True, "truth", r)]
            cpus = mem = disk = np.zeros(0)
            if len(r):
                # a partitionable slot without a consumption policy takes the request as it
                # is: HTCondor's negotiator rounds nothing (the startd's MODIFY_REQUEST_EXPR
                # sizes the dynamic slot when it is claimed)
                cpus = np.where(np.isnan(c := vec("MY.RequestCpus", False, "num", r)), 1.0, c)
                mem = np.where(np.isnan(c := vec("MY.RequestMemory", False, "num", r)), 0.0, c)
                disk = np.where(np.isnan(c := vec("MY.RequestDisk", False, "num", r)), 0.0, c)
                ps = t.pslot[r]
                if ps.any():
                    have = [np.where(c.undef[r], 0.0, c.val[r]) if c.kind == "num"
                            else np.zeros(len(r)) for c in (t.column(x)[0] for x in _RESOURCES)]
                    fit = ~ps | ((cpus <= have[0]) & (mem <= have[1]) & (disk <= have[2]) & (cpus > 0))
                    r, cpus, mem, disk = r[fit], cpus[fit], mem[fit], disk[fit]
            cp_ok = [row for row in (int(x) for x in cp_rows) if self._cp_match(req, row)]
            if cp_ok:
                r = np.concatenate((r, np.asarray(cp_ok, dtype=np.intp)))
                cons = [req.cp[row] for row in cp_ok]
                cpus = np.concatenate((cpus, [c.get("cpus", 0.0) for c in cons]))
                mem = np.concatenate((mem, [c.get("memory", 0.0) for c in cons]))
                disk = np.concatenate((disk, [c.get("disk", 0.0) for c in cons]))
            if len(r) == 0:
                continue
            pre = vec(cfg.negotiator_pre_job_rank, True, "rank", r)
            jrank = vec("MY.Rank", False, "rank", r)
            post = vec(cfg.negotiator_post_job_rank, True, "rank", r)
            pstate = np.full(len(r), 2.0)
            prank = np.zeros(len(r))
            cl = t.claimed[r]
            ok = np.ones(len(r), dtype=bool)
            if cl.any():
                ci = np.flatnonzero(cl)
                rc = r[ci]
                srank = vec("MY.Rank", True, "rank", rc)
                cur, rprio = t.claim_values(rc)
                same = t.remote_code[rc] == t.remote_names.get(submitter, -2)
                rank_ok = srank > cur
                better = (eup < rprio) & ~same & (srank >= cur) & ~rank_ok
                preq = np.zeros(len(rc), dtype=bool)
                if better.any():
                    preq[better] = vec(cfg.preemption_requirements, True, "truth", rc[better])
                prio_ok = better & preq
                pstate[ci] = np.where(rank_ok, 1.0, np.where(prio_ok, 0.0, -1.0))
                ok[ci] = rank_ok | prio_ok
                notes = np.where(better & ~preq, _NOTE_PREQ,
                                 np.where(~rank_ok & ~same & (srank >= cur) & ~(eup < rprio),
                                          _NOTE_PRIO, 0))
                req.note[cls[rc]] = notes.astype(np.int8)
                if ok[ci].any():
                    prank[ci] = vec(cfg.preemption_rank, True, "rank", rc)
            r = r[ok]
            req.cand[cls[r]] = True
            req.keys[cls[r]] = np.column_stack((pre[ok], jrank[ok], post[ok], pstate[ok],
                                                prank[ok]))
            req.res[cls[r]] = np.column_stack((cpus[ok], mem[ok], disk[ok]))
            w = t.weight[r].copy()
            pk = np.flatnonzero(t.pslot[r])
            if len(pk):
                w[pk] = t.dslot_weights(r[pk], cpus[ok][pk], mem[ok][pk], disk[ok][pk])
                for k in pk:
                    row = int(r[k])
                    if row in t.cp:
                        w[k] = self._cp_cost(row, req.cp[row])
            req.weight[cls[r]] = w

    def _cp_match(self, req: _Request, row: int) -> bool:
        """Whether `req` matches consumption-policy pslot `row`, as HTCondor's negotiator
        decides it: Consumption<Asset> evaluated in the slot against the job (a missing
        Request<Asset> counts as 0); both Requirements evaluated with the job's
        Request<Asset> replaced by what the policy consumes; the slot must have every asset
        consumed, none negative, and at least one positive. What it consumes goes to
        `req.cp[row]`."""
        t = self.table
        v = t.vals[row]
        slot = t.ad(row)
        values = dict(req.values)
        for a in t.cp[row]:
            values.setdefault(f"request{a}", 0)
        job = values_ad(values) if len(values) > len(req.values) else req.classad()
        cons: dict[str, float] = {}
        for a in t.cp[row]:
            x = pair_eval(self.expr(f"MY.Consumption{a}"), slot, job)
            cons[a] = float(x) if isinstance(x, (int, float)) and not isinstance(
                x, (bool, classad2.Value)) and x >= 0 else -999.0
        self.counters["pairs_classad"] += 1
        have = {a: _num(v.get(a)) or 0.0 for a in cons}
        if any(c < 0 or c > have[a] for a, c in cons.items()) or not any(c > 0 for c in cons.values()):
            return False
        job = values_ad({**req.values, **{f"request{a}": _int_if_whole(c) for a, c in cons.items()
                                          if f"request{a}" in req.values}})
        if not (value_truth(pair_eval(self.expr("MY.Requirements"), job, slot))
                and value_truth(pair_eval(self.expr("MY.Requirements"), slot, job))):
            return False
        req.cp[row] = cons
        return True

    def _cp_cost(self, row: int, cons: Mapping[str, float]) -> float:
        """What a consumption-policy match costs: SlotWeight before the assets are taken
        minus SlotWeight after (1 without NEGOTIATOR_USE_SLOT_WEIGHTS)."""
        t = self.table
        if not t.use_weights:
            return 1.0
        v = t.vals[row]
        after = dict(v)
        after.update({a: _int_if_whole((_num(v.get(a)) or 0.0) - c) for a, c in cons.items()})
        return t._weight_of(row, v) - t._weight_of(row, after)

    def build(self, req: _Request, submitter: str, eup: float) -> None:
        """First evaluation of a request over every slot still available: once per slot
        class (rows alike in all that evaluation reads), on its first row."""
        self.counters["autoclusters_evaluated"] += 1
        t = self.table
        rows = np.flatnonzero(self.avail)
        req.seen = len(t.changes)
        names = self._request_names(req)
        if names is None:
            req.alloc(np.arange(t.n, dtype=np.intp), t.n)
            reps = rows
        else:
            pool = self.claimed_rows is not None and len(self.claimed_rows) > 0
            for pooled in ((True, False) if pool else (False,)):
                classes, first = t.classes(names, pooled)
                req.alloc(classes, len(first))
                of_rows = classes[rows]
                mark = np.zeros(len(first), dtype=bool)
                mark[of_rows] = True
                reps = first[mark]
                if not pooled:
                    break
                if self._claimed_note(req, submitter, eup):
                    reps = reps[~t.claimed[reps]]
                    req.pooled = True
                    break
                # else a claimed slot is a candidate: evaluated one by one
            self.evaluate(req, reps, submitter, eup)
            cand = req.cand[of_rows]
            req.resort(rows[cand], of_rows[cand])
            return
        self.evaluate(req, reps, submitter, eup)
        req.resort(rows[req.cand[req.cls[rows]]])

    def _claimed_note(self, req: _Request, submitter: str, eup: float) -> bool:
        """`req`'s match data on the available claimed slots (`claimed_rows`), all in one
        class of its `cls`, when they hold one value: no candidate among them, and the one
        note `pick` reads, as `evaluate` would note them one by one (PREEMPTION_REQUIREMENTS,
        the literal False here, refuses a slot of another user whose priority is worse than
        the submitter's; any other user's is insufficient priority). False (nothing set)
        when one of them is a candidate after all (`_claimed_matches`)."""
        rc = self.claimed_rows
        hit = self._claimed_matches(req)
        if rc is None or hit is None:
            return False
        best_code, best, second, codes = hit
        me = self.table.remote_names.get(submitter, -2)
        worst_other = second if me == best_code else best
        req.note[req.cls[rc[0]]] = (_NOTE_PREQ if eup < worst_other
                                    else _NOTE_PRIO if any(c != me for c in codes) else 0)
        return True

    def _claimed_matches(self, req: _Request) -> tuple[int, float, float, list[int]] | None:
        """What the note on the `claimed_rows` that match `req` both ways with a startd RANK
        of it at least their CurrentRank depends on: the RemoteUser code of the one with the
        worst (highest) RemoteUserPrio, that priority, the worst of the other users', and up
        to two of their codes; None if a RANK is above a CurrentRank (a rank preemption
        candidate). A function of the job's values of what the three expressions read, so
        kept per those values: autoclusters alike in them share it."""
        rc = self.claimed_rows
        assert rc is not None
        values = req.values
        texts = (("MY.Requirements", False), ("MY.Requirements", True), ("MY.Rank", True))
        key: tuple[Any, ...] | None = ()
        for text, slot_owns in texts:
            names = self._slot_refs(text, values)
            if names is None:
                key = None
                break
            key = (*cast(tuple[Any, ...], key), slot_owns, names, self._job_side(values, names))
        if key is not None and key in self._claimed_summaries:
            return self._claimed_summaries[key]
        t = self.table
        mask = np.zeros(len(rc), dtype=bool)
        out: tuple[int, float, float, list[int]] | None = None
        groups = t.group[rc]
        for gid in np.flatnonzero(np.bincount(groups)):
            sel = np.flatnonzero(groups == gid)
            for text, slot_owns in texts[:2]:
                m = self.vec(text, slot_owns, "truth", int(gid), rc[sel], values, req.classad)
                sel = sel[m]
            srank = self.vec("MY.Rank", True, "rank", int(gid), rc[sel], values, req.classad)
            cur = self.claimed_cur[sel]
            if (srank > cur).any():
                break
            mask[sel[srank >= cur]] = True
        else:
            codes, prio = self.claimed_codes[mask], self.claimed_prio[mask]
            prio = np.where(np.isnan(prio), -np.inf, prio)  # eup < NaN is false too
            top = int(np.argmax(prio)) if len(prio) else -1
            best_code = int(codes[top]) if top >= 0 else -3
            best = float(prio[top]) if top >= 0 else -math.inf
            second = float(prio[codes != best_code].max(initial=-math.inf))
            two = list(dict.fromkeys(codes.tolist()))[:2]
            out = (best_code, best, second, two)
        if key is not None:
            if len(self._claimed_summaries) >= _CLAIMED_SUMMARIES:
                self._claimed_summaries.clear()
            self._claimed_summaries[key] = out
        return out

    def refresh(self, req: _Request, submitter: str, eup: float) -> None:
        """Re-check the rows (carved pslots, each a class of its own) that changed since this
        request last looked."""
        changes = self.table.changes
        if req.seen == len(changes):
            return
        rows = np.unique(np.asarray(changes[req.seen:], dtype=np.intp))
        req.seen = len(changes)
        rows = rows[self.avail[rows]]
        if len(rows) == 0:
            return
        if len(rows) <= _SMALL_BATCH:
            self._recheck(req, rows, submitter, eup)
        else:
            self.evaluate(req, rows, submitter, eup)
        for r in rows:
            req.dirty.add(int(r))
            req.dirty_mask[r] = True
        if len(req.dirty) > _RESORT_AT:
            live = np.flatnonzero(self.avail)
            req.resort(live[req.cand[req.cls[live]]])

    def _recheck(self, req: _Request, rows: IntArr, submitter: str, eup: float) -> None:
        """`evaluate` of a few carved pslot rows by classad2 (which costs less than bringing
        every cached per-class value up to date, as the next build does anyway), each row
        first looked up among the shapes this request re-checked before: a row's match data
        follows from its evaluation group and its values of the request's names (what makes
        slot classes sound), and the pslots of one machine type are carved through the same
        few shapes. Consumption-policy and claimed rows are always evaluated."""
        names = self._request_names(req)
        t = self.table
        todo: list[int] = []
        learn: list[tuple[int, int]] = []
        for row in rows.tolist():
            if names is None or t.is_cp[row] or t.claimed[row]:
                todo.append(row)
                continue
            shape = self._shape(names, row)
            hit = req.rechecked.get(shape)
            if hit is None:
                todo.append(row)
                learn.append((row, shape))
                continue
            c = req.cls[row]
            req.cand[c], req.keys[c], req.res[c], req.weight[c], req.note[c] = hit
        if todo:
            self.evaluate(req, np.asarray(todo, dtype=np.intp), submitter, eup,
                          force_classad=True)
        if len(req.rechecked) + len(learn) > _RECHECKED_ENTRIES:
            req.rechecked.clear()
        for row, shape in learn:
            c = req.cls[row]
            req.rechecked[shape] = (bool(req.cand[c]), req.keys[c].copy(), req.res[c].copy(),
                                    float(req.weight[c]), int(req.note[c]))

    def _shape(self, names: frozenset[str], row: int) -> int:
        """A number for row `row`'s evaluation group and values of `names` (absent apart from
        undefined, types apart): equal numbers, equal shapes. Numbers are never reused, so a
        request's `rechecked` stays right when this table is cleared."""
        v = self.table.vals[row]
        key = (names, int(self.table.group[row]), tuple([
            (x.__class__, x) for x in map(v.get, sorted(names), itertools.repeat(_ABSENT))]))
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) >= _PAIR_MEMO_ENTRIES:
                self._shapes.clear()
            shape = self._shapes[key] = self._next_shape
            self._next_shape += 1
        return shape

    def _request_names(self, req: _Request) -> frozenset[str] | None:
        """Every slot attribute `req`'s match data (candidacy, sort keys, weight, request,
        note) is computed from: what its expressions reach through this job's and the slots'
        expression attributes, and what the preemption state and weights are made of; None
        if an expression reads attributes by computed name (eval()). Narrower than the
        cycle's `sort_names` (an attribute only some jobs read, such as Machine, splits the
        pool into one class per slot for those jobs only)."""
        if self.table.sort_names is None:
            return None
        if req.names is None:
            cfg = self.cfg
            names = set(_SORT_ATTRS)
            for text in ("MY.Requirements", "MY.RequestCpus", "MY.RequestMemory",
                         "MY.RequestDisk", "MY.Rank", "MY.SlotWeight",
                         cfg.negotiator_pre_job_rank, cfg.negotiator_post_job_rank,
                         cfg.preemption_requirements, cfg.preemption_rank):
                refs = self._slot_refs(text, req.values)
                if refs is None:
                    req.names = self.table.sort_names
                    return req.names
                names |= refs
            req.names = frozenset(names)
        return req.names

    def _scan(self, req: _Request, pos: int, remaining: float, zero: bool
              ) -> tuple[int, int | None, bool]:
        order, avail = req.order, self.avail
        # the usual case first, row by row: the best row is among the first few from where
        # the last pick stopped (those before it taken); what that cannot decide (a dirty
        # row, one over the limit) the chunks below decide from the first row still available
        for row in order[pos:pos + _FIRST_SCAN // 4].tolist():
            if not avail[row]:
                if pos == req.ptr:
                    req.ptr += 1
                pos += 1
                continue
            if not req.dirty_mask[row]:
                c = req.cls[row]
                if zero or req.weight[c] <= remaining + EPSILON or req.keys[c, 3] == 1.0:
                    return pos, row, False
            break
        limited = False
        step = _FIRST_SCAN
        while pos < len(order):
            chunk = order[pos:pos + step]
            step = _SCAN
            ok = avail[chunk] & ~req.dirty_mask[chunk]
            if pos == req.ptr:
                live = np.flatnonzero(avail[chunk])
                req.ptr = pos + (int(live[0]) if len(live) else len(chunk))
            c = req.cls[chunk]
            wok = (req.weight[c] <= remaining + EPSILON) | zero | (req.keys[c, 3] == 1.0)
            good = np.flatnonzero(ok & wok)
            if len(good) == 0:
                limited = limited or bool((ok & ~wok).any())
                pos += len(chunk)
                continue
            first = int(good[0])
            limited = limited or bool((ok[:first] & ~wok[:first]).any())
            return pos + first, int(chunk[first]), limited
        return len(order), None, limited

    def pick_rank(self, req: _Request, submitter: str, eup: float,
                  limits_ok: Callable[[int], str | None]) -> int | None:
        """The best claimed slot whose startd RANK strictly prefers `req` (preemption state
        1), for a submitter past its limit in the first spin; None if there is none."""
        self.refresh(req, submitter, eup)
        rows = np.flatnonzero(self.avail)
        c = req.cls[rows]
        rows = rows[req.cand[c] & (req.keys[c, 3] == 1.0)]
        if len(rows) == 0:
            return None
        k = req.keys[req.cls[rows]]
        for row in rows[np.lexsort((rows, -k[:, 4], -k[:, 2], -k[:, 1], -k[:, 0]))]:
            if limits_ok(int(row)) is None:
                return int(row)
        return None

    def pick(self, req: _Request, submitter: str, eup: float, remaining: float, zero: bool,
             limits_ok: Callable[[int], str | None]) -> tuple[int | None, str]:
        """The best acceptable slot row for the next job of `req`, or None and the reason."""
        self.refresh(req, submitter, eup)
        avail = self.avail
        limited = False
        d = np.fromiter(req.dirty, dtype=np.intp, count=len(req.dirty))
        cls = req.cls
        if len(d):
            d = d[avail[d] & req.cand[cls[d]]]
            wok = (req.weight[cls[d]] <= remaining + EPSILON) | zero | (req.keys[cls[d], 3] == 1.0)
            limited = bool((~wok).any())
            d = d[wok]
            k = req.keys[cls[d]]
            d = d[np.lexsort((d, -k[:, 4], -k[:, 3], -k[:, 2], -k[:, 1], -k[:, 0]))]
        di, pos = 0, req.ptr
        reasons: set[str] = set()
        while True:
            pos, srow, lim = self._scan(req, pos, remaining, zero)
            limited = limited or lim
            drow = int(d[di]) if di < len(d) else None
            if srow is None and drow is None:
                break
            use_dirty = srow is None or (drow is not None and (
                tuple(req.keys[cls[drow]]) > tuple(req.keys[cls[srow]])
                or (tuple(req.keys[cls[drow]]) == tuple(req.keys[cls[srow]]) and drow < srow)))
            row = drow if use_dirty else srow
            assert row is not None
            why = limits_ok(row)
            if why is None:
                return row, ""
            reasons.add(why)
            if use_dirty:
                di += 1
            else:
                pos += 1
        for r in sorted(reasons):
            return None, r
        # only a claimed slot has a note (`evaluate`; no class holds claimed and other slots)
        rows = self.claimed_idx[avail[self.claimed_idx]]
        notes = req.note[cls[rows]]
        notes = notes[notes > 0]
        if len(notes):
            if (notes == _NOTE_PREQ).any():
                return None, REJ_PREEMPTION_REQ
            return None, REJ_PRIORITY
        if limited:
            return None, REJ_LIMIT
        return None, REJ_NO_MATCH


# ---------------------------------------------------------------------------------------------
# The cycle


@dataclass(slots=True)
class _Job:
    """An idle job as the cycle holds it: ids and its autocluster (whose values are held once,
    in `_Cycle.ac_values`), plus its own concurrency limits, which are read per job."""

    job_id: str
    schedd: str
    cluster: int
    ac: int
    limits: Any = None


@dataclass
class _Queue:
    """A submitter's idle jobs in schedd order, with the cycle's skip sets."""

    jobs: list[_Job]
    pos: int = 0
    rejected_acs: dict[int, str] = field(default_factory=dict)
    rejected_clusters: dict[tuple[str, int], str] = field(default_factory=dict)


#: per-job attributes the cycle reads besides the autocluster's: ids, schedd, queue order and
#: concurrency limits (which are read per job even when not significant)
_PER_JOB = frozenset({"clusterid", "procid", "globaljobid", "scheddname", "qdate",
                      "prejobprio1", "prejobprio2", "jobprio", "postjobprio1", "postjobprio2",
                      "concurrencylimits", "concurrencylimitsexpr"})
_PER_JOB_TEXT = frozenset({"globaljobid", "scheddname", "concurrencylimits",
                           "concurrencylimitsexpr"})


def _getter(keys: Sequence[str | None]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A function reading `keys` (None: a name the ads lack) from a job ad as one tuple
    (`_ABSENT` for a lacking name), at C speed: it runs once per idle job."""
    if len(keys) > 1 and None not in keys:
        return cast(Callable[[Mapping[str, Any]], tuple[Any, ...]], operator.itemgetter(*keys))
    names, absent = tuple(keys), (_ABSENT,) * len(keys)
    return lambda ad: tuple(map(ad.get, names, absent))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _Plan:
    """How `_JobSorter` reads job ads with one list of attribute names: the significant
    values (`sig`), the per-job attributes (name, lowercased), whether one of them may hold
    an expression (`text`: read through `ad_values`), and the `ORDER_ATTRS` (`order`)."""

    sig: Callable[[Mapping[str, Any]], tuple[Any, ...]]
    per_job: list[tuple[str, str]]
    text: bool
    order: Callable[[Mapping[str, Any]], tuple[Any, ...]]


class _JobSorter:
    """One submitter's idle jobs into schedd order and autoclusters, holding no value dict per
    job: jobs with the same attribute names and the same significant values (and value types)
    share the values of the first of them, so `ad_values` runs once per such shape and per job
    only on the few attributes in `_PER_JOB`. The cycle assigns autocluster ids in schedd
    order (`_Cycle._build_queues`)."""

    def __init__(self, significant: Sequence[str], name: str, default_schedd: str) -> None:
        self.significant, self.name, self.default_schedd = significant, name, default_schedd
        self.items: list[tuple[str, tuple[Any, ...], int, _Job]] = []
        self.shapes: list[dict[str, Any]] = []
        self._plans: dict[tuple[str, ...], _Plan] = {}
        self._shape_of: dict[Any, int] = {}

    def _plan(self, keys: tuple[str, ...]) -> _Plan:
        """How to read ads with these attribute names (`_Plan`)."""
        sig = set(self.significant)
        per_job = [(k, k.lower()) for k in keys if k.lower() in _PER_JOB]
        sig_keys = [k for k in keys if k.lower() in sig]
        last = {low: k for k, low in per_job}  # a name given twice: the last one counts
        return _Plan(_getter(sig_keys), per_job, any(low in _PER_JOB_TEXT for _, low in per_job),
                     _getter([last.get(a) for a in ORDER_ATTRS]))

    def add(self, k: int, ad: Ad) -> None:
        """Queue job `k` (its ad); its `ac` is an index into `shapes`."""
        shape: int | None = None
        if isinstance(ad, classad2.ClassAd):
            values = ad_values(ad)
            shape = len(self.shapes)
            self.shapes.append(values)
        else:
            keys = tuple(ad)
            plan = self._plans.get(keys)
            if plan is None:
                plan = self._plans[keys] = self._plan(keys)
            vals = plan.sig(ad)
            raw: Any = (keys, vals, tuple(map(type, vals)))
            try:
                shape = self._shape_of.get(raw)
            except TypeError:  # an unhashable (list or nested ad) value
                raw = None
            if shape is None:
                shape = len(self.shapes)
                self.shapes.append(ad_values(ad))
                if raw is not None:
                    self._shape_of[raw] = shape
            if not plan.text:
                # the common case, without a values dict: numbers are read as they are (an
                # expression is no number to prio_key either)
                order = plan.order(ad)
                cluster = int(_num(order[6]) or 0)
                job_id = (f"{cluster}.{int(_num(order[7]) or 0)}" if order[6] is not _ABSENT
                          else f"{self.name}#{k}")
                schedd = str(self.default_schedd)
                self.items.append((schedd, order_key(order), k,
                                   _Job(job_id, schedd, cluster, shape, None)))
                return
            values = ad_values({x: ad[x] for x, _ in plan.per_job})
        cluster = int(_num(values.get("clusterid")) or 0)
        proc = int(_num(values.get("procid")) or 0)
        job_id = f"{cluster}.{proc}" if "clusterid" in values else f"{self.name}#{k}"
        gjid = values.get("globaljobid")
        schedd = str(values.get("scheddname") or (gjid.split("#")[0] if isinstance(
            gjid, str) and "#" in gjid else "") or self.default_schedd)
        limits = values.get("concurrencylimits")
        if limits is None:
            limits = values.get("concurrencylimitsexpr")
        self.items.append((schedd, prio_key(values), k,
                           _Job(job_id, schedd, cluster, shape, limits)))

    def sort_queue(self, ads: Sequence[Ad]) -> tuple[list[_Job], list[dict[str, Any]]]:
        """`ordered` after `add` of each of `ads` (a whole queue): by columns when `_columns`
        can, else job by job."""
        jobs = self._columns(ads)
        if jobs is not None:
            return jobs, self.shapes
        for k, ad in enumerate(ads):
            self.add(k, ad)
        return self.ordered()

    def _columns(self, ads: Sequence[Ad]) -> list[_Job] | None:
        """`add`'s common case over a whole queue at once, with one numpy sort instead of a
        key tuple per job: every ad a plain dict with the same attribute names, none per-job
        text (`_Plan.text`), each significant attribute of one value type (so equal values
        are equal shapes), order attributes plain numbers (ids ints below 2**53, no NaN).
        None (nothing changed) when the queue is not that case: `add` then decides."""
        n = len(ads)
        if not n or set(map(type, ads)) != {dict}:
            return None
        keys = tuple(ads[0])
        if list(map(tuple, ads)).count(keys) != n:
            return None
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plans[keys] = self._plan(keys)
        if plan.text:
            return None
        sig = set(self.significant)
        for key in keys:
            if key.lower() in sig and len(set(map(type, map(operator.itemgetter(key), ads)))) > 1:
                return None
        vals = list(map(plan.sig, ads))
        try:
            ids = {v: i for i, v in enumerate(dict.fromkeys(vals))}
        except TypeError:  # an unhashable (list or nested ad) value
            return None
        shape = list(map(ids.__getitem__, vals))
        last = {k.lower(): k for k in keys if k.lower() in _PER_JOB}
        cols: list[list[Any] | None] = []
        for attr in ORDER_ATTRS:
            key = last.get(attr)
            col = None if key is None else list(map(operator.itemgetter(key), ads))
            kinds = set() if col is None else set(map(type, col))
            if not kinds <= ({int} if attr in ("clusterid", "procid") else {int, float}):
                return None
            cols.append(col)
        sort_keys: list[npt.NDArray[Any]] = []
        try:
            for i, col in enumerate(cols):
                if col is None:
                    continue  # absent: the same key for every job
                if i < 6:
                    arr = np.array(col, dtype=np.float64)
                    if np.isnan(arr).any():
                        return None
                    sort_keys.append(-arr if i < 5 else arr)
                else:
                    ints = np.array(col, dtype=np.int64)
                    if ((ints >= 2**53) | (ints <= -2**53)).any():
                        return None
                    sort_keys.append(ints)
        except OverflowError:
            return None
        _, first = np.unique(np.array(shape, dtype=np.intp), return_index=True)
        self.shapes = [ad_values(ads[i]) for i in first.tolist()]
        # lexsort's last key sorts first; stable, so input position breaks ties
        idx = (np.lexsort(sort_keys[::-1]) if sort_keys else np.arange(n)).tolist()
        clusters, procs = cols[6], cols[7]
        schedd = str(self.default_schedd)
        if clusters is None:
            job_ids = [f"{self.name}#{k}" for k in idx]
            of_cluster = [0] * n
        else:
            of_cluster = [clusters[k] for k in idx]
            job_ids = ([f"{c}.0" for c in of_cluster] if procs is None
                       else [f"{c}.{procs[k]}" for c, k in zip(of_cluster, idx)])
        return list(map(_Job, job_ids, itertools.repeat(schedd), of_cluster,
                        [shape[k] for k in idx]))

    def ordered(self) -> tuple[list[_Job], list[dict[str, Any]]]:
        """The jobs in schedd order (schedd, priority, submission, id, input position), their
        `ac` an index into the shapes returned with them (the values of its first job)."""
        self.items.sort()  # input positions are distinct: no two items reach their _Job
        return [item[3] for item in self.items], self.shapes


def _sorted_queues(significant: Sequence[str], queues: Sequence[tuple[str, str, Sequence[Ad]]]
                   ) -> list[tuple[list[_Job], list[dict[str, Any]]]]:
    """`_JobSorter.ordered` of each (submitter, default schedd, idle job ads)."""
    out = []
    for name, schedd, ads in queues:
        out.append(_JobSorter(significant, name, schedd).sort_queue(ads))
    return out


def _expr_strings(ads: Sequence[Ad]) -> set[str]:
    """The expression strings ("/Expr(...)/") among the values of the dict ads in `ads`: a
    set first, a queue holds the same few values over and over (of all-dict hashable ads in
    one C-level pass)."""
    try:
        values = set(itertools.chain.from_iterable(map(dict.values, ads)))  # type: ignore[arg-type]
    except TypeError:  # a classad2 ad, or an unhashable (list or nested ad) value
        values = {v for ad in ads if not isinstance(ad, classad2.ClassAd) for v in ad.values()
                  if isinstance(v, str)}
    return {v for v in values if isinstance(v, str) and v.startswith("/Expr(")}


def _spare_core() -> bool:
    """Whether another core is idle (the load over the last minute leaves one): on a machine
    busy with other work a second process only takes time from this one (measured: the
    cycle's wall clock grew), so the cycle stays on one core."""
    cores = os.cpu_count() or 1
    return cores > 1 and os.getloadavg()[0] <= cores - 1


def _sorted_queues_forked(significant: Sequence[str],
                          queues: Sequence[tuple[str, str, Sequence[Ad]]]
                          ) -> list[tuple[list[_Job], list[dict[str, Any]]]]:
    """`_sorted_queues` on both cores: a forked child sorts the second half of the queues
    (by job count) while this process sorts the first, and sends its result back pickled.

    Each queue is sorted by the same code either way, so the result is the serial one. A
    child that fails for any reason (a bad job ad raises there as it would here) sends
    nothing, and its half is sorted here, raising what the serial run raises, in order."""
    total = sum(len(ads) for _, _, ads in queues)
    cut, seen = len(queues), 0
    for i, (_, _, ads) in enumerate(queues):
        if seen >= total / 2:
            cut = i
            break
        seen += len(ads)
    mine, theirs = queues[:cut], queues[cut:]
    recv, send = multiprocessing.Pipe(duplex=False)

    def child() -> None:
        try:
            # as tuples: a slots dataclass pickles ten times slower
            send.send([([(j.job_id, j.schedd, j.cluster, j.ac, j.limits) for j in jobs], shapes)
                       for jobs, shapes in _sorted_queues(significant, theirs)])
        except BaseException:  # noqa: BLE001 - the parent redoes this half and raises
            pass
        finally:
            send.close()

    proc = multiprocessing.get_context("fork").Process(target=child, daemon=True)
    proc.start()
    send.close()
    try:
        first = _sorted_queues(significant, mine)
        try:
            rest: list[tuple[list[_Job], list[dict[str, Any]]]] | None = [
                (list(itertools.starmap(_Job, jobs)), shapes) for jobs, shapes in recv.recv()]
        except EOFError:
            rest = None
    finally:
        recv.close()
        if proc.is_alive():
            proc.kill()
        proc.join()
    if rest is None:
        rest = _sorted_queues(significant, theirs)
    return first + rest


@dataclass
class _Prefetch:
    """The child building match lists ahead (`_Cycle._start_prefetch`): its pipe, the plan
    index this process is at (`cursor`) and the one the child is building (`building`), in
    shared memory, and lists received before they were wanted."""

    proc: Any
    conn: Any
    cursor: Any
    building: Any
    tokens: Any
    #: the plan index the child stops before
    end: int
    ahead: dict[int, Any] = field(default_factory=dict)


@dataclass
class _Ctx:
    """The group context a submitter negotiates in."""

    group: str
    autoregroup: bool = False


def _still_clock() -> float:
    """The default clock: never advances, so no time limit is ever reached."""
    return 0.0


class _Cycle:
    def __init__(self, snap: CycleInput, cfg: NegotiatorConfig,
                 clock: Callable[[], float] | None = None) -> None:
        self.snap, self.cfg = snap, cfg
        self.clock = clock if clock is not None else _still_clock
        self.cycle_start = self.spin_start = 0.0
        self.cycle_over = self.spin_over = False
        self.sub_time: dict[str, float] = {}
        self.schedd_time: dict[str, float] = {}
        self.stopped_subs: list[str] = []
        self.stopped_schedds: list[str] = []
        self.spins_cut = 0
        self.counters: dict[str, int] = {k: 0 for k in (
            "spins", "floor_round_matches", "jobs_considered", "autoclusters", "autoclusters_evaluated",
            "rows_column", "pairs_classad", "pslot_carves", "preemptions", "rejected_jobs",
            "allocation_rounds", "queue_workers", "match_workers", "prefetched")}
        self.counters["match_workers"] = 1
        self.prefetch: _Prefetch | None = None
        #: `_plan` when match lists are built ahead, and each entry's index
        self.plan: list[tuple[int, _Ctx, str]] = []
        self.plan_pos: dict[tuple[int, str, bool], int] = {}
        self.plan_at = 0
        self.subs: dict[str, SubmitterInput] = {}
        for s in snap.submitters:
            if s.name in self.subs:
                raise InvalidInputError(f"submitter {s.name} listed twice")
            self.subs[s.name] = s
        self.usage = {s.name: float(s.weighted_usage) for s in snap.submitters}
        self.table = t = _SlotTable(snap.slots)
        self.groups: dict[str, GroupInput] = {g.name: g for g in snap.groups}
        self.group_usage: dict[str, float] = {g.name: float(g.usage) for g in snap.groups}
        self._insert_slot_ephemera()
        t.compute_weights(cfg.negotiator_use_slot_weights)
        self.avail = t.usable.copy()
        self.engine = _Engine(t, cfg, self.avail, self.counters)
        in_pool = np.ones(t.n, dtype=bool)
        if cfg.negotiator_slot_constraint:
            in_pool = np.zeros(t.n, dtype=bool)
            for g, rows in enumerate(t.group_rows):
                if len(rows):
                    keep = self.engine.vec(cfg.negotiator_slot_constraint, True, "truth", g, rows,
                                           {}, classad2.ClassAd)
                    in_pool[rows] = keep
            self.avail &= in_pool
        if not cfg.negotiator_consider_preemption:
            self.avail &= ~t.claimed
        #: ALLOW_PSLOT_PREEMPTION: pslot row -> its claimed dynamic slots that may be preempted
        #: together for one job (none is preempted on its own), and the ones already taken
        self.children: dict[int, list[int]] = {}
        self.victims: set[int] = set()
        self.pslots_taken: set[int] = set()
        if cfg.allow_pslot_preemption and cfg.negotiator_consider_preemption:
            self._index_dslots()
        self.pool_size = float(t.weight[in_pool].sum())
        if ROOT_GROUP not in self.groups:
            self.groups[ROOT_GROUP] = GroupInput(ROOT_GROUP, self.pool_size)
            self.group_usage[ROOT_GROUP] = sum(
                self.usage[s.name] for s in snap.submitters if self._group_of(s) == ROOT_GROUP)
        self.quota = {g: float(x.quota) for g, x in self.groups.items()}
        self.limit_usage = dict(snap.limit_usage) if snap.limit_usage is not None else \
            self._limits_from_slots()
        self._build_queues()
        self.requests: dict[tuple[int, str, bool], _Request] = {}
        #: live match lists, least recently used first, at most `_REQUEST_BYTES` of them (as
        #: built: `request_bytes`): an evicted one is rebuilt from the slots as they are
        #: then, to the same picks
        self.request_bytes = 0
        t.sort_names = self._sort_names()
        self.matches: list[MatchRecord] = []
        self.dslots: list[DynamicSlot] = []
        self.dcount: dict[int, int] = {}
        self.stats = {s.name: SubmitterStats() for s in snap.submitters}
        self.rejections: dict[tuple[str, int], dict[str, int]] = {}
        self.rej_example: dict[tuple[str, int], str] = {}
        self.rej_jobs: dict[tuple[str, int], list[str]] = {}
        self._rank_possible: bool | None = None
        self.schedd_left = {k.rpartition("@")[2]: int(v) for k, v in snap.schedd_room.items()}
        if cfg.preemption_requirements.strip().lower() == "false" \
                and not self._rank_preemption_possible():
            eng = self.engine
            eng.claimed_rows = rows = np.flatnonzero(t.claimed & self.avail)
            eng.claimed_codes = t.remote_code[rows]
            eng.claimed_cur, eng.claimed_prio = t.claim_values(rows)

    # -- setup ------------------------------------------------------------------------------

    def _group_of(self, s: SubmitterInput) -> str:
        return s.group if s.group in self.groups else ROOT_GROUP

    def _insert_slot_ephemera(self) -> None:
        """RemoteUserPrio and friends, for the submitter each claimed slot is charged to."""
        for i, v in enumerate(self.table.vals):
            who = self.table.remote_sub[i]
            s = self.subs.get(who) if who else None
            if s is None:
                continue
            g = self._group_of(s)
            v["remoteuserprio"] = float(s.eup)
            v["remoteuserresourcesinuse"] = float(s.weighted_usage)
            v["remotegroup"] = g
            v["remotenegotiatinggroup"] = g
            if g in self.groups and g != ROOT_GROUP:
                v["remotegroupresourcesinuse"] = float(self.groups[g].usage)
                v["remotegroupquota"] = float(self.groups[g].quota)

    def _index_dslots(self) -> None:
        """Group the claimed dynamic slots under their partitionable slots; those retiring or
        already being preempted are never eligible (HTCondor's pslot preemption)."""
        t = self.table
        pslots = {t.names[int(i)]: int(i) for i in np.flatnonzero(t.pslot)}
        for i in (int(x) for x in np.flatnonzero(t.claimed & self.avail)):
            v = t.vals[i]
            if v.get("dynamicslot") is not True:
                continue
            self.avail[i] = False
            p = pslots.get(_DSLOT_NAME.sub(r"\1\2", t.names[i]))
            if p is None or (_num(v.get("retirementtimeremaining")) or 0.0) > 0 \
                    or str(v.get("state", "")).lower() == "preempting":
                continue
            self.children.setdefault(p, []).append(i)

    def _pslot_preemption(self, job: _Job, req: _Request, s: SubmitterInput, ctx: _Ctx,
                          remaining: float, zero: bool, only_rank: bool) -> float | None:
        """Match `job` to a partitionable slot by preempting some of its dynamic slots
        (ALLOW_PSLOT_PREEMPTION, seed 001): per pslot, its eligible dynamic slots in
        CurrentRank order, while that is at most the pslot's RANK of the job; one with a
        lower CurrentRank is a rank preemption, one with an equal CurrentRank a priority
        preemption (not of the submitter itself, PREEMPTION_REQUIREMENTS against that
        dynamic slot, never when only startd RANK counts); their cpus, memory and disk are
        added to the pslot's one at a time until the pslot matches the job both ways. The
        weight matched, or None."""
        if not self.children or req.values.get("wantpslotpreemption") is not True:
            return None
        t, eng = self.table, self.engine
        jad = req.classad()
        best: tuple[float, int, int, list[int], float] | None = None
        for p, kids in sorted(self.children.items()):
            kids = [k for k in kids if k not in self.victims]
            if p in self.pslots_taken or not t.usable[p] or not kids:
                continue
            rank = value_rank(pair_eval(eng.expr("MY.Rank"), t.ad(p), jad))
            kids.sort(key=lambda k: (_num(t.vals[k].get("currentrank")) or 0.0, k))
            assets = [a for a in _RESOURCES if _num(t.vals[p].get(a)) is not None]
            have = {a: float(math.floor(_num(t.vals[p].get(a)) or 0.0)) for a in assets}
            used: list[int] = []
            state = 1.0
            for k in kids:
                cur = _num(t.vals[k].get("currentrank")) or 0.0
                if cur > rank:
                    break
                if cur == rank:
                    if only_rank or t.remote_sub[k] == s.name or not value_truth(pair_eval(
                            eng.expr(self.cfg.preemption_requirements), t.ad(k), jad)):
                        continue
                    state = 0.0
                used.append(k)
                for a in assets:
                    have[a] += _num(t.vals[k].get(a)) or 0.0
                merged = {**t.vals[p], **{a: _int_if_whole(x) for a, x in have.items()}}
                mad = values_ad(merged)
                self.counters["pairs_classad"] += 1
                asks = {a: _num(pair_eval(eng.expr(f"MY.Request{a}"), jad, mad)) for a in assets}
                if all((x if x is not None else (1.0 if a == "cpus" else 0.0)) <= have[a]
                       for a, x in asks.items()) and \
                        value_truth(pair_eval(eng.expr("MY.Requirements"), jad, mad)) and \
                        value_truth(pair_eval(eng.expr("MY.Requirements"), mad, jad)):
                    w = t._weight_of(p, merged) if t.use_weights else 1.0
                    if best is None or (state, -len(used)) > (best[0], -len(best[3])):
                        best = (state, -len(used), p, used, w)
                    break
        if best is None:
            return None
        state, _, p, used, w = best
        if state == 0.0 and w > remaining + EPSILON and not zero:
            return None
        chosen: dict[str, float] = {}
        if self._limits_checker(job, req, chosen)(p) is not None:
            return None
        for lname, inc in chosen.items():
            self.limit_usage[lname] = self.limit_usage.get(lname, 0.0) + inc
        self.pslots_taken.add(p)
        self.victims.update(used)
        self.avail[p] = False
        self.counters["preemptions"] += len(used)
        users = sorted({t.remote_sub[k] or str(t.vals[k].get("remoteuser") or "") for k in used})
        self._charge_match(job, s, ctx, w, t.names[p], "Rank" if state >= 1 else "Priority",
                           ", ".join(users), None)
        return w

    def _limits_from_slots(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for i in np.flatnonzero(self.table.claimed):
            v = self.table.vals[i]
            for attr in ("concurrencylimits", "preemptingconcurrencylimits"):
                text = v.get(attr)
                if isinstance(text, str):
                    try:
                        incs = limit_increments(parse_limits(text))
                    except ConcurrencyLimitError:
                        continue
                    for k, x in incs.items():
                        out[k] = out.get(k, 0.0) + x
        return out

    def _limit_max(self, name: str) -> float:
        lm = self.snap.limit_max
        if callable(lm):
            return float(lm(name))
        if name in lm:
            return float(lm[name])
        head, dot, _ = name.partition(".")
        if dot and head in self.snap.limit_prefix_default:
            return float(self.snap.limit_prefix_default[head])
        return float(self.snap.limit_default)

    def _significant(self) -> set[str]:
        base = self.cfg.significant_attributes or DEFAULT_SIGNIFICANT_ATTRIBUTES
        sig = {a.lower() for a in base}
        texts = [self.cfg.negotiator_pre_job_rank, self.cfg.negotiator_post_job_rank,
                 self.cfg.preemption_requirements, self.cfg.preemption_rank]
        texts += [x for exprs in self.table.group_exprs for x in exprs.values()]
        for text in texts:
            sig |= referenced_names(text)[1]
        return sig

    def _sort_names(self) -> frozenset[str] | None:
        """Every slot attribute a request's evaluation can read: what any knob, slot or job
        expression references, and what the preemption state and weights are made of; None
        if an expression reads attributes by computed name (eval())."""
        names = set(_SORT_ATTRS) | self._significant()
        texts = [*self._job_exprs, *(x for exprs in self.table.group_exprs for x in exprs.values()),
                 self.cfg.negotiator_pre_job_rank, self.cfg.negotiator_post_job_rank,
                 self.cfg.preemption_requirements, self.cfg.preemption_rank]
        for text in texts:
            if _EVAL_CALL.search(text):
                return None
            mine, other = referenced_names(text)
            names |= mine | other
        return frozenset(names)

    def _build_queues(self) -> None:
        sig = self._significant()
        job_refs: dict[str, set[str]] = {}
        for jobs in self.snap.jobs.values():
            for ad in jobs:
                if isinstance(ad, classad2.ClassAd):
                    for x in ad_values(ad).values():
                        if isinstance(x, ExprText) and x.text not in job_refs:
                            job_refs[x.text] = referenced_names(x.text)[0]
            for v in _expr_strings(jobs):
                if v not in job_refs:
                    job_refs[v] = referenced_names(v[6:-2])[0]
        for names in job_refs.values():
            sig |= names
        self._job_exprs = [t[6:-2] if t.startswith("/Expr(") else t for t in job_refs]
        self.acs = Autoclusters(sig)
        #: autocluster -> the values of its first job: the request ad (every job of an
        #: autocluster has the same significant values, which are all matching reads)
        self.ac_values: list[dict[str, Any]] = []
        self.refused_acs: dict[int, str | None] = {}  # `_unevaluable`, per autocluster
        self.queues: dict[str, _Queue] = {}
        todo: list[tuple[str, str, Sequence[Ad]]] = []
        for name, jobs in self.snap.jobs.items():
            sub = self.subs.get(name)
            if sub is None:
                break  # raised below, after the jobs before it (as they would raise first)
            todo.append((name, sub.schedd, jobs))
        n_jobs = sum(len(ads) for _, _, ads in todo)
        parallel = self.cfg.negotiator_workers > 1 and n_jobs >= _PARALLEL_MIN_JOBS \
            and len(todo) > 1 and "fork" in multiprocessing.get_all_start_methods() \
            and _spare_core()
        sorted_queues = (_sorted_queues_forked if parallel else _sorted_queues)(
            self.acs.significant, todo)
        self.counters["queue_workers"] = 2 if parallel else 1
        for (name, _, _), (jobs, shapes) in zip(todo, sorted_queues):
            # autocluster ids in submitter and schedd order, as the serial sort gives them
            ac_of: dict[int, int] = {}
            for job in jobs:
                ac = ac_of.get(job.ac)
                if ac is None:
                    ac = ac_of[job.ac] = self._autocluster(name, shapes[job.ac])
                job.ac = ac
            self.queues[name] = _Queue(jobs)
        if len(todo) < len(self.snap.jobs):
            name = list(self.snap.jobs)[len(todo)]
            raise InvalidInputError(f"idle jobs for unknown submitter {name}")
        self.counters["autoclusters"] = len(self.acs.keys)

    def _autocluster(self, name: str, values: Mapping[str, Any]) -> int:
        ac = self.acs.assign(name, values)
        if ac == len(self.ac_values):
            self.ac_values.append(dict(values))
        return ac

    # -- queue and request helpers ---------------------------------------------------------

    def _peek(self, name: str) -> _Job | None:
        q = self.queues.get(name)
        if q is None:
            return None
        while q.pos < len(q.jobs):
            job = q.jobs[q.pos]
            if self.schedd_left and self._schedd_full(job):
                q.pos += 1  # the schedd has no more jobs to offer (MAX_JOBS_RUNNING)
                continue
            reason = self._prior_reason(q, job)
            if reason is None:
                return job
            end = q.pos + 1
            if not self.schedd_left and q.rejected_acs.get(job.ac) == reason:
                # the autocluster's next jobs are skipped alike: rejected as one run
                while end < len(q.jobs) and q.jobs[end].ac == job.ac:
                    end += 1
            self._reject_all(name, q.jobs[q.pos:end], reason)
            q.pos = end
        return None

    def _unevaluable(self, ac: int) -> str | None:
        """Why classad2 cannot evaluate one of the autocluster's expressions whatever the
        slot (nested too deep, or too much work), as the job's rejection reason; else None."""
        if ac not in self.refused_acs:
            self.refused_acs[ac] = next(
                (f"{attr} ({len(v.text)} characters): {problem}"
                 for attr, v in sorted(self.ac_values[ac].items())
                 if isinstance(v, ExprText) and (problem := evaluation_problem(v.text))),
                None)
        return self.refused_acs[ac]

    def _schedd_full(self, job: _Job) -> bool:
        """Whether `job`'s schedd may start no more jobs this cycle."""
        left = self.schedd_left.get(job.schedd.rpartition("@")[2])
        return left is not None and left <= 0

    def _reject(self, name: str, job: _Job, reason: str) -> None:
        self._reject_all(name, [job], reason)

    def _reject_all(self, name: str, jobs: Sequence[_Job], reason: str) -> None:
        """Reject `jobs` (of one autocluster, in queue order) for `reason`."""
        key = (name, jobs[0].ac)
        per = self.rejections.setdefault(key, {})
        per[reason] = per.get(reason, 0) + len(jobs)
        self.rej_example.setdefault(key, jobs[0].job_id)
        self.rej_jobs.setdefault(key, []).extend([f"{j.schedd}#{j.job_id}" for j in jobs])
        self.stats[name].rejections += len(jobs)
        self.counters["rejected_jobs"] += len(jobs)

    def _prior_reason(self, q: _Queue, job: _Job) -> str | None:
        """The reason `job` is skipped because its autocluster (or cluster) was rejected."""
        reason = q.rejected_acs.get(job.ac)
        if reason is None and not self.cfg.negotiate_all_jobs_in_cluster:
            reason = q.rejected_clusters.get((job.schedd, job.cluster))
        return reason

    # -- time limits -----------------------------------------------------------------------

    def _start_spin(self) -> None:
        self.spin_start = self.clock()
        self.spin_over = False

    def _stop_submitter(self, name: str) -> None:
        """NEGOTIATOR_MAX_TIME_PER_SUBMITTER: reject the submitter's remaining jobs."""
        self.stopped_subs.append(name)
        self.stats[name].time_limit = REJ_SUBMITTER_TIME
        q = self.queues[name]
        while (job := self._peek(name)) is not None:
            self._reject(name, job, REJ_SUBMITTER_TIME)
            q.pos += 1

    def _stop_schedd(self, schedd: str) -> None:
        """NEGOTIATOR_MAX_TIME_PER_SCHEDD: reject every remaining job of `schedd`."""
        self.stopped_schedds.append(schedd)
        for name, q in self.queues.items():
            keep = q.jobs[:q.pos]
            for job in q.jobs[q.pos:]:
                if job.schedd != schedd:
                    keep.append(job)
                    continue
                self._reject(name, job, self._prior_reason(q, job) or REJ_SCHEDD_TIME)
                if self.stats[name].time_limit is None:
                    self.stats[name].time_limit = REJ_SCHEDD_TIME
            q.jobs = keep

    def _time_check(self, name: str, job: _Job) -> str | None:
        """Which time limit stops work before trying `job`: "cycle", "spin", "submitter",
        "schedd", or None. Records the hit and stops what it stops."""
        now = self.clock()
        cfg = self.cfg
        if now - self.cycle_start >= cfg.negotiator_max_time_per_cycle:
            self.cycle_over = True
            return "cycle"
        if now - self.spin_start >= cfg.negotiator_max_time_per_piespin:
            if not self.spin_over:
                self.spins_cut += 1
            self.spin_over = True
            return "spin"
        if self.sub_time.get(name, 0.0) >= cfg.negotiator_max_time_per_submitter:
            self._stop_submitter(name)
            return "submitter"
        if self.schedd_time.get(job.schedd, 0.0) >= cfg.negotiator_max_time_per_schedd:
            self._stop_schedd(job.schedd)
            return "schedd"
        return None

    def _charge(self, name: str, job: _Job, t0: float) -> None:
        dt = self.clock() - t0
        self.sub_time[name] = self.sub_time.get(name, 0.0) + dt
        self.schedd_time[job.schedd] = self.schedd_time.get(job.schedd, 0.0) + dt

    def _time_limits(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cycle_over:
            out["cycle_time_limit_reached"] = True
        if self.stopped_subs:
            out["submitters"] = list(self.stopped_subs)
        if self.stopped_schedds:
            out["schedds"] = list(self.stopped_schedds)
        if self.spins_cut:
            out["piespins"] = self.spins_cut
        return out

    def _request(self, job: _Job, s: SubmitterInput, ctx: _Ctx) -> _Request:
        key = (job.ac, ctx.group, ctx.autoregroup)
        req = self.requests.pop(key, None)
        if req is None:
            req = self._prefetched(key, s, ctx)
            if req is None:
                req = self._new_request(job.ac, s, ctx)
                self.engine.build(req, s.name, float(s.eup))
            req.size = req.nbytes()
            self.request_bytes += req.size
            while self.requests and self.request_bytes > _REQUEST_BYTES:
                self.request_bytes -= self.requests.pop(next(iter(self.requests))).size
        self.requests[key] = req
        return req

    def _new_request(self, ac: int, s: SubmitterInput, ctx: _Ctx) -> _Request:
        """Autocluster `ac` of `s` negotiating in `ctx`, its match list not built yet."""
        g = self._group_of(s)
        values = dict(self.ac_values[ac])
        values.update({
            "submitteruserprio": float(s.eup), "submittorprio": float(s.eup),
            "submitteruserresourcesinuse": float(s.weighted_usage),
            "submittergroup": g, "submitternegotiatinggroup": ctx.group,
            "submitterautoregroup": ctx.autoregroup,
            "submittergroupresourcesinuse": float(self.groups[g].usage),
        })
        if g != ROOT_GROUP:
            values["submittergroupquota"] = float(self.groups[g].quota)
        return _Request(ac, values, self.table.n)

    # -- match lists built ahead on the second core ----------------------------------------

    def _plan(self) -> list[tuple[int, _Ctx, str]]:
        """The match lists the cycle will likely build, in the order it likely builds them:
        the floor round's submitters, then each group's in its first spin's order (EUP),
        each one's autoclusters in queue order. A guess: a list it never asks for is work
        lost, one it asks for out of turn is built here."""
        plan: list[tuple[int, _Ctx, str]] = []
        seen: set[tuple[int, str, bool]] = set()
        floor = [s for s in self.subs.values() if s.floor > self.usage[s.name]]
        for s in sorted(floor, key=lambda x: (x.eup, x.name)) + [
                s for g in self._order()
                for s in sorted(self._members(g), key=lambda x: (x.eup, x.name))]:
            q = self.queues.get(s.name)
            if q is None:
                continue
            ctx = _Ctx(self._group_of(s))
            for ac in dict.fromkeys(job.ac for job in q.jobs):
                key = (ac, ctx.group, ctx.autoregroup)
                if key not in seen and self._unevaluable(ac) is None:
                    seen.add(key)
                    plan.append((ac, ctx, s.name))
        return plan

    def _start_prefetch(self) -> None:
        """With an idle core (`_spare_core`) and a large cycle, fork a child that builds the
        next `_EPOCH` match lists of `_plan` ahead of this process (at most `_LOOKAHEAD`
        lists unread), from the slots as they are when it is forked; this process takes one
        when it first needs it and brings it up to date with `_Engine.refresh`, as it does a
        list it built itself earlier in the cycle (the same picks: `refresh` re-checks every
        slot changed since). A list the child has not started on is built here. When this
        process is past a child's lists, a new child is forked from where it is (so what
        `refresh` re-checks stays a few carved slots)."""
        n_jobs = sum(len(q.jobs) for q in self.queues.values())
        if not (self.cfg.negotiator_workers > 1 and n_jobs >= _PARALLEL_MIN_JOBS
                and "fork" in multiprocessing.get_all_start_methods() and _spare_core()):
            return
        plan = self._plan()
        if len(plan) < 2:
            return
        self.plan = plan
        self.plan_pos = {(ac, ctx.group, ctx.autoregroup): i for i, (ac, ctx, _) in enumerate(plan)}
        self._fork_prefetch(0)
        self.counters["match_workers"] = 2

    def _fork_prefetch(self, start: int) -> None:
        """A child building `plan[start:start + _EPOCH]` (`_start_prefetch`)."""
        self._stop_prefetch()
        if start >= len(self.plan):
            return
        mp = multiprocessing.get_context("fork")
        cursor, building = mp.RawValue("q", start), mp.RawValue("q", -1)
        tokens = mp.Semaphore(_LOOKAHEAD)
        recv, send = mp.Pipe(duplex=False)
        end = min(len(self.plan), start + _EPOCH)
        proc = mp.Process(target=self._prefetch_child,
                          args=(end, send, cursor, building, tokens), daemon=True)
        proc.start()
        send.close()
        self.prefetch = _Prefetch(proc, recv, cursor, building, tokens, end)

    def _prefetch_child(self, end: int, send: Any, cursor: Any, building: Any, tokens: Any
                        ) -> None:
        """The child of `_fork_prefetch`: builds and sends (plan index, match list) in plan
        order up to `end`, skipping what the parent has passed, at most `_LOOKAHEAD` lists
        ahead of what the parent has received (`tokens`); any failure ends it quietly (the
        parent then builds the rest, raising what the serial cycle raises)."""
        try:
            i = 0
            while True:
                tokens.acquire()
                i = max(i, cursor.value)
                if i >= end:
                    return
                building.value = i
                ac, ctx, name = self.plan[i]
                req = self._new_request(ac, self.subs[name], ctx)
                self.engine.build(req, name, float(self.subs[name].eup))
                if i >= cursor.value:
                    send.send((i, req.seen, req.names, req.pooled, req.cand, req.keys,
                               req.weight, req.res, req.note, req.order.astype(np.int32),
                               req.cp))
                else:
                    tokens.release()
                i += 1
        except BaseException:  # noqa: BLE001 - the parent builds what is missing
            pass
        finally:
            send.close()

    def _prefetched(self, key: tuple[int, str, bool], s: SubmitterInput, ctx: _Ctx
                    ) -> _Request | None:
        """The child's match list for `key` if it has built it or is building it, else None
        (built here; the child skips past it, or a new child starts after it)."""
        p = self.plan_pos.get(key) if self.plan else None
        if p is None or p < self.plan_at:
            return None  # not in the plan, or behind where the cycle got to
        self.plan_at = p + 1
        pf = self.prefetch
        msg, dead = None, False
        if pf is not None and pf.cursor.value <= p < pf.end:
            pf.cursor.value = p
            msg = pf.ahead.pop(p, None)
            try:
                while msg is None:
                    if not pf.conn.poll(0):
                        if pf.building.value != p:
                            break
                        pf.conn.poll(None)  # the child is building it: wait
                    got = pf.conn.recv()
                    pf.tokens.release()
                    if got[0] == p:
                        msg = got
                    elif got[0] > p:
                        pf.ahead[got[0]] = got
            except (EOFError, OSError):
                dead = True
            pf.cursor.value = p + 1
            for i in [i for i in pf.ahead if i <= p]:
                del pf.ahead[i]
        if pf is None or dead or p + 1 >= pf.end:
            self._fork_prefetch(p + 1)
        if msg is None:
            return None
        _, seen, names, pooled, cand, keys, weight, res, note, order, cp = msg
        t = self.table
        req = self._new_request(key[0], s, ctx)
        req.seen, req.names, req.pooled, req.cp = seen, names, pooled, cp
        req.cls = (np.arange(t.n, dtype=np.intp) if t.sort_names is None
                   else t.classes(names, pooled)[0])
        req.cand, req.keys, req.weight, req.res, req.note = cand, keys, weight, res, note
        req.order = order.astype(np.intp)
        self.counters["autoclusters_evaluated"] += 1
        self.counters["prefetched"] += 1
        # the slots carved since the child was forked, re-checked and sorted in now: left
        # dirty, every pick of this list would sort them again
        self.engine.refresh(req, s.name, float(s.eup))
        if req.dirty:
            live = np.flatnonzero(self.avail)
            req.resort(live[req.cand[req.cls[live]]])
        return req

    def _stop_prefetch(self) -> None:
        pf, self.prefetch = self.prefetch, None
        if pf is not None:
            pf.conn.close()
            if pf.proc.is_alive():
                pf.proc.kill()
            pf.proc.join()

    def _job_limits(self, job: _Job, req: _Request, row: int) -> dict[str, float] | str:
        """The job's concurrency-limit increments on slot `row`, or a rejection reason."""
        text = job.limits
        if isinstance(text, ExprText):
            v = pair_eval(self.engine.expr(text.text), req.classad(), self.table.ad(row))
            text = v if isinstance(v, str) else None
        if not isinstance(text, str) or not text.strip():
            return {}
        try:
            return limit_increments(parse_limits(text))
        except ConcurrencyLimitError as exc:
            return f"invalid concurrency limit {exc.token}"

    # -- negotiation -----------------------------------------------------------------------

    def _negotiate_submitter(self, s: SubmitterInput, limit: float, ctx: _Ctx,
                             floor_round: bool = False, first_spin: bool = False
                             ) -> tuple[float, bool]:
        """Offer `s`'s jobs until its limit is used; (weight matched, no jobs left).

        In the first spin of a group with preemption considered, a submitter that reaches its
        limit goes on for the slots whose startd RANK strictly prefers its jobs (HTCondor's
        `ignore_submitter_limit` / only-startd-rank negotiation)."""
        spent = 0.0
        name = s.name
        self.stats[name].limit = limit
        while True:
            if self.cycle_over or self.spin_over:
                return spent, False
            job = self._peek(name)
            if job is None:
                return spent, True
            zero = self.usage[name] <= 0.0
            remaining = limit - spent
            if remaining < EPSILON and not zero:
                break
            if not self.avail.any():
                return spent, False
            hit = self._time_check(name, job)
            if hit == "submitter":
                return spent, True
            if hit is not None:
                continue  # cycle/spin: returns above; schedd: its jobs are gone, next job
            t0 = self.clock()
            try:
                got = self._try_job(job, s, ctx, remaining, zero, floor_round)
            finally:
                self._charge(name, job, t0)
            if got is None:
                break
            spent += got
        if first_spin:
            spent += self._rank_only(s, ctx)
        return spent, False

    def _rank_preemption_possible(self) -> bool:
        """Whether some claimed slot's startd RANK could beat its CurrentRank (an expression,
        or a literal above it): without one, the only-startd-rank pass cannot match."""
        if self._rank_possible is None:
            t = self.table
            self._rank_possible = any(
                isinstance(t.vals[i].get("rank"), ExprText)
                or (_num(t.vals[i].get("rank")) or 0.0) > (_num(t.vals[i].get("currentrank")) or 0.0)
                for i in np.flatnonzero(t.claimed & self.avail))
        return self._rank_possible

    def _rank_only(self, s: SubmitterInput, ctx: _Ctx) -> float:
        """The submitter is at its limit in the first spin: match its remaining jobs to claimed
        slots whose startd RANK strictly prefers them, outside its limit. A job with no such
        slot is left for later spins untouched (HTCondor's schedd forgets the rejection when
        the next spin starts a new negotiation)."""
        if not self.cfg.negotiator_consider_preemption or not self._rank_preemption_possible():
            return 0.0
        name = s.name
        q = self.queues[name]
        tried: set[int] = set()
        got = 0.0
        k = q.pos
        while k < len(q.jobs) and not (self.cycle_over or self.spin_over) and self.avail.any():
            job = q.jobs[k]
            if job.ac in tried or self._prior_reason(q, job) is not None or (
                    self.schedd_left and self._schedd_full(job)):
                k += 1
                continue
            hit = self._time_check(name, job)
            if hit == "submitter":
                break
            if hit is not None:
                k = q.pos  # a schedd's jobs left the queue; the loop ends on cycle/spin
                continue
            t0 = self.clock()
            try:
                self.counters["jobs_considered"] += 1
                req = self._request(job, s, ctx)
                chosen: dict[str, float] = {}
                row = self.engine.pick_rank(req, name, float(s.eup),
                                            self._limits_checker(job, req, chosen))
                if row is None and self.children:
                    w = self._pslot_preemption(job, req, s, ctx, 0.0, False, only_rank=True)
                    if w is not None:
                        got += w
                        q.jobs.pop(k)
                        continue
                if row is None:
                    tried.add(job.ac)
                    k += 1
                    continue
                got += self._commit(job, req, row, s, ctx, chosen)
                q.jobs.pop(k)
            finally:
                self._charge(name, job, t0)
        return got

    def _limits_checker(self, job: _Job, req: _Request, chosen: dict[str, float]
                        ) -> Callable[[int], str | None]:
        """A check of `job`'s concurrency limits on a slot row: None if they allow it (its
        increments are left in `chosen`), else the rejection reason."""
        def limits_ok(row: int) -> str | None:
            incs = self._job_limits(job, req, row)
            if isinstance(incs, str):
                return incs
            for lname, inc in incs.items():
                if self.limit_usage.get(lname, 0.0) + inc > self._limit_max(lname) + EPSILON:
                    return REJ_CONCURRENCY.format(lname)
            chosen.clear()
            chosen.update(incs)
            return None
        return limits_ok

    def _try_job(self, job: _Job, s: SubmitterInput, ctx: _Ctx, remaining: float, zero: bool,
                 floor_round: bool) -> float | None:
        """Try one job: the weight matched (0.0 if rejected), or None at the submitter limit."""
        name = s.name
        self.counters["jobs_considered"] += 1
        refused = self._unevaluable(job.ac)
        if refused is not None:  # a 2,000-term Requirements: this job's problem, not the cycle's
            q = self.queues[name]
            q.rejected_acs[job.ac] = refused
            self._reject(name, job, refused)
            q.pos += 1
            return 0.0
        req = self._request(job, s, ctx)
        chosen: dict[str, float] = {}
        limits_ok = self._limits_checker(job, req, chosen)
        row, reason = self.engine.pick(req, name, float(s.eup), remaining, zero, limits_ok)
        if row is None and self.children:
            got = self._pslot_preemption(job, req, s, ctx, remaining, zero, only_rank=False)
            if got is not None:
                self.queues[name].pos += 1
                return got
        if row is None:
            if reason == REJ_LIMIT:
                return None
            q = self.queues[name]
            q.rejected_acs[job.ac] = reason
            q.rejected_clusters[(job.schedd, job.cluster)] = reason
            self._reject(name, job, reason)
            q.pos += 1
            return 0.0
        w = self._commit(job, req, row, s, ctx, chosen)
        if floor_round:
            self.stats[name].floor_matches += 1
            self.counters["floor_round_matches"] += 1
        self.queues[name].pos += 1
        return w

    def _commit(self, job: _Job, req: _Request, row: int, s: SubmitterInput, ctx: _Ctx,
                incs: Mapping[str, float]) -> float:
        t = self.table
        w = float(req.weight[req.cls[row]])
        state = req.keys[req.cls[row], 3]
        reason = "NoPreemption" if state >= 2 else "Rank" if state >= 1 else "Priority"
        preempts = t.remote_sub[row] if t.claimed[row] else None
        if preempts is None and t.claimed[row]:
            preempts = str(t.vals[row].get("remoteuser") or "")
        if t.claimed[row]:
            self.counters["preemptions"] += 1
        slot_name, pslot = t.names[row], None
        if t.pslot[row]:
            c, m, d = (float(x) for x in req.res[req.cls[row]])
            v = t.vals[row]
            taken = req.cp[row] if row in t.cp else dict(zip(_RESOURCES, (c, m, d)))
            left = {r: _int_if_whole((_num(v.get(r)) or 0.0) - x) for r, x in taken.items()}
            k = self.dcount.get(row, int(_num(v.get("numdynamicslots")) or 0)) + 1
            self.dcount[row] = k
            base, at, host = slot_name.partition("@")
            slot_name, pslot = f"{base}_{k}{at}{host}", t.names[row]
            t.update(row, left)
            self.counters["pslot_carves"] += 1
            cpus_left, mem_left, disk_left = (_num(t.vals[row].get(r)) or 0.0 for r in _RESOURCES)
            self.dslots.append(DynamicSlot(slot_name, pslot, job.job_id, c, m, d, w,
                                           cpus_left, mem_left, disk_left))
            if cpus_left <= 0 or mem_left <= 0:
                self.avail[row] = False
            t.weight[row] = t._weight_of(row, t.vals[row]) if t.use_weights else 1.0
        else:
            self.avail[row] = False
        for lname, inc in incs.items():
            self.limit_usage[lname] = self.limit_usage.get(lname, 0.0) + inc
        self._charge_match(job, s, ctx, w, slot_name, reason, preempts, pslot)
        return w

    def _charge_match(self, job: _Job, s: SubmitterInput, ctx: _Ctx, w: float, slot_name: str,
                      reason: str, preempts: str | None, pslot: str | None) -> None:
        """Record a match and charge it: the submitter's and group's usage, the schedd's
        room, the statistics."""
        host = job.schedd.rpartition("@")[2]
        if host in self.schedd_left:
            self.schedd_left[host] -= 1
        g = self._group_of(s)
        self.usage[s.name] += w
        self.group_usage[g] = self.group_usage.get(g, 0.0) + w
        st = self.stats[s.name]
        st.matches += 1
        st.weight += w
        self.matches.append(MatchRecord(job.job_id, job.schedd, s.name, ctx.group, slot_name,
                                        reason, preempts, w, job.ac, pslot))

    def _slice(self, s: SubmitterInput) -> Slice:
        return Slice(s.name, float(s.eup), self.usage[s.name], float(s.ceiling), float(s.floor))

    def _room(self, g: str) -> float:
        if g == ROOT_GROUP and ROOT_GROUP not in {x.name for x in self.snap.groups}:
            return math.inf
        room = self.quota.get(g, 0.0) - self.group_usage.get(g, 0.0)
        return float(math.floor(room + EPSILON)) if self.cfg.negotiator_strict_enforce_quota else room

    def _floor_round(self) -> None:
        members = [s for s in self.subs.values()
                   if s.floor > self.usage[s.name] and self._peek(s.name) is not None]
        if not members:
            return
        slices = [self._slice(s) for s in members]
        limits, _ = floor_limits(slices, math.inf)
        self._start_spin()
        for i in spin_order(slices, limits):
            if self.cycle_over or self.spin_over:
                break
            s = members[i]
            g = self._group_of(s)
            lim = min(limits[i], max(0.0, self._room(g)))
            if lim > 0:
                self._negotiate_submitter(s, lim, _Ctx(g), floor_round=True)

    def _negotiate_group(self, g: str, members: list[SubmitterInput], pie: float,
                         autoregroup_of: set[str] | None = None, limit: float = math.inf) -> None:
        """The pie spins for one group (or the final autoregroup turn of `<none>`), up to the
        group usage `limit` of a round-robin step."""
        removed: set[str] = set()
        for spin in range(self.cfg.max_spins):
            if self.cycle_over:
                return
            active = [s for s in members if s.name not in removed and self._peek(s.name) is not None]
            removed |= {s.name for s in members if self._peek(s.name) is None}
            room = math.inf if autoregroup_of is not None else min(
                self._room(g), limit - self.group_usage.get(g, 0.0))
            first = spin == 0 and self.cfg.negotiator_consider_preemption
            if first and active and room <= 0 and self.avail.any():
                # At its quota the group still negotiates its first spin, for startd RANK only.
                slices = [self._slice(s) for s in active]
                self._start_spin()
                for i in spin_order(slices, [0.0] * len(slices)):
                    if self.cycle_over or self.spin_over:
                        break
                    self._rank_only(active[i], self._ctx_of(active[i], g, autoregroup_of))
                return
            if not active or room <= 0 or not self.avail.any():
                return
            self.counters["spins"] += 1
            slices = [self._slice(s) for s in active]
            limits, pie_left = spin_limits(slices, pie, room)
            before, n_removed = pie_left, len(removed)
            self._start_spin()
            for i in spin_order(slices, limits):
                if self.cycle_over or self.spin_over:
                    break
                s = active[i]
                lim = min(limits[i], pie_left)
                got, done = self._negotiate_submitter(s, lim, self._ctx_of(s, g, autoregroup_of),
                                                      first_spin=first)
                pie_left -= got
                if done:
                    removed.add(s.name)
            if pie_left >= before - EPSILON and len(removed) == n_removed:
                return

    @staticmethod
    def _ctx_of(s: SubmitterInput, g: str, autoregroup_of: set[str] | None) -> _Ctx:
        """The group context `s` negotiates in: `<none>` as autoregroup, else `g`."""
        if autoregroup_of is not None and s.name in autoregroup_of:
            return _Ctx(ROOT_GROUP, True)
        return _Ctx(g)

    def _order(self) -> list[str]:
        names = [g for g in self.groups]
        if self.snap.group_order:
            known = [g for g in self.snap.group_order if g in self.groups]
            rest = [g for g in names if g not in known]
            return known + sorted(rest, key=str.lower)

        def key(g: str) -> tuple[float, str]:
            if g == ROOT_GROUP:
                return (3.4e38, g)
            q = self.quota.get(g, 0.0)
            return (self.group_usage.get(g, 0.0) / q if q > 0 else 3.3e38, g.lower())
        return sorted(names, key=key)

    def _members(self, g: str) -> list[SubmitterInput]:
        return [s for s in self.subs.values() if self._group_of(s) == g and s.name in self.queues]

    def _exhausted(self, g: str) -> bool:
        return all(self._peek(s.name) is None for s in self._members(g))

    def _round_robin(self, order: list[str]) -> None:
        """One allocation round: every group with submitters negotiates, in starvation order.

        As GroupEntry.cpp's weighted round robin: `n` grows by GROUP_QUOTA_ROUND_ROBIN_RATE up
        to `maxdelta`, the largest gap between a group's target and its usage at the round's
        start, and each step lets every group reach `usage + delta * n / maxdelta` (floored
        unless slots are weighted), so groups competing for the same slots share them. Unset,
        the rate is infinite: one step, each group for its whole limit.
        """
        configured = {x.name for x in self.snap.groups}
        turns: list[tuple[str, list[SubmitterInput], float]] = []
        for g in order:
            members = self._members(g)
            if members:
                pie = self.pool_size if g == ROOT_GROUP and g not in configured \
                    else min(self.pool_size, self.quota[g])
                turns.append((g, members, pie))
        # An unconfigured <none> may use the whole pool, but its share is what the configured
        # top-level groups leave (HTCondor's root quota after its children's).
        rest = self.pool_size - sum(max(self.quota.get(g, 0.0), 0.0)
                                    for g in configured if g != ROOT_GROUP and "." not in g)
        start = {g: self.group_usage.get(g, 0.0) for g, _, _ in turns}
        delta = {g: max(0.0, (rest if g == ROOT_GROUP and g not in configured else pie) - start[g])
                 for g, _, pie in turns}
        rate = self.cfg.group_quota_round_robin_rate
        maxdelta = max(delta.values(), default=0.0)
        step = maxdelta if rate is None or not math.isfinite(maxdelta) else rate
        n = 0.0
        while True:
            n = min(n + step, maxdelta)
            for g, members, pie in turns:
                if self.cycle_over:
                    return
                limit = math.inf
                if n < maxdelta:
                    limit = start[g] + delta[g] * n / maxdelta
                    if not self.cfg.negotiator_use_slot_weights:
                        limit = math.floor(limit + EPSILON)
                self._negotiate_group(g, members, pie, limit=limit)
            if n >= maxdelta:
                return

    def _reallocate(self) -> bool:
        """Give quota that exhausted groups cannot use to groups that accept surplus.

        A simplified stand-in for the HGQ allocation rounds (GROUP_QUOTA_MAX_ALLOCATION_ROUNDS):
        the unused quota rolls up from the exhausted group to the nearest ancestor under
        which non-exhausted surplus-accepting groups exist, and is shared among them in
        proportion to their quotas; a group that does not accept surplus stops the roll-up.
        """
        moved = False
        live = {g for g in self.groups if g != ROOT_GROUP and not self._exhausted(g)}
        for g in list(self.groups):
            if g == ROOT_GROUP or g in live:
                continue
            unused = self.quota[g] - self.group_usage.get(g, 0.0)
            if unused <= EPSILON:
                continue
            node = g
            while True:
                parent = node.rpartition(".")[0] if "." in node else ROOT_GROUP
                takers = [h for h in live if h != g and self.groups[h].accept_surplus
                          and _under(h, parent) and _path_accepts(h, parent, self.groups)]
                if takers:
                    total = sum(max(self.quota[h], 0.0) for h in takers)
                    for h in takers:
                        share = self.quota[h] / total if total > 0 else 1.0 / len(takers)
                        self.quota[h] += unused * share
                    self.quota[g] -= unused
                    moved = True
                    break
                if parent == ROOT_GROUP or not self.groups.get(parent, GroupInput(parent, 0)).accept_surplus:
                    break
                node = parent
        return moved

    def run(self) -> CycleResult:
        self._start_prefetch()
        try:
            return self._run()
        finally:
            self._stop_prefetch()

    def _run(self) -> CycleResult:
        self.cycle_start = self.clock()
        self._floor_round()
        regroup = {s.name for s in self.subs.values()
                   if self.groups[self._group_of(s)].autoregroup}
        order = [g for g in self._order() if not (regroup and g == ROOT_GROUP)]
        for _ in range(max(1, self.cfg.group_quota_max_allocation_rounds)):
            self.counters["allocation_rounds"] += 1
            self._round_robin(order)
            if self.cycle_over or len(self.groups) <= 1 or not self._reallocate():
                break
        if regroup and not self.cycle_over:
            members = self._members(ROOT_GROUP) + [
                self.subs[n] for n in sorted(regroup) if n in self.queues]
            self._negotiate_group(ROOT_GROUP, members, self.pool_size, regroup)
        for name, st in self.stats.items():
            st.usage_end = self.usage[name]
            if self.cycle_over and st.time_limit is None and self._peek(name) is not None:
                st.time_limit = CYCLE_TIME_LIMIT
        rejections = tuple(
            AutoclusterRejection(sub, ac, dict(reasons), self.rej_example[(sub, ac)],
                                 self.acs.describe(ac), tuple(self.rej_jobs[(sub, ac)]))
            for (sub, ac), reasons in sorted(self.rejections.items()))
        return CycleResult(self.snap.cycle, self.snap.now, tuple(self.matches), self.stats,
                           rejections, tuple(self.dslots), dict(self.counters), self.pool_size,
                           self._time_limits())


def _under(h: str, parent: str) -> bool:
    return parent == ROOT_GROUP or h.lower().startswith(parent.lower() + ".")


def _path_accepts(h: str, parent: str, groups: Mapping[str, GroupInput]) -> bool:
    """Every group from `parent` (exclusive) down to `h` accepts surplus."""
    node = h
    while node and node.lower() != parent.lower():
        gi = groups.get(node)
        if gi is None or not gi.accept_surplus:
            return False
        if "." not in node:
            break
        node = node.rpartition(".")[0]
    return True


def negotiate(snapshot: CycleInput, cfg: NegotiatorConfig | None = None,
              clock: Callable[[], float] | None = None) -> CycleResult:
    """Run one negotiation cycle over `snapshot`; pure and deterministic for a deterministic
    `clock` (seconds; it only drives the NEGOTIATOR_MAX_TIME_PER_* limits). None is a clock
    that never advances, so no time limit is reached. Run with the folds' collector settings
    (`long_fold`): a cycle allocates hundreds of thousands of objects and almost no reference
    cycle (about 300 at 20,000 slots), and the default collector's passes over them and over
    the input's ads took about a tenth of its time."""
    with long_fold():
        return _Cycle(snapshot, cfg or NegotiatorConfig(), clock).run()


def to_payloads(result: CycleResult, negotiator: str, positions: Mapping[str, Any] | None = None,
                duration: float = 0.0) -> tuple[list[Matched], NegotiationCycled]:
    """The cycle's events: one `match` per match and the `negotiation.cycle` summary."""
    matches = [Matched(negotiator=negotiator, cycle=result.cycle, job_id=m.job_id,
                       schedd=m.schedd, submitter=m.submitter, group=m.group, slot=m.slot,
                       reason=m.reason, preempts=m.preempts)  # type: ignore[arg-type]
               for m in result.matches]
    rejections: dict[str, Any] = {}
    for r in result.rejections:
        rejections[f"{r.submitter}#{r.autocluster}"] = {
            "reasons": dict(r.reasons), "example_job": r.example_job}
    if result.time_limits:
        rejections["_time_limits"] = dict(result.time_limits)
    cycled = NegotiationCycled(
        negotiator=negotiator, cycle=result.cycle, now=result.now,
        positions=dict(positions or {}),
        submitters={n: {"matches": s.matches, "weight": s.weight, "rejections": s.rejections,
                        "limit": s.limit, "usage": s.usage_end}
                    for n, s in result.submitters.items()},
        duration=duration, matches=len(result.matches), rejections=rejections)
    return matches, cycled
