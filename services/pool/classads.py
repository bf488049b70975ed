"""ClassAd plumbing for the simulated daemons, over HTCondor's `classad2` (the only evaluator).

Two HTCondor behaviours classad2 does not give on its own are supplied here:
- `time()` must read the *virtual* clock, so evaluation rewrites it to `CurrentTime` (with
  `schemas.classads.at_time`, the rewrite the folds and the negotiator use too) and puts the
  simulated now in scope;
- an unscoped reference missing from MY falls back to TARGET in HTCondor's matchmaking
  (`START = Owner == "coltrane"`), so the MY scope is built over the target's attributes.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import classad2

from schemas.classads import at_time
from services.pool.errors import PoolConfigError


@dataclass(frozen=True, slots=True, eq=False)
class Expr:
    """A ClassAd expression attribute: its normalized text (published) and its evaluation tree."""

    text: str
    tree: classad2.ExprTree

    def to_json(self) -> str:
        """HTCondor's JSON form of an expression, as classad2's printJson writes it."""
        return f"/Expr({self.text})/"


@functools.lru_cache(maxsize=8192)
def expr(text: str) -> Expr:
    """Parse (once per distinct text) an expression; raises PoolConfigError when it is not one."""
    try:
        tree = classad2.ExprTree(text)
        normalized = str(tree)
        probe = classad2.ClassAd(f"[__x = ({text}\n)]")
        if "__x" not in probe:
            raise ValueError("not an expression")
        evaluable = classad2.ExprTree(at_time(normalized, "CurrentTime"))
    except Exception as exc:  # classad2 raises its own and ValueError types
        raise PoolConfigError(f"cannot parse ClassAd expression {text!r}: {exc}") from None
    return Expr(normalized, evaluable)


def plain(value: Any) -> Any:
    """What classad2 takes for an attribute value (the tree of an Expr, else the literal)."""
    return value.tree if isinstance(value, Expr) else value


_plain = plain


def scope(my: Mapping[str, Any], target: Mapping[str, Any] | None, now: float) -> classad2.ClassAd:
    """The MY ad for evaluation: MY's attributes over TARGET's (HTCondor's fallback), plus now."""
    merged: dict[str, Any] = {}
    if target is not None:
        merged.update((k, _plain(v)) for k, v in target.items())
    merged.update((k, _plain(v)) for k, v in my.items())
    merged["CurrentTime"] = int(now)
    return classad2.ClassAd(merged)


def as_ad(attrs: Mapping[str, Any], now: float | None = None) -> classad2.ClassAd:
    """A plain classad2 ad of `attrs` (TARGET side of an evaluation)."""
    ad = classad2.ClassAd({k: _plain(v) for k, v in attrs.items()})
    if now is not None and "CurrentTime" not in ad:
        ad["CurrentTime"] = int(now)
    return ad


def evaluate(e: Expr | str, my: Mapping[str, Any], target: Mapping[str, Any] | None,
             now: float) -> Any:
    """Evaluate `e` with MY = `my` and TARGET = `target` at virtual time `now`."""
    ex = expr(e) if isinstance(e, str) else e
    return ex.tree.eval(scope(my, target, now), as_ad(target, now) if target is not None else None)


def is_true(value: Any) -> bool:
    """ClassAd truth as the startd uses it: only True (or a non-zero number) is true."""
    if isinstance(value, classad2.Value):
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    return False


def is_false(value: Any) -> bool:
    """Strictly FALSE (UNDEFINED is not FALSE: `FALSE || UNDEFINED` leaves the Owner state)."""
    if isinstance(value, classad2.Value):
        return False
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value == 0
    return False


def as_number(value: Any, default: float) -> float:
    """A numeric result, or `default` when the expression was UNDEFINED/ERROR/non-numeric."""
    if isinstance(value, classad2.Value):  # an int enum: never a number here
        return default
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return default


def is_constant(e: Expr) -> bool:
    """True when `e` references nothing (no attribute, no time()): no need to poll it."""
    if "time(" in e.text or "random(" in e.text:
        return False
    refs = classad2.ClassAd().externalRefs(e.tree)
    return all(r == "" for r in refs)


def to_json(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """An attribute dict in HTCondor's JSON form (expressions as "/Expr(...)/" strings)."""
    return {k: (v.to_json() if isinstance(v, Expr) else v) for k, v in attrs.items()}


def from_json(ad: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `to_json`: "/Expr(...)/" strings become Expr values again."""
    return {k: (expr(v[6:-2]) if isinstance(v, str) and v.startswith("/Expr(") and v.endswith(")/")
                else v) for k, v in ad.items()}


def matches(a: Mapping[str, Any], b: Mapping[str, Any], now: float) -> bool:
    """Both Requirements hold, each evaluated in its own ad against the other (symmetric match)."""
    ra = a.get("Requirements", True)
    rb = b.get("Requirements", True)
    if isinstance(ra, Expr) and not is_true(evaluate(ra, a, b, now)):
        return False
    if isinstance(rb, Expr) and not is_true(evaluate(rb, b, a, now)):
        return False
    return (ra is True or isinstance(ra, Expr)) and (rb is True or isinstance(rb, Expr))
