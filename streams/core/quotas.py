"""Hierarchical group quotas (HGQ), as the negotiator computes them each cycle.

Why a fold: quotas depend on pool size (ads), demand (jobs) and knobs (config.changed); all
three are on the log, so the quotas at any moment are a fold of it and a replay explains
every `quota.computed`.

The computation, in HTCondor's order:

1. Assignment, top-down from `<none>` (quota = pool size). Static children
   (GROUP_QUOTA_<g>) share the parent's quota first; if they ask for more than it they are
   scaled down in proportion, unless NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION is True (the
   seed's default is scaling; DESIGN.md's discrepancy note). Dynamic children
   (GROUP_QUOTA_DYNAMIC_<g>, fractions) share what is left, scaled down only if the fractions
   sum past 1. A group keeps for its own submitters what its children did not take (all of
   it when oversubscription is allowed; the root always keeps only the remainder).
2. Fair share, bottom-up: each group is allocated min(demand, quota); unused quota is
   surplus that rolls up. At each internal group the surplus goes to the children that
   accept it (GROUP_ACCEPT_SURPLUS[_g]) and to the group itself as a peer: everyone asking
   gets it in one go if there is enough, otherwise a water-fill in proportion to subtree
   quota, then equal shares among groups with zero quota. What nobody takes goes up.
   A group that does not accept surplus caps its whole subtree at its quota.

`quota` is what HTCondor publishes as a group's EffectiveQuota (`group->quota`: the static or
dynamic quota after the parent's assignment and scaling); `effective_quota` here is the
allocation (own quota in use plus surplus; HTCondor's `allocated`, GroupResourcesAllocated in
GROUP_SORT_EXPR) — what the negotiator negotiates the group with. Group order follows
GROUP_SORT_EXPR, evaluated with classad2 over a group ad; `<none>` goes last, and with
autoregroup it negotiates again with the whole pool.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from schemas.classads import ClassAd, Value, evaluate
from schemas.config import Knobs, SettingsLike, knob_bool, knob_float, knob_raw, knob_str
from schemas.errors import ClassAdError
from schemas.events import ConfigChanged, Envelope, NegotiationCycled, Payload, QuotaComputed
from streams.core import collector
from streams.core import jobs as jobs_mod
from streams.core.collector import PoolConfig, PoolState
from streams.core.groups import ROOT, GroupTree
from streams.core.jobs import JobsConfig, JobsState
from streams.core.overrides import Effective

__all__ = [
    "DEFAULT_GROUP_SORT_EXPR", "QuotaConfig", "GroupQuota", "GroupTurn", "QuotaState",
    "compute_quotas", "group_order", "sort_key", "apply",
]

DEFAULT_GROUP_SORT_EXPR = ('ifThenElse(AccountingGroup=?="<none>",3.4e+38,'
                           'ifThenElse(GroupQuota>0,GroupResourcesInUse/GroupQuota,3.3e+38))')
#: When quotas are recomputed and announced: `cycle` (default) only at `negotiation.cycle`
#: events, as HTCondor's negotiator computes them once per cycle (the state then shows the
#: quotas of the last cycle, and `quota.computed` names that cycle as its cause; a negotiator
#: computes its own cycle's quotas with `compute_quotas`); `event` after every event that moves
#: an input (pool size, demand, a knob).
ANNOUNCE_KNOB = "POOLLEDGER_QUOTA_UPDATES"
#: Sort key of a group whose GROUP_SORT_EXPR is not a number (it negotiates last).
UNSORTABLE: Final = 1.7976931348623157e308
_EPS: Final = 1e-9
#: A change below this is float noise, not a new quota.
_TOLERANCE: Final = 1e-9


# --- config ------------------------------------------------------------------------------

def _tree(settings: SettingsLike | None) -> GroupTree:
    raw = knob_raw(settings, "GROUP_NAMES")
    if isinstance(raw, (list, tuple)):
        return GroupTree.from_names([str(x) for x in raw])
    return GroupTree.from_names(None if raw is None else str(raw))


def _announce(value: str | None) -> str:
    text = (value or "").strip().lower()
    return text if text in ("event", "cycle") else "cycle"


@dataclass(frozen=True)
class QuotaConfig:
    """GROUP_* knobs, plus the pool and job knobs the nested folds need.

    Per-group values are tuples of (group, value) in tree order so the config stays frozen
    and comparable; build it with `from_settings`.
    """

    group_names: tuple[str, ...] = ()
    static_quota: tuple[tuple[str, float], ...] = ()
    dynamic_quota: tuple[tuple[str, float], ...] = ()
    accept_surplus: tuple[tuple[str, bool], ...] = ()
    autoregroup: tuple[tuple[str, bool], ...] = ()
    allow_oversubscription: bool = False
    sort_expr: str = DEFAULT_GROUP_SORT_EXPR
    use_weighted_demand: bool = True
    announce: str = "cycle"
    pool: PoolConfig = field(default_factory=PoolConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    source: SettingsLike | None = field(default=None, compare=False, repr=False)
    #: the group tree and compiled fair-share plans per tree, built on first use (the config
    #: is immutable; a plain field, as mypyc's classes have no `functools.cached_property`)
    _memo: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)
    _plans: dict[int, tuple[GroupTree, _Plan]] = field(default_factory=dict, init=False,
                                                       compare=False, repr=False)

    @classmethod
    def from_settings(cls, settings: SettingsLike | None) -> QuotaConfig:
        tree = _tree(settings)
        static: list[tuple[str, float]] = []
        dynamic: list[tuple[str, float]] = []
        surplus: list[tuple[str, bool]] = []
        regroup: list[tuple[str, bool]] = []
        default_surplus = knob_bool(settings, "GROUP_ACCEPT_SURPLUS", False)
        default_regroup = knob_bool(settings, "GROUP_AUTOREGROUP", False)
        for g in tree.names:
            q = knob_float(settings, f"GROUP_QUOTA_{g}", None)
            if q is not None:
                static.append((g, max(0.0, q)))
            else:
                d = knob_float(settings, f"GROUP_QUOTA_DYNAMIC_{g}", None)
                if d is not None:
                    dynamic.append((g, min(1.0, max(0.0, d))))
            surplus.append((g, knob_bool(settings, f"GROUP_ACCEPT_SURPLUS_{g}", default_surplus)))
            regroup.append((g, knob_bool(settings, f"GROUP_AUTOREGROUP_{g}", default_regroup)))
        return cls(
            group_names=tree.names, static_quota=tuple(static), dynamic_quota=tuple(dynamic),
            accept_surplus=tuple(surplus), autoregroup=tuple(regroup),
            allow_oversubscription=knob_bool(settings, "NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION", False),
            sort_expr=knob_str(settings, "GROUP_SORT_EXPR", DEFAULT_GROUP_SORT_EXPR)
            or DEFAULT_GROUP_SORT_EXPR,
            use_weighted_demand=knob_bool(settings, "NEGOTIATOR_USE_WEIGHTED_DEMAND", True),
            announce=_announce(knob_str(settings, ANNOUNCE_KNOB, "cycle")),
            pool=PoolConfig.from_settings(settings), jobs=JobsConfig.from_settings(settings),
            source=settings,
        )

    def with_overrides(self, overrides: Mapping[str, str]) -> QuotaConfig:
        """This config with `config.changed` overrides layered over its settings."""
        if not overrides:
            return self
        return QuotaConfig.from_settings(Knobs(overrides, self.source))

    @property
    def tree(self) -> GroupTree:
        found: GroupTree | None = self._memo.get("tree")
        if found is None:
            found = self._memo["tree"] = GroupTree.from_names(self.group_names)
        return found

    def plan(self, tree: GroupTree) -> _Plan:
        found = self._plans.get(id(tree))
        if found is None or found[0] is not tree:
            found = self._plans[id(tree)] = (tree, _Plan(tree, self))
            if len(self._plans) > 8:
                del self._plans[next(iter(self._plans))]
        return found[1]

    def accepts_surplus(self, group: str) -> bool:
        """`<none>` always accepts surplus; others per GROUP_ACCEPT_SURPLUS[_g]."""
        return group == ROOT or self._flags("surplus", self.accept_surplus).get(group, False)

    def autoregroups(self, group: str) -> bool:
        return self._flags("regroup", self.autoregroup).get(group, False)

    def _flags(self, key: str, pairs: tuple[tuple[str, bool], ...]) -> dict[str, bool]:
        """`pairs` as a dict, made once (a lookup per group must not copy all groups)."""
        found: dict[str, bool] | None = self._memo.get(key)
        if found is None:
            found = self._memo[key] = dict(pairs)
        return found


# --- results -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class GroupQuota:
    """One group's quotas, in the terms condor_userprio -quotas uses.

    config_quota: the configured value (a fraction for dynamic groups; 0 for the root, which
        no knob configures: HTCondor never sets its `config_quota`).
    quota: the share assigned by HGQ for the group's own submitters, before surplus: what
        HTCondor publishes as EffectiveQuota.
    effective_quota: what the group is allocated (own quota in use + surplus; HTCondor's
        `allocated`, not its EffectiveQuota).
    subtree_quota: the quota of the group and its children together.
    requested: the group's own demand (weighted running + idle).
    surplus_policy: "regroup", "byquota" (accepts surplus) or "no".
    """

    config_quota: float
    quota: float
    effective_quota: float
    subtree_quota: float
    requested: float
    surplus_policy: str
    static: bool = True


@dataclass(frozen=True, slots=True)
class GroupTurn:
    """One step of the negotiator's group loop: negotiate `group` up to `limit`.

    `autoregroup` marks the final `<none>` turn in which every autoregroup group's
    submitters negotiate again, against the whole pool.
    """

    group: str
    limit: float
    sort_key: float
    autoregroup: bool = False


@dataclass(slots=True)
class _Node:
    name: str
    quota: float = 0.0
    subtree_quota: float = 0.0
    requested: float = 0.0
    allocated: float = 0.0
    subtree_requested: float = 0.0
    accept: bool = False
    children: list[_Node] = field(default_factory=list)


# --- assignment ------------------------------------------------------------------------------

def _assign(node: _Node, quota: float, cfg: QuotaConfig, is_root: bool) -> None:
    """Top-down: split `quota` among the children, keep the rest (see module docstring)."""
    node.subtree_quota = quota
    static = dict(cfg.static_quota)
    dynamic = dict(cfg.dynamic_quota)
    s_sum = sum((static.get(c.name, 0.0) for c in node.children if c.name not in dynamic), 0.0)
    d_sum = sum((dynamic[c.name] for c in node.children if c.name in dynamic), 0.0)
    static_pool = s_sum if cfg.allow_oversubscription else min(s_sum, quota)
    dynamic_pool = max(0.0, quota - static_pool)
    given = 0.0
    for child in node.children:
        if child.name in dynamic:
            q = dynamic[child.name] * (dynamic_pool / max(d_sum, 1.0))
        else:
            c = static.get(child.name, 0.0)
            q = c * (static_pool / s_sum) if s_sum > 0 else 0.0
        given += q
        _assign(child, q, cfg, False)
    own = quota if (cfg.allow_oversubscription and not is_root) else quota - given
    node.quota = max(0.0, own)


# --- fair share ----------------------------------------------------------------------------

def _fill(surplus: float, wants: list[float], weights: list[float], alloc: list[float]) -> float:
    """Water-fill `surplus` in proportion to `weights` among those still wanting; returns rest.

    Each pass gives everyone its proportional piece, capped at what it wants; pieces the
    capped ones could not take are spread again, until nothing is wanted or left.
    """
    while surplus > _EPS:
        active = [j for j, w in enumerate(wants) if w > _EPS and weights[j] > 0]
        z = sum([weights[j] for j in active], 0.0)  # (sum over a list: same additions, faster)
        if z <= 0:
            break
        given = 0.0
        capped = False
        for j in active:
            a = surplus * weights[j] / z
            if a >= wants[j]:
                a, capped = wants[j], True
            alloc[j] += a
            wants[j] -= a
            given += a
        surplus -= given
        if not capped:
            return 0.0
    return max(0.0, surplus)


def _allocate_surplus(node: _Node, surplus: float) -> float:
    """Share `surplus` among the accepting children and the node itself; return the rest."""
    if surplus <= 0:
        return 0.0
    if node.subtree_requested <= _EPS:
        return surplus
    children = node.children
    wants = [c.subtree_requested if c.accept and c.subtree_requested > _EPS else 0.0
             for c in children]
    wants.append(max(0.0, node.requested))
    total = sum(wants, 0.0)
    if surplus >= total:
        alloc = list(wants)
        surplus -= total
    else:
        peers = len(wants)
        alloc = [0.0] * peers
        by_quota = [c.subtree_quota for c in children]
        by_quota.append(node.quota)
        surplus = _fill(surplus, wants, by_quota, alloc)
        surplus = _fill(surplus, wants, [1.0] * peers, alloc)
    for child, a in zip(children, alloc):
        if a > 0:
            _allocate_surplus(child, a)
    node.allocated += alloc[-1]
    node.requested -= alloc[-1]
    node.subtree_requested = max(0.0, total - sum(alloc, 0.0))
    return surplus


def _fairshare(node: _Node) -> float:
    """Bottom-up: allocate min(demand, quota), then pass the surplus around; return leftovers."""
    node.allocated = min(node.requested, node.quota)
    node.requested -= node.allocated
    node.subtree_requested = node.requested
    surplus = node.quota - node.allocated
    if not node.children:
        return surplus
    for child in node.children:
        surplus += _fairshare(child)
        if child.accept:
            node.subtree_requested += child.subtree_requested
    return _allocate_surplus(node, surplus)


def _build(tree: GroupTree, name: str, cfg: QuotaConfig, demand: Mapping[str, float]) -> _Node:
    node = _Node(name=name, requested=max(0.0, float(demand.get(name, 0.0))),
                 accept=cfg.accepts_surplus(name))
    node.children = [_build(tree, c, cfg, demand) for c in tree.children(name)]
    return node


def _walk(node: _Node) -> list[_Node]:
    out = [node]
    for c in node.children:
        out.extend(_walk(c))
    return out


def _policy(group: str, cfg: QuotaConfig) -> str:
    if cfg.autoregroups(group):
        return "regroup"
    return "byquota" if cfg.accepts_surplus(group) else "no"


def _canonical_demand(tree: GroupTree, demand: Mapping[str, float]) -> dict[str, float]:
    """Demand keyed by the tree's casing; unknown groups' demand counts for `<none>`."""
    out: dict[str, float] = {}
    for g, v in demand.items():
        c = tree.canonical(g) or ROOT
        out[c] = out.get(c, 0.0) + float(v)
    return out


#: One group's result: (config_quota, quota, effective_quota, subtree_quota, requested,
#: surplus_policy, static) — GroupQuota's fields in order.
_Row = tuple[float, float, float, float, float, str, bool]


class _Plan:
    """The node tree of one (tree, config), built once and reused for every computation.

    Assignment depends only on the pool size, so its result is remembered per size; the
    fair share runs the same `_fairshare` on the reused nodes after resetting their inputs,
    so every float is computed by the same operations in the same order as a fresh build.
    """

    __slots__ = ("root", "nodes", "meta", "assigned", "cfg", "names")

    def __init__(self, tree: GroupTree, cfg: QuotaConfig) -> None:
        self.cfg = cfg
        self.root = _build(tree, ROOT, cfg, {})
        self.nodes = _walk(self.root)
        static = dict(cfg.static_quota)
        dynamic = dict(cfg.dynamic_quota)
        self.meta: list[tuple[str, float | None, bool, str]] = []
        for n in self.nodes:
            if n.name == ROOT:
                config_quota, is_static = None, True
            elif n.name in dynamic:
                config_quota, is_static = dynamic[n.name], False
            else:
                config_quota, is_static = static.get(n.name, 0.0), True
            self.meta.append((n.name, config_quota, is_static, _policy(n.name, cfg)))
        self.assigned: dict[float, list[tuple[float, float]]] = {}
        self.names = frozenset(n.name for n in self.nodes)

    def run(self, pool_size: float, demand: Mapping[str, float]) -> None:
        """Assignment (remembered per size) and fair share into the nodes."""
        size = max(0.0, float(pool_size))
        assigned = self.assigned.get(size)
        if assigned is None:
            _assign(self.root, size, self.cfg, True)
            assigned = [(n.quota, n.subtree_quota) for n in self.nodes]
            if len(self.assigned) >= 4096:
                self.assigned.clear()
            self.assigned[size] = assigned
        for n, (quota, subtree_quota) in zip(self.nodes, assigned):
            n.quota, n.subtree_quota = quota, subtree_quota
            n.requested = max(0.0, float(demand.get(n.name, 0.0)))
            n.allocated = n.subtree_requested = 0.0
        _fairshare(self.root)

    def rows(self, pool_size: float, demand: Mapping[str, float]) -> list[tuple[str, _Row]]:
        self.run(pool_size, demand)
        out = []
        for n, (name, config_quota, is_static, policy) in zip(self.nodes, self.meta):
            out.append((name, (0.0 if config_quota is None else config_quota,
                               n.quota, n.allocated, n.subtree_quota,
                               float(demand.get(name, 0.0)), policy, is_static)))
        return out


def _rows(tree: GroupTree, pool_size: float, demand: Mapping[str, float],
          cfg: QuotaConfig) -> list[tuple[str, _Row]]:
    return cfg.plan(tree).rows(pool_size, _canonical_demand(tree, demand))


def compute_quotas(tree: GroupTree, pool_size: float, demand: Mapping[str, float],
                   usage: Mapping[str, float] | None, cfg: QuotaConfig) -> dict[str, GroupQuota]:
    """Every group's quotas for a pool of `pool_size` weighted slots and per-group demand.

    `usage` (weighted resources in use per group) does not change quotas; it is accepted so
    callers can pass one bundle of inputs to this and to `group_order`.
    """
    del usage
    return {name: GroupQuota(*row) for name, row in _rows(tree, pool_size, demand, cfg)}


# --- group order -----------------------------------------------------------------------------

def sort_key(group: str, q: GroupQuota, in_use: float, cfg: QuotaConfig, now: float) -> float:
    """GROUP_SORT_EXPR evaluated (classad2) over the group's ad at the cycle's `now`;
    non-numbers sort last."""
    ad = ClassAd()
    ad["AccountingGroup"] = group
    ad["GroupQuota"] = float(q.quota)
    ad["GroupResourcesInUse"] = float(in_use)
    ad["GroupResourcesAllocated"] = float(q.effective_quota)
    ad["GroupConfigQuota"] = float(q.config_quota)
    ad["GroupSubtreeQuota"] = float(q.subtree_quota)
    ad["GroupRequested"] = float(q.requested)
    try:
        value: Any = evaluate(cfg.sort_expr, ad, now=now)
    except ClassAdError:
        return UNSORTABLE
    if isinstance(value, Value) or isinstance(value, bool) or not isinstance(value, (int, float)):
        return UNSORTABLE
    return float(value)


def group_order(quotas: Mapping[str, GroupQuota], usage: Mapping[str, float], cfg: QuotaConfig,
                pool_size: float, now: float) -> list[GroupTurn]:
    """The negotiator's group loop: ascending sort key (ties by name), each up to its
    effective quota. With any autoregroup group, `<none>` is taken out of the sort and goes
    last with the whole pool as its limit."""
    regroup = any(v for _, v in cfg.autoregroup)
    turns = []
    for g, q in quotas.items():
        if regroup and g == ROOT:
            continue
        turns.append(GroupTurn(g, q.effective_quota, sort_key(g, q, usage.get(g, 0.0), cfg, now)))
    turns.sort(key=lambda t: (t.sort_key, t.group.lower()))
    if regroup and ROOT in quotas:
        q = quotas[ROOT]
        turns.append(GroupTurn(ROOT, float(pool_size), sort_key(ROOT, q, usage.get(ROOT, 0.0), cfg, now),
                               autoregroup=True))
    return turns


# --- the fold ------------------------------------------------------------------------------

class QuotaState:
    """Nested collector and demand folds (unused when the caller passes its own), the
    overrides, the inputs last computed from, the quotas and what was last announced.

    `quotas` is materialized when read: `apply` decides what to announce from the fair share
    it runs on every input change, and keeps only the inputs of the latest one; reading
    `quotas` (or `to_json`, `current`, ==) computes the rows from them, which gives the same
    values an eager rebuild after every change would have stored.
    """

    __slots__ = ("pool", "jobs", "overrides", "_quotas", "emitted", "inputs", "_cfg",
                 "_pending", "_seen", "_computed")

    def __init__(self, pool: PoolState | None = None, jobs: JobsState | None = None,
                 overrides: dict[str, str] | None = None,
                 quotas: dict[str, dict[str, Any]] | None = None,
                 emitted: dict[str, list[float]] | None = None,
                 inputs: dict[str, Any] | None = None) -> None:
        self.pool = pool if pool is not None else PoolState()
        self.jobs = jobs if jobs is not None else JobsState()
        self.overrides = overrides if overrides is not None else {}
        self._quotas = quotas if quotas is not None else {}
        self.emitted = emitted if emitted is not None else {}
        self.inputs = inputs if inputs is not None else {}
        self._cfg: Effective[QuotaConfig] = Effective()
        # (plan, pool size, canonical demand) the quotas are still to be computed from
        self._pending: tuple[_Plan, float, dict[str, float]] | None = None
        # (jobs state, its revision, pool size, effective config) `inputs` was last checked at
        self._seen: tuple[Any, ...] | None = None
        # the effective config of the last computation (cycle mode notices knob changes by it)
        self._computed: QuotaConfig | None = None

    @property
    def quotas(self) -> dict[str, dict[str, Any]]:
        if self._pending is not None:
            plan, size, demand = self._pending
            self._quotas = {g: _asdict(q) for g, q in plan.rows(size, demand)}
            self._pending = None
        return self._quotas

    @quotas.setter
    def quotas(self, value: dict[str, dict[str, Any]]) -> None:
        self._pending = None
        self._quotas = value

    def _key(self) -> tuple[Any, ...]:
        return (self.pool, self.jobs, self.overrides, self.quotas, self.emitted, self.inputs)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"QuotaState(pool={self.pool!r}, jobs={self.jobs!r}, overrides={self.overrides!r}, "
                f"quotas={self.quotas!r}, emitted={self.emitted!r}, inputs={self.inputs!r})")

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) — runners compare it for equality."""
        obj = {"pool": orjson.loads(self.pool.to_json()), "jobs": orjson.loads(self.jobs.to_json()),
               "overrides": self.overrides, "quotas": self.quotas, "emitted": self.emitted,
               "inputs": self.inputs}
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_json(cls, text: str | bytes) -> QuotaState:
        obj = orjson.loads(text)
        return cls(pool=PoolState.from_json(orjson.dumps(obj["pool"])),
                   jobs=JobsState.from_json(orjson.dumps(obj["jobs"])),
                   overrides=dict(obj["overrides"]), quotas=obj["quotas"],
                   emitted=obj["emitted"], inputs=obj["inputs"])

    def effective(self, cfg: QuotaConfig) -> QuotaConfig:
        """`cfg` with this log's `config.changed` overrides (cached)."""
        return self._cfg.get(cfg, self.overrides)

    def current(self) -> dict[str, GroupQuota]:
        """The last computed quotas."""
        return {g: GroupQuota(**v) for g, v in sorted(self.quotas.items())}


#: What a `quota.computed` announces, in `emitted`'s order: config, quota (HTCondor's
#: EffectiveQuota), subtree quota, allocation.
_EMITTED = ("config_quota", "quota", "subtree_quota", "effective_quota")


def _announced(q: _Row) -> list[float]:
    return [float(q[0]), float(q[1]), float(q[3]), float(q[2])]


def _differs(old: list[float] | None, new: list[float]) -> bool:
    """Whether `new` moved away from what was last announced (beyond float noise); a record
    of another shape (a snapshot of an older version) always differs."""
    if old is None or len(old) != len(new):
        return True
    return any(abs(a - b) > _TOLERANCE for a, b in zip(old, new))


def apply(state: QuotaState, env: Envelope, cfg: QuotaConfig, *,
          pool_state: PoolState | None = None, jobs_state: JobsState | None = None,
          accountant_state: Any = None) -> list[Payload]:
    """Fold one event; emit `quota.computed` for each group whose quotas changed.

    Inputs come from the nested collector and demand folds, or — when a caller already
    folds those (a ledger holding all sections) — from `pool_state` / `jobs_state`, which
    must already include `env`. Quotas are recomputed only when pool size, per-group demand
    or a knob moved. `accountant_state` is accepted for such callers; usage does not change
    quotas (it only orders groups, see `group_order`). A group dropped from GROUP_NAMES
    just disappears from the state.

    When (ANNOUNCE_KNOB): `event` mode decides at every event whether an announced value
    moved, so `quota.computed` follows the event that moved it (the stored `quotas` dicts are
    materialized on read, see QuotaState); `cycle` mode does all of this only at
    `negotiation.cycle` events (and treats a knob changed since the previous cycle as a
    change), so both the state and the derived events are functions of the log alone in
    either mode, whatever batches or snapshots a runner uses.
    """
    del accountant_state
    eff = state.effective(cfg)
    if pool_state is None:
        collector.step(state.pool, env, eff.pool)
    if jobs_state is None:
        jobs_mod.step(state.jobs, env, eff.jobs)
    knob_changed = isinstance(env.data, ConfigChanged)
    if isinstance(env.data, ConfigChanged):
        state.overrides[env.data.knob.upper()] = env.data.value
        eff = state.effective(cfg)
    if eff.announce == "cycle":
        if not isinstance(env.data, NegotiationCycled):
            return []
        knob_changed = state._computed is not eff  # a knob moved since the last cycle
    state._computed = eff
    size = collector.pool_size(pool_state if pool_state is not None else state.pool)
    js = jobs_state if jobs_state is not None else state.jobs
    seen_last = state._seen
    if not knob_changed and state.inputs and seen_last is not None and seen_last[0] is js \
            and seen_last[1] == js._rev and seen_last[2] == size and seen_last[3] is eff:
        return []  # same demand (no totals moved), same pool size, same config: inputs equal
    seen = (js, js._rev, size, eff)
    demand = jobs_mod.group_demand(js, eff.tree, eff.jobs, weighted=eff.use_weighted_demand)
    state._seen = seen
    if not knob_changed and state.inputs and size == state.inputs.get("pool_size") \
            and demand == state.inputs.get("demand"):
        return []
    state.inputs = {"pool_size": size, "demand": demand}
    tree = eff.tree
    canon = _canonical_demand(tree, demand)
    plan = eff.plan(tree)
    if knob_changed or state.emitted.keys() != plan.names:
        # The original loop: announce what moved and rebuild `emitted` for these groups.
        rows = plan.rows(size, canon)
        out: list[Payload] = []
        emitted: dict[str, list[float]] = {}
        for g, q in rows:
            last = state.emitted.get(g)
            now_ = _announced(q)
            if _differs(last, now_):
                out.append(QuotaComputed(g, q[0], q[1], q[3], env.id, q[2]))
                last = now_
            assert last is not None
            emitted[g] = last
        state.emitted = emitted
        state.quotas = {g: _asdict(q) for g, q in rows}
        return out
    # Same groups as announced: run the fair share, announce what moved beyond float noise
    # (in tree order, as above) and leave the quotas to be materialized when read.
    plan.run(size, canon)
    out = []
    emitted = state.emitted
    for n, (g, config_quota, _, _) in zip(plan.nodes, plan.meta):
        c0 = 0.0 if config_quota is None else config_quota
        last = emitted[g]
        if len(last) != 4 or abs(last[0] - c0) > _TOLERANCE or abs(last[1] - n.quota) > _TOLERANCE \
                or abs(last[2] - n.subtree_quota) > _TOLERANCE \
                or abs(last[3] - n.allocated) > _TOLERANCE:
            out.append(QuotaComputed(g, c0, n.quota, n.subtree_quota, env.id, n.allocated))
            emitted[g] = [float(c0), float(n.quota), float(n.subtree_quota), float(n.allocated)]
    state._pending = (plan, size, canon)
    return out


def _asdict(q: _Row) -> dict[str, Any]:
    return {"config_quota": q[0], "quota": q[1], "effective_quota": q[2],
            "subtree_quota": q[3], "requested": q[4], "surplus_policy": q[5], "static": q[6]}
