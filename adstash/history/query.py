"""condor_history over the history database: -constraint (ClassAd, via classad2), -limit,
-since, newest first; and the SQL entry point with one-line errors.

Why a translator of our own: classad2 parses and evaluates expressions but does not expose
their tree, and evaluating every ad in Python is what makes condor_history slow on a big
history. So a constraint made of comparisons between job columns and literals, `&&`, `||`,
`!` and parentheses is translated to a SQL pre-filter (ClassAd's three-valued logic maps onto
SQL's NULL: UNDEFINED && FALSE is FALSE, UNDEFINED || TRUE is TRUE; `==` on strings is
case-insensitive, `=?=` is not). Rows whose typed column is NULL (the attribute absent, or an
expression/other type in the ad) are always candidates, and every candidate is then evaluated
by classad2 on its whole ad, so the answer is classad2's own; the SQL only narrows the scan.
Anything outside that grammar is evaluated by classad2 on every ad, newest first.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import orjson

from adstash.history.errors import HistoryQueryError
from adstash.history.schema import JOB_TYPES
from schemas.classads import ad_from_json, compile_expr, eval_tree, evaluation_problem, \
    excerpt
from schemas.errors import ClassAdError

_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?|\.\d+)
  | (?P<str>"(?:[^"\\]|\\["\\])*")
  | (?P<op>=\?=|=!=|==|!=|<=|>=|&&|\|\||[<>!()])
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)
)""", re.VERBOSE)
_COMPARE = {"==", "!=", "<", "<=", ">", ">=", "=?=", "=!="}
_NUMERIC = {"BIGINT", "INTEGER", "DOUBLE"}


class _NotTranslatable(Exception):
    """The constraint is outside the translated grammar (classad2 evaluates every ad)."""


@dataclass
class _Operand:
    sql: str
    kind: str  # "num", "str", "bool", or a column type
    column: str | None = None


class _Translator:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise _NotTranslatable
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0
        self.columns: set[str] = set()
        self.params: list[Any] = []

    def peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.i >= len(self.tokens):
            raise _NotTranslatable
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def parse(self) -> str:
        sql = self.or_()
        if self.i != len(self.tokens):
            raise _NotTranslatable
        return sql

    def or_(self) -> str:
        parts = [self.and_()]
        while self.peek() == "||":
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"

    def and_(self) -> str:
        parts = [self.not_()]
        while self.peek() == "&&":
            self.take()
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else "(" + " AND ".join(parts) + ")"

    def not_(self) -> str:
        if self.peek() == "!":
            self.take()
            return f"(NOT {self.not_()})"
        return self.compare()

    def compare(self) -> str:
        if self.peek() == "(":
            self.take()
            inner = self.or_()
            if self.take()[1] != ")":
                raise _NotTranslatable
            return inner
        left = self.operand()
        if self.peek() not in _COMPARE:
            if left.kind == "BOOLEAN" or left.kind == "bool":
                return left.sql
            raise _NotTranslatable
        op = self.take()[1]
        right = self.operand()
        return self.comparison(left, op, right)

    def operand(self) -> _Operand:
        kind, text = self.take()
        if kind == "num":
            self.params.append(float(text) if any(c in text for c in ".eE") else int(text))
            return _Operand("?", "num")
        if kind == "str":
            self.params.append(text[1:-1].replace('\\"', '"').replace("\\\\", "\\"))
            return _Operand("?", "str")
        if kind == "name":
            low = text.lower()
            if low in ("true", "false"):
                return _Operand(low.upper(), "bool")
            name = low[3:] if low.startswith("my.") else low
            typ = JOB_TYPES.get(name)
            if typ is None:
                raise _NotTranslatable  # not a typed column (or TARGET., undefined, ...)
            self.columns.add(name)
            return _Operand(f'"{name}"', typ, name)
        raise _NotTranslatable

    def comparison(self, left: _Operand, op: str, right: _Operand) -> str:
        kinds = {_family(left.kind), _family(right.kind)}
        if len(kinds) != 1 or (left.column is None and right.column is None):
            raise _NotTranslatable
        family = kinds.pop()
        if op == "=?=":
            return f"({left.sql} IS NOT DISTINCT FROM {right.sql})"
        if op == "=!=":
            return f"({left.sql} IS DISTINCT FROM {right.sql})"
        sql_op = {"==": "=", "!=": "<>"}.get(op, op)
        if family == "str":  # ClassAd compares strings case-insensitively
            return f"(lower({left.sql}) {sql_op} lower({right.sql}))"
        if family == "bool" and op not in ("==", "!="):
            raise _NotTranslatable
        return f"({left.sql} {sql_op} {right.sql})"


def _family(kind: str) -> str:
    if kind in _NUMERIC or kind == "num":
        return "num"
    if kind in ("VARCHAR", "str"):
        return "str"
    return "bool"


@dataclass(frozen=True)
class Prefilter:
    """The SQL narrowing of a constraint (None: classad2 must see every ad)."""

    where: str | None
    params: list[Any]


def translate(constraint: str) -> Prefilter:
    """The SQL pre-filter of a ClassAd constraint (see the module docstring)."""
    try:
        t = _Translator(constraint)
        sql = t.parse()
    except _NotTranslatable:
        return Prefilter(None, [])
    nulls = " OR ".join(f'"{c}" IS NULL' for c in sorted(t.columns))
    return Prefilter(f"({sql}{' OR ' + nulls if nulls else ''})", t.params)


def check_constraint(constraint: str) -> Any:
    """The compiled constraint; a malformed one is a HistoryQueryError naming it."""
    problem = evaluation_problem(constraint)  # malformed, or more than a ClassAd evaluates
    if problem:
        raise HistoryQueryError(f"-constraint {excerpt(constraint)}: {problem}")
    return compile_expr(constraint)


def _holds(expr: Any, ad: Any) -> bool:
    """The constraint is true of the ad (an evaluation classad2 refuses is not true)."""
    try:
        return eval_tree(expr, ad) is True
    except ClassAdError:
        return False


_JOB_ID = re.compile(r"^(\d+)(?:\.(\d+))?$")


def job_restriction(words: list[str]) -> str | None:
    """condor_history's restriction list (cluster, cluster.proc, owner) as a constraint."""
    parts = []
    for w in words:
        m = _JOB_ID.match(w)
        if m and m.group(2) is not None:
            parts.append(f"(ClusterId == {m.group(1)} && ProcId == {m.group(2)})")
        elif m:
            parts.append(f"(ClusterId == {m.group(1)})")
        else:
            parts.append(f"(Owner == {orjson.dumps(w).decode()})")
    return " || ".join(parts) or None


def history(con: duckdb.DuckDBPyConnection, *, constraint: str | None = None,
            limit: int | None = None, since: str | None = None,
            chunk: int = 2000) -> Iterator[dict[str, Any]]:
    """Job ads newest first (the order jobs left the queue), matching `constraint` (classad2
    semantics), stopping at `limit` ads or at `since` (a job id, or an expression that
    becomes true: condor_history's -since)."""
    expr = check_constraint(constraint) if constraint else None
    pre = translate(constraint) if constraint else Prefilter(None, [])
    where, params = [], []
    if pre.where:
        where.append(pre.where)
        params += pre.params
    since_expr = None
    if since is not None:
        m = _JOB_ID.match(since.strip())
        if m:
            cond = "ClusterId = ?" + (" AND ProcId = ?" if m.group(2) is not None else "")
            args = [int(g) for g in m.groups() if g is not None]
            bound = con.execute(f"SELECT ts, log_partition, log_offset FROM jobs WHERE {cond} "
                                "ORDER BY ts DESC, log_partition DESC, log_offset DESC LIMIT 1",
                                args).fetchall()
            if bound:
                where.append("(ts, log_partition, log_offset) > (?, ?, ?)")
                params += list(bound[0])
        else:
            since_expr = check_constraint(since)
    sql = ("SELECT ad FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY ts DESC, log_partition DESC, log_offset DESC LIMIT ? OFFSET ?")
    shown, offset = 0, 0
    try:
        while limit is None or shown < limit:
            rows = con.execute(sql, [*params, chunk, offset]).fetchall()
            if not rows:
                return
            offset += len(rows)
            for (text,) in rows:
                ad = orjson.loads(text)
                if expr is not None or since_expr is not None:
                    cad = ad_from_json(ad)
                    if since_expr is not None and _holds(since_expr, cad):
                        return
                    if expr is not None and not _holds(expr, cad):
                        continue
                yield ad
                shown += 1
                if limit is not None and shown >= limit:
                    return
    except duckdb.Error as exc:
        raise HistoryQueryError(f"history query failed: {str(exc).splitlines()[0]}") from None


def run_sql(con: duckdb.DuckDBPyConnection, statement: str) -> duckdb.DuckDBPyRelation | None:
    """Run an analyst's statement; a parse/bind/run error is one line naming the statement."""
    try:
        return con.sql(statement)
    except duckdb.Error as exc:
        raise HistoryQueryError(sql_message(statement, exc)) from None


def sql_message(statement: str, exc: Exception) -> str:
    """One line for a failed statement; a refused file or extension names the way out."""
    first = str(exc).splitlines()[0]
    if any(word in first for word in ("Permission Error", "read-only mode",
                                      "configuration has been locked")):
        first += ("; `poolledger sql` only reads the history database: `poolledger history "
                  "export --parquet DIR` writes it to files")
    return f"SQL {statement.strip()[:80]!r}: {first}"
