"""HTCondor accounting groups: the GROUP_NAMES tree and submitter-to-group mapping.

Mirrors the negotiator's rules: names are case-insensitive, sorted case-insensitively so a
parent is always seen before its children, a group whose parent is missing (or a duplicate)
is ignored with a warning, and `<none>` is the implicit root that every group hangs from.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from streams.core.errors import UnknownGroupError

ROOT: Final = "<none>"
NICE_USER_GROUP: Final = "nice-user"
_SPLIT = re.compile(r"[,\s]+")
_MEMO_MAX: Final = 1 << 16


def split_submitter(name: str) -> tuple[str | None, str, str]:
    """Split `g1.g2.user@domain` into (`g1.g2` or None, `user`, `domain`).

    The group part is everything before the last '.' of the part before the last '@', as
    HTCondor's accountant reads it; `nice-user.x@d` therefore yields group `nice-user`.
    """
    local, at, domain = name.rpartition("@")
    if not at:
        local, domain = name, ""
    group, dot, user = local.rpartition(".")
    return (group if dot and group else None), user, domain


def is_nice_user(name: str) -> bool:
    """A nice_user submitter (`nice-user.<user>@domain`), which gets NICE_USER_PRIO_FACTOR."""
    return name.lower().startswith(NICE_USER_GROUP)


@dataclass(frozen=True, slots=True)
class ChargePath:
    """See `GroupTree.charge_path`."""

    names: tuple[tuple[str, bool], ...]
    group_at: int
    chain_at: tuple[int, ...]
    #: the names alone, and whether each is the submitter's or the group's record
    plain_names: tuple[str, ...]
    always: tuple[bool, ...]
    #: per record, in order: (name, is_group, times it is the submitter's or the group's
    #: record, times it is on `chain(group)`, always) — the accountant's one-pass form
    steps: tuple[tuple[str, bool, int, int, bool], ...] = ()


@dataclass(frozen=True, slots=True)
class GroupTree:
    """The hierarchical group tree parsed from GROUP_NAMES.

    `names` holds the accepted groups (configured casing, sorted case-insensitively, without
    the root); lookups are case-insensitive and return the configured casing.
    """

    names: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    _canon: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    # memo of group_of / children / ancestors: the tree is immutable (a GROUP_NAMES change
    # builds a new tree), so answers never go stale; bounded for submitter names
    _memo: dict[tuple[str, str], object] = field(default_factory=dict, init=False, repr=False,
                                                 compare=False)
    # memo of `charge_path` (the accountant's hot path), bounded like `_memo`
    _paths: dict[tuple[str, str], ChargePath] = field(default_factory=dict, init=False,
                                                      repr=False, compare=False)
    _submitter_paths: dict[str, tuple[str, ChargePath]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    # every group's direct children, built at the first `children` call (one pass over the
    # names: tens of thousands of groups stay linear)
    _children: dict[str, tuple[str, ...]] = field(default_factory=dict, init=False,
                                                  repr=False, compare=False)

    @classmethod
    def from_names(cls, group_names: str | Iterable[str] | None) -> GroupTree:
        """Parse GROUP_NAMES (a comma/space separated string or an iterable of names)."""
        if group_names is None:
            raw: list[str] = []
        elif isinstance(group_names, str):
            raw = [t for t in _SPLIT.split(group_names) if t]
        else:
            raw = [t.strip() for t in group_names if t and t.strip()]
        canon: dict[str, str] = {ROOT.lower(): ROOT}
        accepted: list[str] = []
        warnings: list[str] = []
        for name in sorted(raw, key=str.lower):
            key = name.lower()
            if key in canon:
                warnings.append(f"group {name} is a duplicate; ignored")
                continue
            parent, dot, leaf = name.rpartition(".")
            if dot and (not parent or not leaf or parent.lower() not in canon):
                warnings.append(f"group {name} has no parent group {parent or '(empty)'}; ignored")
                continue
            canon[key] = name
            accepted.append(name)
        return cls(tuple(accepted), tuple(warnings), canon)

    def __contains__(self, group: object) -> bool:
        return isinstance(group, str) and group.lower() in self._canon

    def canonical(self, group: str) -> str | None:
        """The configured casing of `group`, or None when it is not defined."""
        return self._canon.get(group.lower())

    def all_groups(self) -> tuple[str, ...]:
        """Every group including the root, root first then sorted (parents before children)."""
        return (ROOT, *self.names)

    def parent(self, group: str) -> str | None:
        """The parent of `group` (`<none>` for a top-level group, None for the root)."""
        g = self._require(group)
        if g == ROOT:
            return None
        head, dot, _ = g.rpartition(".")
        return self._canon[head.lower()] if dot else ROOT

    def children(self, group: str) -> tuple[str, ...]:
        """The direct children of `group`, in sorted order."""
        found = self._memo.get(("c", group))
        if found is not None:
            return found  # type: ignore[return-value]
        g = self._require(group)
        if not self._children and self.names:  # every group's children in one pass: linear
            kids: dict[str, list[str]] = {}
            for n in self.names:
                parent = self.parent(n)
                assert parent is not None
                kids.setdefault(parent, []).append(n)
            self._children.update((k, tuple(v)) for k, v in kids.items())
        out = self._children.get(g, ())
        self._remember(("c", group), out)
        return out

    def ancestors(self, group: str) -> tuple[str, ...]:
        """The parent, grandparent, ... up to and including `<none>` (empty for the root)."""
        found = self._memo.get(("a", group))
        if found is not None:
            return found  # type: ignore[return-value]
        out = self._ancestors(group)
        self._remember(("a", group), out)
        return out

    def chain(self, group: str) -> tuple[str, ...]:
        """`group` and its ancestors up to `<none>` (what a charge to `group` rolls up to); a
        group the tree does not define stands alone under `<none>`."""
        found = self._memo.get(("ch", group))
        if found is not None:
            return found  # type: ignore[return-value]
        if group == ROOT:
            out: tuple[str, ...] = (ROOT,)
        elif group in self:
            out = (group, *self.ancestors(group))
        else:
            out = (group, ROOT)
        self._remember(("ch", group), out)
        return out

    def charge_path(self, submitter: str, group: str) -> ChargePath:
        """The records a match of `submitter` charged to `group` touches, for the accountant.

        `names` lists (name, is_group) in first-touch order — the submitter, `group`, then
        `chain(group)` — each name once; `group_at` is the index of `group` in it and `chain_at`
        the indexes of `chain(group)`, in order.
        """
        key = (submitter, group)
        found = self._paths.get(key)
        if found is not None:
            return found
        names: list[tuple[str, bool]] = []
        index: dict[str, int] = {}
        for name, is_group in ((submitter, False), (group, True),
                               *((g, True) for g in self.chain(group))):
            if name not in index:
                index[name] = len(names)
                names.append((name, is_group))
        group_at = index[group]
        chain_at = tuple(index[g] for g in self.chain(group))
        always = tuple(i in (0, group_at) for i in range(len(names)))
        steps = tuple((name, is_group, (0, group_at).count(i), chain_at.count(i), always[i])
                      for i, (name, is_group) in enumerate(names))
        out = ChargePath(tuple(names), group_at, chain_at, tuple(n for n, _ in names), always,
                         steps)
        if len(self._paths) >= _MEMO_MAX:
            self._paths.clear()
        self._paths[key] = out
        return out

    def _ancestors(self, group: str) -> tuple[str, ...]:
        out: list[str] = []
        p = self.parent(group)
        while p is not None:
            out.append(p)
            p = self.parent(p)
        return tuple(out)

    def submitter_path(self, submitter: str) -> tuple[str, ChargePath]:
        """`group_of(submitter)` and `charge_path(submitter, group_of(submitter))`, remembered
        per submitter (the accountant's hot path)."""
        found = self._submitter_paths.get(submitter)
        if found is None:
            group = self.group_of(submitter)
            found = (group, self.charge_path(submitter, group))
            if len(self._submitter_paths) >= _MEMO_MAX:
                self._submitter_paths.clear()
            self._submitter_paths[submitter] = found
        return found

    def group_of(self, submitter: str) -> str:
        """The deepest defined group of a submitter name; `<none>` when none is defined.

        `nice-user.x@d` follows the same rule: it maps to `nice-user` only when GROUP_NAMES
        defines that group (HTCondor's negotiator does not invent it), else to `<none>`.
        """
        found = self._memo.get(("g", submitter))
        if found is not None:
            return found  # type: ignore[return-value]
        out = self._group_of(submitter)
        self._remember(("g", submitter), out)
        return out

    def _remember(self, key: tuple[str, str], value: object) -> None:
        if len(self._memo) >= _MEMO_MAX:
            self._memo.clear()
        self._memo[key] = value

    def _group_of(self, submitter: str) -> str:
        group, _, _ = split_submitter(submitter)
        while group:
            found = self._canon.get(group.lower())
            if found is not None and found != ROOT:
                return found
            group, dot, _ = group.rpartition(".")
            if not dot:
                break
        return ROOT

    def _require(self, group: str) -> str:
        found = self._canon.get(group.lower())
        if found is None:
            raise UnknownGroupError(f"unknown group {group}")
        return found
