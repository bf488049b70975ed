"""Column evaluation of common ClassAd expression forms over many slots at once.

Matching every job against every slot one pair at a time is what makes a naive negotiator
slow. This module evaluates one expression for one constant ad (a job's autocluster, or a
knob) against a *column set* of slot ads in a few numpy operations. It understands only a
small, common subset of the ClassAd language (literals, attribute references with MY/TARGET
scoping and HTCondor's unscoped MY-then-TARGET fallthrough, arithmetic, comparisons, meta
comparisons, three-valued `&&`/`||`/`!`, `?:`, `ifThenElse`, `isUndefined`, `regexp` with a
literal pattern that PCRE and Python's re read alike). It is NOT a
ClassAd evaluator: anything outside the subset raises `NotCompilableError`, and any row whose
value would involve an ERROR, a type mix or an unusual literal is flagged `bad`; callers
evaluate such expressions and rows with classad2 (`pair_eval`), which stays the authority.
Tests compare both paths row by row.
"""
from __future__ import annotations

import itertools
import operator
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Union

import classad2
import numpy as np
import numpy.typing as npt

from services.negotiator.errors import NegotiatorError

BoolArr = npt.NDArray[np.bool_]
Ast = tuple[Any, ...]


class NotCompilableError(NegotiatorError):
    """The expression uses a form the column evaluator does not handle; use classad2."""


@dataclass(frozen=True, slots=True)
class ExprText:
    """An attribute whose value is an expression (not a literal); `text` as classad2 prints it."""

    text: str


Literal = Union[bool, int, float, str, None, ExprText, object]

# ---------------------------------------------------------------------------------------------
# Parsing (subset grammar, cached by text)

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
     |(?P<str>"(?:[^"\\]|\\.)*")
     |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
     |(?P<op>=\?=|=!=|==|!=|<=|>=|&&|\|\||[-+*/<>!()?:,.])
    )""",
    re.X,
)
_CMP = {"==", "!=", "<", "<=", ">", ">=", "=?=", "=!=", "is", "isnt"}
#: regexp() patterns that PCRE (HTCondor's) and Python's re read alike: no escapes, no
#: named groups or other extensions
_SAFE_REGEX = re.compile(r"[A-Za-z0-9_^$.*+?|()\[\]{},:@/ -]*")


def _tokenize(text: str) -> list[tuple[str, str]]:
    pos, out = 0, []
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise NotCompilableError(f"unsupported syntax at {text[pos:pos + 10]!r}")
        kind = m.lastgroup or ""
        val = m.group(kind)
        if kind == "name" and val.lower() in ("is", "isnt"):
            kind, val = "op", val.lower()
        out.append((kind, val))
        pos = m.end()
    out.append(("end", ""))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i]

    def take(self, val: str | None = None) -> tuple[str, str]:
        tok = self.toks[self.i]
        if val is not None and tok[1] != val:
            raise NotCompilableError(f"expected {val!r}")
        self.i += 1
        return tok

    def parse(self) -> Ast:
        node = self.ternary()
        if self.peek()[0] != "end":
            raise NotCompilableError("trailing tokens")
        return node

    def ternary(self) -> Ast:
        cond = self.binary(0)
        if self.peek() == ("op", "?"):
            self.take()
            a = self.ternary()
            self.take(":")
            b = self.ternary()
            return ("cond", cond, a, b)
        return cond

    _LEVELS: tuple[frozenset[str], ...] = (
        frozenset({"||"}), frozenset({"&&"}), frozenset({"==", "!=", "=?=", "=!=", "is", "isnt"}),
        frozenset({"<", "<=", ">", ">="}), frozenset({"+", "-"}), frozenset({"*", "/"}),
    )

    def binary(self, level: int) -> Ast:
        if level == len(self._LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while self.peek()[0] == "op" and self.peek()[1] in self._LEVELS[level]:
            op = self.take()[1]
            node = ("bin", op, node, self.binary(level + 1))
        return node

    def unary(self) -> Ast:
        kind, val = self.peek()
        if kind == "op" and val in ("!", "-", "+"):
            self.take()
            return ("un", val, self.unary())
        return self.primary()

    def primary(self) -> Ast:
        kind, val = self.take()
        if kind == "num":
            if any(c in val for c in ".eE"):
                return ("lit", float(val))
            return ("lit", int(val))
        if kind == "str":
            body = val[1:-1]
            if "\\" in body:
                if re.search(r"\\[^\"\\]", body):
                    raise NotCompilableError("string escape")
                body = body.replace('\\"', '"').replace("\\\\", "\\")
            return ("lit", body)
        if kind == "op" and val == "(":
            node = self.ternary()
            self.take(")")
            return node
        if kind != "name":
            raise NotCompilableError(f"unexpected {val!r}")
        low = val.lower()
        if self.peek() == ("op", "("):
            self.take()
            args: list[Ast] = []
            if self.peek() != ("op", ")"):
                args.append(self.ternary())
                while self.peek() == ("op", ","):
                    self.take()
                    args.append(self.ternary())
            self.take(")")
            if low == "ifthenelse" and len(args) == 3:
                return ("cond", args[0], args[1], args[2])
            if low == "isundefined" and len(args) == 1:
                return ("isundef", args[0])
            if low == "regexp" and len(args) == 2 and args[0][0] == "lit" and isinstance(
                    args[0][1], str) and _SAFE_REGEX.fullmatch(args[0][1]):
                return ("regexp", re.compile(args[0][1]), args[1])
            raise NotCompilableError(f"function {val}")
        if low in ("true", "false"):
            return ("lit", low == "true")
        if low == "undefined":
            return ("lit", None)
        if low == "error":
            raise NotCompilableError("error literal")
        if self.peek() == ("op", "."):
            self.take()
            attr = self.take()
            if attr[0] != "name" or low not in ("my", "target"):
                raise NotCompilableError("nested attribute reference")
            return ("ref", low, attr[1].lower())
        return ("ref", "", low)


#: the deepest AST the column evaluator walks (it recurses): deeper expressions (a
#: 2,000-term sum) are left to classad2, whose own limit then decides
MAX_AST_DEPTH = 100


def _depth(node: Ast) -> int:
    """How deep `node` nests (iteratively: the point is not to recurse on a deep tree)."""
    deepest, todo = 0, [(node, 1)]
    while todo:
        n, d = todo.pop()
        deepest = max(deepest, d)
        todo.extend((c, d + 1) for c in n[1:] if isinstance(c, tuple))
    return deepest


@lru_cache(maxsize=65536)
def parse(text: str) -> Ast:
    """Parse `text` into the subset AST, raising `NotCompilableError` outside the subset
    (or deeper than MAX_AST_DEPTH)."""
    node = _Parser(text).parse()
    if _depth(node) > MAX_AST_DEPTH:
        raise NotCompilableError(f"nested deeper than {MAX_AST_DEPTH}")
    return node


# ---------------------------------------------------------------------------------------------
# Column values


@dataclass(slots=True)
class Col:
    """One expression's value per row: kind is 'num', 'bool', 'str' or 'undef' (all undefined).

    `undef` marks UNDEFINED rows, `bad` marks rows this module will not decide (ERROR, type
    mixes); `isint` tells ClassAd integers from reals for 'num'.
    """

    kind: str
    val: npt.NDArray[Any]
    undef: BoolArr
    bad: BoolArr
    isint: BoolArr
    low: npt.NDArray[Any] | None = None

    def lowered(self) -> npt.NDArray[Any]:
        """Lowercased strings (ClassAd `==` on strings ignores case), computed once, when
        first compared (a slot table's column is mostly read for its codes, or a few rows)."""
        if self.low is None:
            self.low = np.char.lower(self.val.astype(str))
        return self.low


def _full(n: int, v: bool) -> BoolArr:
    return np.full(n, v, dtype=bool)


def literal_col(v: Any, n: int) -> Col:
    """Broadcast one literal to n rows; unusual literals become bad rows."""
    f, t = _full(n, False), _full(n, True)
    if v is None or (isinstance(v, classad2.Value) and v == classad2.Value.Undefined):
        return Col("undef", np.zeros(n), t, f, f)
    if isinstance(v, bool):
        return Col("bool", np.full(n, v), f, f, f)
    if isinstance(v, int) and not isinstance(v, classad2.Value):
        return Col("num", np.full(n, float(v)), f, f, t)
    if isinstance(v, float):
        return Col("num", np.full(n, v), f, f, f)
    if isinstance(v, str) and v.isascii():
        return Col("str", np.full(n, v), f, f, f, np.full(n, v.lower()))
    return Col("undef", np.zeros(n), t, t.copy(), f)


def column_from_values(values: Sequence[Any]) -> Col:
    """Build a column from per-row literal values (None = missing/undefined)."""
    n = len(values)
    fast = _plain_column(values)
    if fast is not None:
        return fast
    kinds = {"num": 0, "bool": 0, "str": 0}
    for v in values:
        if isinstance(v, bool):
            kinds["bool"] += 1
        elif isinstance(v, (int, float)) and not isinstance(v, classad2.Value):
            kinds["num"] += 1
        elif isinstance(v, str):
            kinds["str"] += 1
    kind = max(kinds, key=lambda k: kinds[k])
    undef, bad, isint = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    if kinds[kind] == 0:
        undef[:] = True
        for i, v in enumerate(values):
            if v is not None and not (isinstance(v, classad2.Value) and v == classad2.Value.Undefined):
                bad[i] = True
        return Col("undef", np.zeros(n), undef, bad, isint)
    val: npt.NDArray[Any] = np.zeros(n) if kind != "str" else np.empty(n, dtype=object)
    if kind == "bool":
        val = np.zeros(n, dtype=bool)
    for i, v in enumerate(values):
        if v is None:
            undef[i] = True
        elif kind == "bool" and isinstance(v, bool):
            val[i] = v
        elif kind == "num" and isinstance(v, (int, float)) and not isinstance(v, (bool, classad2.Value)):
            val[i] = float(v)
            isint[i] = isinstance(v, int)
        elif kind == "str" and isinstance(v, str) and v.isascii():
            val[i] = v
        elif isinstance(v, classad2.Value) and v == classad2.Value.Undefined:
            undef[i] = True
        else:
            bad[i] = True
            undef[i] = True
    if kind == "str":
        val[undef] = ""
        sval = val.astype(str)
        return Col(kind, sval, undef, bad, isint)
    return Col(kind, val, undef, bad, isint)


def _plain_column(values: Sequence[Any]) -> Col | None:
    """`column_from_values` without a Python branch per row, for the usual column: missing
    values only, or with numbers only, booleans only or ASCII strings only. None otherwise."""
    n = len(values)
    types = Counter(map(type, values))
    nones = types[type(None)]
    if nones == n:  # an attribute no row has as a literal
        return Col("undef", np.zeros(n), _full(n, True), _full(n, False), _full(n, False))
    undef = (np.fromiter(map(operator.is_, values, itertools.repeat(None)), dtype=bool, count=n)
             if nones else _full(n, False))
    if types[bool] and types[bool] + nones == n:
        val = np.fromiter(map(operator.is_, values, itertools.repeat(True)), dtype=bool, count=n)
        return Col("bool", val, undef, np.zeros(n, bool), np.zeros(n, bool))
    nums = types[int] + types[float]
    if nums and nums + nones == n:
        if nones:
            obj = np.array(values, dtype=object)
            obj[undef] = 0.0
            val = obj.astype(float)
        else:
            val = np.array(values, dtype=float)
        isint = (_full(n, True) if types[int] == n else _full(n, False) if not types[int]
                 else np.fromiter(map(operator.is_, map(type, values), itertools.repeat(int)),
                                  dtype=bool, count=n))
        return Col("num", val, undef, np.zeros(n, bool), isint)
    if types[str] and types[str] + nones == n:
        strs = [v for v in values if v is not None] if nones else values
        if all(map(str.isascii, strs)):
            sval = np.array(["" if v is None else v for v in values] if nones else values,
                            dtype=str)
            return Col("str", sval, undef, np.zeros(n, bool), np.zeros(n, bool))
    return None


def take(col: Col, rows: npt.NDArray[np.intp]) -> Col:
    """The rows `rows` of a column."""
    return Col(col.kind, col.val[rows], col.undef[rows], col.bad[rows], col.isint[rows],
               None if col.low is None else col.low[rows])


# ---------------------------------------------------------------------------------------------
# Sides: where attribute references resolve


class Side:
    """One ad (constant) or a set of rows of slot ads (columns) seen from an expression."""

    n: int

    def lookup(self, name: str) -> tuple[BoolArr, Col | None, str | None]:
        """(has-attribute mask, literal column or None, expression text if an expression)."""
        raise NotImplementedError


class ConstSide(Side):
    """A single ad, broadcast to `n` rows. Values are literals or `ExprText`."""

    def __init__(self, values: Mapping[str, Any], n: int) -> None:
        self.values = values
        self.n = n
        self._cache: dict[str, tuple[BoolArr, Col | None, str | None]] = {}

    def lookup(self, name: str) -> tuple[BoolArr, Col | None, str | None]:
        hit = self._cache.get(name)
        if hit is None:
            if name not in self.values:
                hit = (_full(self.n, False), None, None)
            else:
                v = self.values[name]
                if isinstance(v, ExprText):
                    hit = (_full(self.n, True), None, v.text)
                else:
                    hit = (_full(self.n, True), literal_col(v, self.n), None)
            self._cache[name] = hit
        return hit


class ColumnSide(Side):
    """Rows of a slot table that share the same expression-valued attributes.

    `column(name)` returns the full-table literal column (missing = undefined) and `has(name)`
    the presence mask; `exprs` maps the group's expression-valued attributes to their text.
    """

    def __init__(self, column: Callable[[str], tuple[Col, BoolArr]], exprs: Mapping[str, str],
                 rows: npt.NDArray[np.intp]) -> None:
        self.column = column
        self.exprs = exprs
        self.rows = rows
        self.n = len(rows)
        self._cache: dict[str, tuple[BoolArr, Col | None, str | None]] = {}

    def lookup(self, name: str) -> tuple[BoolArr, Col | None, str | None]:
        hit = self._cache.get(name)
        if hit is None:
            text = self.exprs.get(name)
            if text is not None:
                hit = (_full(self.n, True), None, text)
            else:
                col, has = self.column(name)
                hit = (has[self.rows], take(col, self.rows), None)
            self._cache[name] = hit
        return hit


# ---------------------------------------------------------------------------------------------
# Evaluation


def _select(mask: BoolArr, a: Col, b: Col) -> Col:
    """Row-wise `mask ? a : b`; kinds must agree (undef adapts)."""
    if a.kind == "undef" and b.kind != "undef":
        a = Col(b.kind, np.zeros_like(b.val), a.undef, a.bad, a.isint, np.zeros_like(b.val)
                if b.kind == "str" else None)
    elif b.kind == "undef" and a.kind != "undef":
        b = Col(a.kind, np.zeros_like(a.val), b.undef, b.bad, b.isint, np.zeros_like(a.val)
                if a.kind == "str" else None)
    if a.kind != b.kind:
        # Rows of either side are fine only where the selected side decides them; the result
        # kind is one of them, so rows taking the other kind are left to classad2.
        bad = np.where(mask, a.bad, b.bad | True)
        return Col(a.kind, a.val.copy(), np.where(mask, a.undef, True), bad, a.isint.copy())
    low = np.where(mask, a.lowered(), b.lowered()) if a.kind == "str" else None
    return Col(a.kind, np.where(mask, a.val, b.val), np.where(mask, a.undef, b.undef),
               np.where(mask, a.bad, b.bad), np.where(mask, a.isint, b.isint), low)


def _as_num(c: Col) -> Col:
    if c.kind == "bool":
        return Col("num", c.val.astype(float), c.undef, c.bad, np.ones(len(c.val), bool))
    if c.kind == "str":
        return Col("num", np.zeros(len(c.val)), c.undef, c.bad | ~c.undef, c.isint)
    return c


def _truth(c: Col) -> Col:
    """Boolean view for logic: numbers are true when nonzero, strings are ERROR."""
    if c.kind == "bool":
        return c
    if c.kind == "num":
        return Col("bool", c.val != 0, c.undef, c.bad, c.isint)
    if c.kind == "undef":
        return Col("bool", np.zeros(len(c.val), bool), c.undef, c.bad, c.isint)
    return Col("bool", np.zeros(len(c.val), bool), c.undef, c.bad | ~c.undef, c.isint)


class Evaluator:
    """Evaluates subset ASTs over sides; one instance per (self, other) evaluation."""

    MAX_DEPTH = 24

    def eval(self, text: str, me: Side, other: Side) -> Col:
        """Evaluate expression `text` owned by `me` against `other`."""
        try:
            return self._ev(parse(text), me, other, 0)
        except RecursionError:  # references chaining shallow trees into a deep one
            raise NotCompilableError("nested too deep for the column evaluator") from None

    def _ref(self, scope: str, name: str, me: Side, other: Side, depth: int) -> Col:
        if scope == "target":
            return self._attr(other, me, name, depth)
        if scope == "my":
            # MY.x of a missing x is left to classad2 (pair_eval), whose answer depends on
            # whether x is also read unscoped; deferring keeps both paths identical.
            col = self._attr(me, other, name, depth)
            has, _, _ = me.lookup(name)
            if not has.all():
                col = Col(col.kind, col.val, col.undef | ~has, col.bad | ~has, col.isint, col.low)
            return col
        has, _, _ = me.lookup(name)
        if has.all():
            return self._attr(me, other, name, depth)
        if not has.any():
            return self._attr(other, me, name, depth)
        return _select(has, self._attr(me, other, name, depth), self._attr(other, me, name, depth))

    def _attr(self, side: Side, other: Side, name: str, depth: int) -> Col:
        if depth > self.MAX_DEPTH:
            raise NotCompilableError("reference depth")
        _, col, text = side.lookup(name)
        if text is not None:
            return self._ev(parse(text), side, other, depth + 1)
        return col if col is not None else literal_col(None, side.n)

    def _ev(self, node: Ast, me: Side, other: Side, depth: int) -> Col:
        n = me.n
        tag = node[0]
        if tag == "lit":
            return literal_col(node[1], n)
        if tag == "ref":
            return self._ref(node[1], node[2], me, other, depth)
        if tag == "isundef":
            a = self._ev(node[1], me, other, depth)
            return Col("bool", a.undef.copy(), _full(n, False), a.bad, _full(n, False))
        if tag == "regexp":
            a = self._ev(node[2], me, other, depth)
            if a.kind != "str":
                return Col("bool", _full(n, False), a.undef, a.bad | ~a.undef, _full(n, False))
            hits: dict[str, bool] = {}
            search = node[1].search
            val = np.fromiter((hits[x] if x in hits else hits.setdefault(x, search(x) is not None)
                               for x in a.val), dtype=bool, count=n)
            return Col("bool", val & ~a.undef, a.undef, a.bad, _full(n, False))
        if tag == "cond":
            c = _truth(self._ev(node[1], me, other, depth))
            a = self._ev(node[2], me, other, depth)
            b = self._ev(node[3], me, other, depth)
            out = _select(c.val, a, b)
            out.undef = out.undef | c.undef
            out.bad = out.bad | c.bad
            return out
        if tag == "un":
            op = node[1]
            a = self._ev(node[2], me, other, depth)
            if op == "!":
                t = _truth(a)
                return Col("bool", ~t.val, t.undef, t.bad, t.isint)
            if a.kind == "undef":
                return a
            if a.kind != "num":
                return Col("num", np.zeros(n), a.undef, a.bad | ~a.undef, a.isint)
            return Col("num", -a.val if op == "-" else a.val, a.undef, a.bad, a.isint)
        op = node[1]
        a = self._ev(node[2], me, other, depth)
        b = self._ev(node[3], me, other, depth)
        if op in ("&&", "||"):
            return self._logic(op, _truth(a), _truth(b))
        if op in ("=?=", "=!=", "is", "isnt"):
            return self._meta(op in ("=!=", "isnt"), a, b)
        if op in _CMP:
            return self._compare(op, a, b)
        return self._arith(op, a, b)

    @staticmethod
    def _logic(op: str, a: Col, b: Col) -> Col:
        bad = a.bad | b.bad
        if op == "&&":
            a_false = ~a.val & ~a.undef
            b_false = ~b.val & ~b.undef
            val = ~a_false & ~b_false & ~a.undef & ~b.undef
            undef = ~a_false & ~b_false & (a.undef | b.undef)
        else:
            a_true = a.val & ~a.undef
            b_true = b.val & ~b.undef
            val = a_true | b_true
            undef = ~val & (a.undef | b.undef)
        return Col("bool", val, undef, bad, np.zeros(len(val), bool))

    @staticmethod
    def _meta(negate: bool, a: Col, b: Col) -> Col:
        n = len(a.val)
        bad = a.bad | b.bad
        both_undef = a.undef & b.undef
        if a.kind != b.kind or a.kind == "undef":
            same = both_undef
        else:
            defined = ~a.undef & ~b.undef
            if a.kind == "num":
                eq = (a.val == b.val) & (a.isint == b.isint)
            else:
                eq = a.val == b.val
            same = both_undef | (defined & np.asarray(eq, dtype=bool))
        return Col("bool", ~same if negate else same, _full(n, False), bad, _full(n, False))

    @staticmethod
    def _compare(op: str, a: Col, b: Col) -> Col:
        n = len(a.val)
        undef = a.undef | b.undef
        bad = a.bad | b.bad
        if a.kind == "undef" or b.kind == "undef":
            return Col("bool", _full(n, False), _full(n, True), bad, _full(n, False))
        if a.kind == "str" or b.kind == "str":
            if a.kind != b.kind:
                return Col("bool", _full(n, False), undef, bad | ~undef, _full(n, False))
            x: npt.NDArray[Any] = a.lowered()
            y: npt.NDArray[Any] = b.lowered()
        elif a.kind == "bool" and b.kind == "bool" and op in ("==", "!="):
            x, y = a.val, b.val
        else:
            x, y = _as_num(a).val, _as_num(b).val
        res = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
               ">": np.greater, ">=": np.greater_equal}[op](x, y)
        return Col("bool", np.asarray(res, dtype=bool) & ~undef, undef, bad, _full(n, False))

    @staticmethod
    def _arith(op: str, a: Col, b: Col) -> Col:
        n = len(a.val)
        undef = a.undef | b.undef
        if a.kind == "undef" or b.kind == "undef":
            return Col("num", np.zeros(n), _full(n, True), a.bad | b.bad, _full(n, False))
        x, y = _as_num(a), _as_num(b)
        bad = x.bad | y.bad
        isint = x.isint & y.isint
        if op == "+":
            val = x.val + y.val
        elif op == "-":
            val = x.val - y.val
        elif op == "*":
            val = x.val * y.val
        else:
            zero = (y.val == 0) & ~undef
            bad = bad | zero
            safe = np.where(y.val == 0, 1.0, y.val)
            q = x.val / safe
            val = np.where(isint, np.trunc(q), q)
        return Col("num", np.where(undef, 0.0, val), undef, bad, isint)


def truth_mask(c: Col) -> BoolArr:
    """Rows where the value is a definite true (numbers nonzero), as matchmaking reads it."""
    if c.kind == "bool":
        return np.asarray(c.val & ~c.undef, dtype=bool)
    if c.kind == "num":
        return np.asarray((c.val != 0) & ~c.undef, dtype=bool)
    return np.zeros(len(c.val), bool)


def rank_values(c: Col) -> npt.NDArray[np.float64]:
    """Rank as a float per row: numbers as is, booleans 1/0, anything else 0.0."""
    if c.kind == "num":
        return np.where(c.undef, 0.0, c.val.astype(float))
    if c.kind == "bool":
        return np.where(c.undef, 0.0, c.val.astype(float))
    return np.zeros(len(c.val))


# ---------------------------------------------------------------------------------------------
# The classad2 path (authority and fallback)


def pair_eval(expr: classad2.ExprTree, my: classad2.ClassAd, target: classad2.ClassAd) -> Any:
    """Evaluate `expr` owned by `my` against `target` with HTCondor's matchmaking scoping.

    HTCondor resolves an unscoped attribute missing from MY in TARGET (the ClassAd
    `alternateScope`); classad2's two-argument eval does not. So the referenced, missing
    attributes are copied from `target` into `my` (as their evaluated values) for the
    duration of the call and removed again. classad2 does all the evaluating. Known
    approximation: an expression reading a missing x both unscoped and as `MY.x` sees the
    target's x in both places; target attributes are copied as values evaluated in the
    target (their own unscoped references do not fall back to `my`).
    """
    injected: list[str] = []
    refs: list[str] = []
    todo, seen = [expr], set()
    while todo:  # classad2 does not follow `MY.x` into x's own references; do it here
        try:
            found = my.externalRefs(todo.pop())
        except Exception:  # pragma: no cover - classad2 refusing an expression
            found = []
        for ref in found:
            if ref.lower() in seen:
                continue
            seen.add(ref.lower())
            scope, dot, name = ref.partition(".")
            if dot and scope.lower() == "my" and name in my:
                todo.append(my.lookup(name))
            refs.append(ref)
    for ref in refs:
        if not ref or "." in ref or ref in injected:
            continue
        if ref in target:
            try:
                val = target.lookup(ref).eval(target, my)
            except classad2.ClassAdException:
                val = classad2.Value.Error
            if isinstance(val, classad2.Value):
                val = classad2.ExprTree("undefined" if val == classad2.Value.Undefined else "error")
            my[ref] = val
            injected.append(ref)
    try:
        return expr.eval(my, target)
    except classad2.ClassAdException:  # too deep or too much work: no value (the job's own
        return classad2.Value.Error      # expressions were refused first, with the reason)
    finally:
        for ref in injected:
            del my[ref]


def value_truth(v: Any) -> bool:
    """Matchmaking's reading of a Requirements value (as classad2's `matches` converts)."""
    if isinstance(v, classad2.Value):
        return False
    if isinstance(v, (bool, int, float)):
        return bool(v)
    return False


def value_rank(v: Any) -> float:
    """Rank's reading of a value: numbers as is, booleans 1/0, else 0.0."""
    if isinstance(v, classad2.Value):
        return 0.0
    if isinstance(v, (bool, int, float)):
        return float(v)
    return 0.0
