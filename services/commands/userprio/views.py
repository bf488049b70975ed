"""condor_userprio's tables, `-long` ads and a JSON form, rendered from accountant records.

Operators check a pool by reading (and diffing) condor_userprio output, so the tables follow
HTCondor's tool (`src/condor_tools/user_prio.cpp`, 25.x) column for column: centred two-row
headings, `%W.Df` numbers that fall back to `%.{W-6}g` when too wide, `<now>` or `%3d+%02d:%02d`
since last usage, the 24 h activity filter, the group-ordered ("hierarchical") layout and the
footer with totals. Its quirks are kept on purpose (the name column is sized with the count of
*all* records; the footer's delta is measured from the last priority update, not from now).

Pure: the caller passes `now` and the last update time; nothing here reads a clock or does I/O.

Input rows are `streams.core.accountant.view()` records, whose `Priority` is the *real*
priority and `EffectivePriority` the EUP (HTCondor's own ads call the EUP `Priority`); the
tables use the EUP where condor_userprio shows "Effective Priority".
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from functools import cmp_to_key
from typing import Any, Final

__all__ = ["VIEWS", "format_userprio", "userprio_json"]

ROOT: Final = "<none>"
DAY: Final = 86400
_FLT_MAX: Final = 3.4028234663852886e38
_MAX_NAME: Final = 99

# Column/detail bits; a view is a set of them (HTCondor's Detail* flags, same meaning).
_PRIORITY: Final = 0x2
_FACTOR: Final = 0x4
_GROUP: Final = 0x8
_RES_USED: Final = 0x10
_WT_RES_USED: Final = 0x20
_USE_TIME1: Final = 0x40
_USE_TIME2: Final = 0x80
_EFF_QUOTA: Final = 0x100
_CFG_QUOTA: Final = 0x200
_SURPLUS: Final = 0x400
_TREE_QUOTA: Final = 0x800
_REAL_PRIO: Final = 0x1000
_SORT_KEY: Final = 0x2000
_USE_DELTA_T: Final = 0x4000
_REQUESTED: Final = 0x10000
_CEILING: Final = 0x20000
_FLOOR: Final = 0x40000
_PRIOS: Final = _PRIORITY | _FACTOR | _REAL_PRIO
_USAGE: Final = _RES_USED | _WT_RES_USED
_QUOTAS: Final = _EFF_QUOTA | _CFG_QUOTA | _TREE_QUOTA | _SURPLUS | _REQUESTED
_MOST: Final = (_CFG_QUOTA | _SURPLUS | _PRIORITY | _FACTOR | _USAGE | _USE_DELTA_T | _REQUESTED
                | _CEILING | _FLOOR)
_ALL: Final = _MOST | _QUOTAS | _PRIOS | _USE_TIME1 | _USE_TIME2

#: The table views and the columns each asks for (before columns without data are dropped).
VIEWS: Final[Mapping[str, int]] = {
    "default": _MOST, "most": _MOST, "allusers": _MOST, "all": _ALL, "quotas": _QUOTAS,
    "usage": _USAGE | _USE_TIME1 | _USE_TIME2, "priority": _PRIOS,
}

# (bit, width, heading row 1, heading row 2), in display order.
_COLUMNS: Final[tuple[tuple[int, int, str, str], ...]] = (
    (_EFF_QUOTA, 9, "Effective", "Quota"),
    (_CFG_QUOTA, 9, "Config", "Quota"),
    (_SURPLUS, 7, "Use", "Surplus"),
    (_TREE_QUOTA, 9, "Subtree", "Quota"),
    (_PRIORITY, 12, "Effective", "Priority"),
    (_REAL_PRIO, 8, "Real", "Priority"),
    (_FACTOR, 9, "Priority", "Factor"),
    (_RES_USED, 6, "Wghted", "In Use"),
    (_WT_RES_USED, 12, "Total Usage", "(wghted-hrs)"),
    (_USE_TIME1, 16, "Usage", "Start Time"),
    (_USE_TIME2, 16, "Last", "Usage Time"),
    (_USE_DELTA_T, 10, "Time Since", "Last Usage"),
    (_REQUESTED, 10, "Weighted", "Requested"),
    (_FLOOR, 9, "Submitter", "Floor"),
    (_CEILING, 9, "Submitter", "Ceiling"),
)

# Surplus policies as the Use Surplus column names them (None: the record gave none).
_POLICY_NAMES: Final = {"regroup": "Regroup", "byquota": "ByQuota", "no": "no"}

# Attributes HTCondor's accounting ads carry as integers (for -long).
_INT_ATTRS: Final = frozenset({"ResourcesUsed", "BeginUsageTime", "LastUsageTime", "LastUpdateTime",
                               "Ceiling", "Floor"})
# ... and as reals, even when handed a Python int.
_REAL_ATTRS: Final = frozenset({"Priority", "PriorityFactor", "EffectivePriority",
                                "WeightedResourcesUsed", "HierWeightedResourcesUsed",
                                "AccumulatedUsage", "WeightedAccumulatedUsage", "ConfigQuota",
                                "EffectiveQuota", "SubtreeQuota", "Requested", "GroupSortKey"})
_QUOTA_ATTRS: Final = ("ConfigQuota", "EffectiveQuota", "SubtreeQuota", "SurplusPolicy", "Requested")
#: the `--json` name of a group's allocation (HTCondor's GROUP_SORT_EXPR attribute for it)
ALLOCATED: Final = "GroupResourcesAllocated"
_JSON_ATTRS: Final = ("Name", "Priority", "PriorityFactor", "EffectivePriority", "ResourcesUsed",
                      "WeightedResourcesUsed", "AccumulatedUsage", "WeightedAccumulatedUsage",
                      "BeginUsageTime", "LastUsageTime", "Floor", "Ceiling", "AccountingGroup",
                      "IsAccountingGroup")


# --- fixed-width cells ---------------------------------------------------------------------

def _left(text: str, width: int) -> str:
    """Left-aligned in exactly `width` characters, cut when longer (as the tool's buffers are)."""
    return text[:width].ljust(width)


def _right(text: str, width: int) -> str:
    return text.rjust(width) if len(text) < width else text[:width]


def _center(text: str, width: int) -> str:
    """Centred with the odd space on the right; a too-long heading is cut, not centred."""
    return _left(" " * max(0, (width - len(text)) // 2) + text, width)


def _number(value: float, width: int, decimals: int) -> str:
    """`%W.Df`, or `%.{W-6}g` when that does not fit, right-aligned in `width`."""
    text = "%*.*f" % (width, decimals, value)
    if len(text) > width:
        text = "%.*g" % (max(width - 6, 0), value)
    return _right(text, width)


def format_date(t: float, tz: tzinfo = UTC) -> str:
    """HTCondor's short date, `%2d/%-2d %02d:%02d` (month/day hour:minute)."""
    if t < 0:
        return "    ???    "
    d = datetime.fromtimestamp(int(t), tz)
    return "%2d/%-2d %02d:%02d" % (d.month, d.day, d.hour, d.minute)


def format_date_year(t: float, tz: tzinfo = UTC) -> str:
    """HTCondor's dated form, `%2d/%02d/%-4d %02d:%02d`."""
    if t < 0:
        return "    ???    "
    d = datetime.fromtimestamp(int(t), tz)
    return "%2d/%02d/%-4d %02d:%02d" % (d.month, d.day, d.year, d.hour, d.minute)


def format_delta(seconds: int) -> str:
    """Days+hours:minutes, `%3d+%02d:%02d`; a negative span prints `[?????]`."""
    if seconds < 0:
        return "[?????]"
    days, rest = divmod(seconds, DAY)
    return "%3d+%02d:%02d" % (days, rest // 3600, rest % 3600 // 60)


# --- records -------------------------------------------------------------------------------

@dataclass(slots=True)
class _Line:
    """One record as the table sees it; `has` holds the column bits it has data for."""

    name: str
    eup: float
    factor: float
    wt_res: float
    acc_usage: float
    requested: float
    begin: int
    last: int
    group: str
    is_group: bool
    has: int
    eff_quota: float
    cfg_quota: float
    tree_quota: float
    ceiling: float
    floor: float
    sort_key: float
    surplus: str | None
    index: int
    group_id: int
    order: float = 0.0


@dataclass(slots=True)
class _Ctx:
    """What condor_userprio decides while reading the records (its globals)."""

    detail: int
    dash_quota: bool
    hier: bool = True
    hide_groups: bool = False
    hide_users: bool = False
    hide_none: bool = True
    users_have_quotas: bool = False
    avail: int = 0
    policy: str | None = None


def _eup(row: Mapping[str, Any]) -> float | None:
    if "EffectivePriority" in row:
        return float(row["EffectivePriority"])
    if "Priority" in row:
        return float(row["Priority"]) * float(row.get("PriorityFactor", 1.0))
    return None


def _group_attrs(groups: Mapping[str, Mapping[str, Any]] | None, name: str) -> Mapping[str, Any]:
    if not groups:
        return {}
    if name in groups:
        return groups[name]
    folded = {k.lower(): v for k, v in groups.items()}
    return folded.get(name.lower(), {})


def _collect(rows: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Mapping[str, Any]] | None,
             ctx: _Ctx) -> tuple[list[_Line], bool]:
    """Read every record; returns the lines and whether users still need their group's id."""
    lines: list[_Line] = []
    count = len(rows)
    need_fixup = False
    for index, (key, row) in enumerate(rows.items(), start=1):
        eup = _eup(row)
        if eup is None:
            continue
        name = str(row.get("Name", key))
        is_group = bool(row.get("IsAccountingGroup", False))
        m: dict[str, Any] = dict(row)
        if is_group:
            m.update(_group_attrs(groups, name))
        has = _PRIORITY
        factor = float(m.get("PriorityFactor", 0.0))
        if "PriorityFactor" in m:
            has |= _FACTOR | (_REAL_PRIO if factor > 0 else 0)
        for attr, bits in (("WeightedAccumulatedUsage", _USAGE), ("ResourcesUsed", _USAGE),
                           ("Ceiling", _CEILING), ("Floor", _FLOOR), ("Requested", _REQUESTED),
                           ("BeginUsageTime", _USE_TIME1),
                           ("LastUsageTime", _USE_TIME2 | _USE_DELTA_T),
                           ("EffectiveQuota", _EFF_QUOTA), ("ConfigQuota", _CFG_QUOTA)):
            if attr in m:
                has |= bits
        res = float(m.get("ResourcesUsed", 0))
        group = str(m.get("AccountingGroup", ROOT))
        surplus: str | None = None
        sort_key = 0.0
        if is_group:
            group_id = 0 if name in (ROOT, ".") else -index
            surplus = "no"
            if "SurplusPolicy" in m:
                has |= _SURPLUS
                policy = str(m["SurplusPolicy"]).lower()
                surplus = _POLICY_NAMES.get(policy, "n/a")
                if policy in ("regroup", "byquota"):
                    ctx.policy = surplus
            if "GroupSortKey" in m:
                has |= _SORT_KEY
                sort_key = float(m["GroupSortKey"])
            if "SubtreeQuota" in m:
                has |= _TREE_QUOTA
            has &= ~_PRIORITY  # a group's priority means nothing to the reader: leave it blank
        elif group in (ROOT, "."):
            group_id = 0
        else:
            group_id = -2 * count  # the group's id is known only once every group is read
            need_fixup = True
        if not is_group and has & (_EFF_QUOTA | _CFG_QUOTA):
            ctx.users_have_quotas = True
        if group_id:
            has |= _GROUP
        last = int(m.get("LastUsageTime", 0)) or -1
        ctx.avail |= has
        lines.append(_Line(
            name=name, eup=eup, factor=factor, wt_res=float(m.get("WeightedResourcesUsed", res)),
            acc_usage=float(m.get("WeightedAccumulatedUsage", -1.0)),
            requested=float(m.get("Requested", 0.0)), begin=int(m.get("BeginUsageTime", 0)),
            last=last, group=group, is_group=is_group, has=has,
            eff_quota=float(m.get("EffectiveQuota", 0.0)), cfg_quota=float(m.get("ConfigQuota", 0.0)),
            tree_quota=float(m.get("SubtreeQuota", 0.0)), ceiling=float(m.get("Ceiling", -1.0)),
            floor=float(m.get("Floor", -1.0)), sort_key=sort_key, surplus=surplus, index=index,
            group_id=group_id))
    return lines, need_fixup


# --- ordering ------------------------------------------------------------------------------

def _by_detail(a: _Line, b: _Line, detail: int) -> int:
    """Submitters: by EUP when it is shown, else by usage, else by name."""
    if detail & _PRIORITY:
        x, y = a.eup, b.eup
    elif detail & _USAGE:
        x, y = a.acc_usage, b.acc_usage
    else:
        return (a.name > b.name) - (a.name < b.name)
    return (x > y) - (x < y)


def _groups_first_by_name(a: _Line, b: _Line, detail: int) -> int:
    """Groups (by name, `<none>` last) before submitters (by `_by_detail`)."""
    if a.is_group != b.is_group:
        return -1 if a.is_group else 1
    if a.is_group:
        if not a.group_id or not b.group_id:
            return (not a.group_id) - (not b.group_id)
        return (a.name > b.name) - (a.name < b.name)
    return _by_detail(a, b, detail)


def _hierarchical(a: _Line, b: _Line, detail: int, by_order: bool, none_last: bool) -> int:
    """Each group followed by its submitters; groups by display order (or id)."""
    if a.group_id != b.group_id:
        if none_last and (not a.group_id or not b.group_id):
            return 1 if not a.group_id else -1
        if by_order and a.order != b.order:
            return -1 if a.order < b.order else 1
        return -1 if a.group_id < b.group_id else 1
    if a.is_group != b.is_group:
        return -1 if a.is_group else 1
    return _by_detail(a, b, detail)


def _sorted(lines: list[_Line], cmp: Callable[[_Line, _Line], int]) -> list[_Line]:
    """Sort with `cmp`, ties kept in record order so output never depends on sort stability."""

    def total(a: _Line, b: _Line) -> int:
        return cmp(a, b) or (a.index - b.index)

    return sorted(lines, key=cmp_to_key(total))


def _assign_group_ids(lines: list[_Line], ctx: _Ctx) -> list[_Line]:
    """Number the groups by name (`<none>` is 0), give each submitter its group's id and order."""
    lines = _sorted(lines, lambda a, b: _groups_first_by_name(a, b, ctx.detail))
    n_groups = ix_none = 0
    for i, ln in enumerate(lines):
        if not ln.is_group:
            break
        n_groups += 1
        if ln.group_id < 0:
            ln.group_id = n_groups
        else:
            ix_none = i
        if ctx.detail & _PRIORITY:
            if ctx.avail & _SORT_KEY:
                ln.order = ln.sort_key
            else:
                ln.order = ln.eup if ln.group_id else _FLT_MAX
        elif ctx.detail & _USAGE:
            ln.order = ln.acc_usage / 3600.0
        else:
            ln.order = float(ln.group_id) if ln.group_id else _FLT_MAX
    heads = lines[:n_groups]
    for ln in lines[n_groups:]:
        if ln.group_id >= 0:
            ln.order = lines[ix_none].order
            continue
        for g in heads:
            if ln.group == g.name:
                ln.group_id, ln.order = g.group_id, g.order
                break
    return lines


# --- the table -----------------------------------------------------------------------------

def _cell(ln: _Line, bit: int, width: int, t_last: int, tz: tzinfo) -> str:
    if not ln.has & bit:
        return _right("n/d", width) if ln.is_group and bit & _QUOTAS else " " * width
    if bit == _SURPLUS:
        return _left((ln.surplus or "") if ln.group_id else "yes", width)
    if bit in (_EFF_QUOTA, _CFG_QUOTA, _TREE_QUOTA):
        value = {_EFF_QUOTA: ln.eff_quota, _CFG_QUOTA: ln.cfg_quota, _TREE_QUOTA: ln.tree_quota}[bit]
        return _number(value, width, 2)
    if bit == _PRIORITY:
        return _number(ln.eup, width, 2)
    if bit == _REAL_PRIO:
        return _number(ln.eup / ln.factor if ln.factor > 0 else 0.0, width, 2)
    if bit == _FACTOR:
        return _number(ln.factor, width, 2) if ln.factor > 0 else " " * width
    if bit == _RES_USED:
        return _number(ln.wt_res, width, 0)
    if bit == _WT_RES_USED:
        return _number(ln.acc_usage / 3600.0, width, 2)
    if bit == _REQUESTED:
        return _number(ln.requested, width, 0)
    if bit in (_USE_TIME1, _USE_TIME2):
        t = ln.begin if bit == _USE_TIME1 else ln.last
        return _right(format_date_year(t, tz) if t > 0 else "", width)
    if bit == _USE_DELTA_T:
        return _since_cell(t_last, ln.last, width)
    if bit == _CEILING:
        return _number(ln.ceiling, width, 2) if ln.ceiling > -1.0 else " " * width
    if bit == _FLOOR:
        return _number(ln.floor, width, 2) if ln.floor > 0.0 else " " * width
    return " " * width


def _since_cell(t_last: int, last: int, width: int) -> str:
    """"Time Since Last Usage" at the table's time: `<now>` or `%3d+%02d:%02d`, never cut by
    the column. A submitter that never used the pool (LastUsageTime 0) is left blank, as
    condor_userprio leaves a record without LastUsageTime; measured from 0 it would print
    the days since 1970, which condor_userprio cuts to the column's width."""
    if last <= 0:
        return " " * width
    delta = t_last - last
    return (format_delta(delta) if delta > 0 else "<now>").rjust(width)


def _footer_cell(bit: int, width: int, ctx: _Ctx, wt_res: float, acc: float, t_last: int,
                 min_last: int, tz: tzinfo) -> str:
    if bit == _SURPLUS:
        return _left(ctx.policy or "", width)
    if bit == _RES_USED:
        return _number(wt_res, width, 0)
    if bit == _WT_RES_USED:
        return _number(acc / 3600.0, width, 2)
    if bit == _USE_TIME2:
        return _right(format_date_year(min_last, tz) if min_last > 0 else "", width)
    if bit == _USE_DELTA_T and min_last > 0:
        return _since_cell(t_last, min_last, width)
    return " " * width  # includes Usage Start Time: the earliest start is never below 0


def _shown(ln: _Line, ctx: _Ctx, min_last: int) -> bool:
    """Whether a record passes the activity filter: used since `min_last`; under -quotas
    every group is listed, also one nobody has used (its quotas are the point)."""
    return ln.last >= min_last or (ctx.dash_quota and ln.is_group)


def _render(lines: list[_Line], ctx: _Ctx, t_last: int, min_last: int, tz: tzinfo) -> str:
    cols = [(bit, w, h1, h2) for bit, w, h1, h2 in _COLUMNS if ctx.detail & bit]
    hier = ctx.hier
    width = 10
    for ln in lines:
        if _shown(ln, ctx, min_last):
            n = len(ln.name)
            if hier and not ln.is_group:
                n += 2 - (len(ln.group) if ln.group_id else 0)
            width = max(width, n)
    width = max(min(width, _MAX_NAME), len(f"Number of users: {len(lines)}"))
    if hier:
        width += 2

    def row(name: str, cells: list[str]) -> str:
        return _left(name, width) + "".join(" " + c for c in cells)

    out = [f"Last Priority Update: {format_date(t_last, tz)}"]
    title2 = ("Name" if hier else "Group Name") if ctx.hide_users else (
        "  User Name" if hier else "User Name")
    out.append(row("Group" if hier else "", [_center(h1, w) for _, w, h1, _ in cols]))
    out.append(row(title2, [_center(h2, w) for _, w, _, h2 in cols]))
    rule = row("-" * width, ["-" * w for _, w, _, _ in cols])
    out.append(rule)
    users = 0
    tot_res = tot_acc = 0.0
    for ln in lines:
        if not _shown(ln, ctx, min_last):
            continue
        if not ln.is_group:
            users += 1
            if ctx.hide_users:
                continue
        else:
            if ctx.hide_groups or (not hier and ctx.hide_none and not ln.group_id):
                continue
            ctx.hide_none = False  # once any group shows, <none> shows too
        if not hier or ln.is_group:
            label = ln.name
        else:
            short = ln.name[len(ln.group) + 1:] if ln.group_id > 0 else ln.name
            label = "  " + _left(short, width - 2)
        out.append(row(label, [_cell(ln, bit, w, t_last, tz) for bit, w, _, _ in cols]))
        if not ln.is_group:
            tot_res += ln.wt_res
            tot_acc += ln.acc_usage
    out.append(rule)
    out.append(row(f"Number of users: {users}",
                   [_footer_cell(bit, w, ctx, tot_res, tot_acc, t_last, min_last, tz)
                    for bit, w, _, _ in cols]))
    return "\n".join(out) + "\n"


def format_userprio(rows: Mapping[str, Mapping[str, Any]], *, now: float, last_update: float,
                    view: str = "default", groups: Mapping[str, Mapping[str, Any]] | None = None,
                    activefrom: float | None = None, tz: tzinfo = UTC) -> str:
    """condor_userprio's output for `view` ("default", "most", "all", "quotas", "usage",
    "priority", "allusers" or "long").

    `rows`: accountant `view()` records (submitters and groups); `groups`: per group the quota
    attributes (ConfigQuota, EffectiveQuota, SubtreeQuota, SurplusPolicy, Requested and,
    optionally, GroupSortKey). Only records used since `now` - 24 h are listed, or since
    `activefrom`; "allusers" and "long" list all. `last_update` is the accountant's last update,
    shown in the first line and the origin of "Time Since Last Usage". Empty when no records.
    """
    if view == "long":
        return _long(rows, groups)
    if view not in VIEWS:
        raise ValueError(f"unknown condor_userprio view {view!r}; one of {', '.join([*VIEWS, 'long'])}")
    detail = VIEWS[view]
    ctx = _Ctx(detail=detail, dash_quota=view == "quotas")
    if view == "allusers":
        min_last = -1
    elif activefrom is not None:
        min_last = int(activefrom)
    else:
        min_last = int(now) - DAY
    if not detail & ~_PRIOS:  # priorities only: groups have none worth showing
        ctx.hier = False
        ctx.hide_groups = True

    lines, need_fixup = _collect(rows, groups, ctx)
    if not lines:
        return ""
    avail = ctx.avail
    if not avail & _USAGE:
        ctx.detail &= ~_USAGE
    if not avail & _FACTOR:
        ctx.detail &= ~_FACTOR
    if not avail & _USE_TIME1:
        ctx.detail &= ~_USE_TIME1
    if not avail & _USE_TIME2:
        ctx.detail &= ~(_USE_TIME2 | _USE_DELTA_T)
    if not ctx.dash_quota and not avail & _QUOTAS:
        ctx.detail &= ~_QUOTAS
    if need_fixup:
        lines = _assign_group_ids(lines, ctx)

    all_in_none = True
    for ln in lines:
        if _shown(ln, ctx, min_last) and ln.group_id > 0:
            all_in_none = ctx.hide_none = False
            break
    if not avail & _GROUP or (ctx.hide_none and all_in_none):
        ctx.hier = False
    if (ctx.hide_groups or all_in_none) and not ctx.dash_quota and not ctx.users_have_quotas:
        ctx.detail &= ~_QUOTAS
    if ctx.detail & _QUOTAS and not ctx.detail & ~_QUOTAS and not ctx.users_have_quotas:
        ctx.hide_users = True

    d = ctx.detail
    if ctx.hier:
        none_last = ctx.policy == "Regroup"
        by_order = bool(d & (_PRIORITY | _USAGE))
        lines = _sorted(lines, lambda a, b: _hierarchical(a, b, d, by_order, none_last))
    else:
        lines = _sorted(lines, lambda a, b: _by_detail(a, b, d))
    return _render(lines, ctx, int(last_update), min_last, tz)


# --- -long and --json ----------------------------------------------------------------------

def _unparse(attr: str, value: Any) -> str:
    """A value as an old-syntax ClassAd literal (reals `%.16G`, `.0` added when integral)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "undefined"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, int) and attr not in _REAL_ATTRS:
        return str(value)
    v = float(value)
    if attr in _INT_ATTRS and math.isfinite(v):
        return str(math.trunc(v))
    if v == 0.0:
        return "%.1f" % v
    if math.isnan(v):
        return 'real("NaN")'
    if math.isinf(v):
        return 'real("INF")' if v > 0 else 'real("-INF")'
    text = "%.16G" % v
    return text if any(c in text for c in ".Ee") else text + ".0"


def _ad(key: str, row: Mapping[str, Any], groups: Mapping[str, Mapping[str, Any]] | None,
        ) -> dict[str, Any]:
    """The record with its group's quota attributes (groups only); nested values dropped."""
    ad = {k: v for k, v in row.items()
          if v is None or isinstance(v, (bool, int, float, str))}
    ad.setdefault("Name", key)
    if row.get("IsAccountingGroup"):
        ad.update(_group_attrs(groups, str(ad["Name"])))
    return ad


def _long(rows: Mapping[str, Mapping[str, Any]],
          groups: Mapping[str, Mapping[str, Any]] | None) -> str:
    """`condor_userprio -long`: one ad per record (all records), attributes sorted, blank line after."""
    ads = sorted((_ad(k, r, groups) for k, r in rows.items()), key=lambda a: str(a["Name"]))
    return "".join("".join(f"{k} = {_unparse(k, ad[k])}\n" for k in sorted(ad)) + "\n" for ad in ads)


def quotas_note(command: str, now: float) -> str:
    """What a command says when the log has no negotiation cycle with the configured groups
    yet, so the group quotas it shows were computed for the log's last event."""
    when = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"poolledger {command}: no negotiation cycle has computed the quotas of every "
            f"configured group yet; group quotas are computed for {when} (the log's last event)")


def userprio_json(rows: Mapping[str, Mapping[str, Any]], *, now: float,
                  groups: Mapping[str, Mapping[str, Any]] | None = None,
                  limits: Mapping[str, Mapping[str, Any]] | None = None,
                  quotas_at: float | None = None,
                  allocations: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The data behind the tables for `--json`: every record (no activity filter), by EUP.

    {"Now", "Submitters": [...], "Groups": [...], "Limits": [{"Name", "Max", "InUse"}]}; groups
    also carry their quota attributes (None when `groups` lacks them; EffectiveQuota is
    HTCondor's, the assigned quota) and, from `allocations`, GroupResourcesAllocated: the
    surplus-adjusted allocation the group is negotiated with. When no negotiation cycle had
    computed the group quotas, "QuotasComputedAt" is the time they were computed for
    (`quotas_at`).
    """
    submitters: list[dict[str, Any]] = []
    group_list: list[dict[str, Any]] = []
    for key, row in rows.items():
        is_group = bool(row.get("IsAccountingGroup", False))
        name = str(row.get("Name", key))
        rec: dict[str, Any] = {attr: row.get(attr) for attr in _JSON_ATTRS}
        rec.update(Name=name, IsAccountingGroup=is_group, EffectivePriority=_eup(row),
                   AccountingGroup=row.get("AccountingGroup", name if is_group else ROOT))
        if is_group:
            quota = _group_attrs(groups, name)
            rec.update({attr: quota.get(attr) for attr in _QUOTA_ATTRS})
            rec[ALLOCATED] = _group_attrs(
                {g: {ALLOCATED: v} for g, v in (allocations or {}).items()}, name).get(ALLOCATED)
            group_list.append(rec)
        else:
            submitters.append(rec)

    def by_eup(r: dict[str, Any]) -> tuple[float, str]:
        eup = r["EffectivePriority"]
        return (math.inf if eup is None else float(eup), str(r["Name"]))

    doc: dict[str, Any] = {
        "Now": now,
        "Submitters": sorted(submitters, key=by_eup),
        "Groups": sorted(group_list, key=by_eup),
        "Limits": [{"Name": n, "Max": v.get("Max"), "InUse": v.get("InUse")}
                   for n, v in sorted((limits or {}).items())],
    }
    if quotas_at is not None:
        doc["QuotasComputedAt"] = quotas_at
    return doc
