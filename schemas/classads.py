"""ClassAd helpers: a thin, strict layer over HTCondor's own `classad2` bindings.

Why a layer at all: classad2 parses permissively (trailing junk is ignored, the old-style
parser silently stops at a bad line) and its errors never say where. PoolLedger must never
lose input silently and must name `file:line` of a malformed attribute, so this module
checks every attribute strictly and locates failures itself; evaluation, matching and the
JSON form stay classad2's (never a home-grown evaluator).
"""
from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import classad2
import orjson
from classad2 import ClassAd, ExprTree, Value

from schemas.errors import ClassAdError

__all__ = [
    "ClassAd", "ExprTree", "Value", "UNDEFINED", "ERROR", "AdLike",
    "MAX_EXPR_CHARS", "compile_expr", "eval_tree", "evaluation_problem", "excerpt",
    "old_syntax", "parse_ad", "parse_history", "parse_status_dump", "parse_json_ads",
    "ad_to_json", "ad_from_json", "ad_to_json_bytes", "evaluate", "matches",
    "symmetric_match", "rank", "is_expr_json", "at_time", "ad_at_time", "nondeterministic",
    "TIME_CALL", "Expr", "expr", "plain", "scope", "as_ad", "evaluate_policy", "is_true", "is_false",
    "as_number", "is_constant", "attrs_to_json", "attrs_from_json", "policy_matches",
]

UNDEFINED = Value.Undefined
ERROR = Value.Error

#: What evaluate/match accept as an ad: a ClassAd, or a dict in HTCondor's JSON form.
AdLike: TypeAlias = "ClassAd | Mapping[str, Any]"
#: Called with the error and the raw text of a malformed ad when a caller wants to go on.
OnError: TypeAlias = Callable[[ClassAdError, str], None]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_OLD_LINE = re.compile(r"\s*([^\s=]+)\s*=(.*)\Z", re.S)
_EXPR_JSON = re.compile(r"/Expr\((.*)\)/\Z", re.S)


# ---------------------------------------------------------------------------------------
# strict expression parsing (with a cache: one parse per distinct string)


#: the longest expression (or literal) text accepted, in characters: far beyond any real
#: Requirements or Environment, far below what makes a parse, a log record or a sink's
#: document a burden. Depth and evaluation work are bounded by classad2 itself (its
#: evaluator refuses an expression nested some 400 operators deep, or one whose attribute
#: references multiply into millions of steps); `evaluate` turns that refusal into
#: ClassAdError.
MAX_EXPR_CHARS = 1 << 20
#: what classad2's refusal to evaluate means (it says only "failed to evaluate expression")
UNEVALUABLE = "nested too deep or too much work for a ClassAd evaluator"


def _check_single(text: str) -> str | None:
    """Why `text` is not exactly one ClassAd expression, or None when it is.

    Wrapping in parentheses makes classad2 reject trailing junk and `a; b = c` smuggling,
    which it would otherwise accept; the newline ends a trailing `//` comment.
    """
    if not text.strip():
        return "empty expression"
    if len(text) > MAX_EXPR_CHARS:
        return f"expression of {len(text)} characters (at most {MAX_EXPR_CHARS})"
    if "\0" in text:
        return "a NUL character (ClassAds cannot hold one)"
    try:
        probe = ClassAd(f"[__pl = (\n{text}\n)]")
    except classad2.ClassAdException:
        return f"cannot parse expression {excerpt(text)}"
    if len(probe) != 1:
        return f"cannot parse expression {excerpt(text)}"
    return None


@functools.lru_cache(maxsize=65536)
def _compile(text: str) -> ExprTree:
    reason = _check_single(text)
    if reason:
        raise ClassAdError(reason)
    return ClassAd(f"[__pl = \n{text}\n]").lookup("__pl")


def compile_expr(text: str | ExprTree) -> ExprTree:
    """Parse one ClassAd expression strictly; cached, so hot paths parse each string once.

    The returned tree is shared: treat it as read-only (inserting it into an ad copies it).
    """
    if isinstance(text, ExprTree):
        return text
    return _compile(text)


# ---------------------------------------------------------------------------------------
# parsing ads


def _skip_ws_comments(text: str, i: int) -> int:
    n = len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            break
    return i


def _skip_quoted(text: str, i: int) -> int:
    """Index after the string or quoted name starting at text[i] (honouring backslashes)."""
    quote, n, i = text[i], len(text), i + 1
    while i < n:
        if text[i] == "\\":
            i += 2
        elif text[i] == quote:
            return i + 1
        else:
            i += 1
    return n


def _line_at(text: str, index: int, first_line: int) -> int:
    return first_line + text.count("\n", 0, index)


def _locate_new_style(text: str, first_line: int) -> tuple[int, str] | None:
    """Find (line, reason) of the first bad top-level attribute of a `[ ... ]` ad, if any.

    classad2 says only "unable to parse"; scanning the top level ourselves (strings,
    comments and nesting respected) lets each attribute be checked on its own.
    """
    n = len(text)
    i = _skip_ws_comments(text, 0)
    if i >= n or text[i] != "[":
        return _line_at(text, i, first_line), "expected '[' to open a ClassAd"
    i += 1
    while True:
        i = _skip_ws_comments(text, i)
        if i >= n:
            return _line_at(text, n, first_line), "unterminated ClassAd: missing ']'"
        if text[i] == "]":
            end = _skip_ws_comments(text, i + 1)
            if end < n:
                return _line_at(text, end, first_line), "unexpected text after the closing ']'"
            return None
        start = i
        if text[i] == "'":
            i = _skip_quoted(text, i)
            name = text[start:i]
        else:
            m = _IDENT.match(text, i)
            if not m:
                return _line_at(text, i, first_line), f"expected an attribute name at {text[i:i + 20]!r}"
            name, i = m.group(0), m.end()
        line = _line_at(text, start, first_line)
        i = _skip_ws_comments(text, i)
        if i >= n or text[i] != "=":
            return line, f"attribute {name}: expected '='"
        i += 1
        vstart, depth = i, 0
        while i < n:
            ch = text[i]
            if ch in "\"'":
                i = _skip_quoted(text, i)
                continue
            if text.startswith("//", i) or text.startswith("/*", i):
                i = _skip_ws_comments(text, i)
                continue
            if ch in "[{(":
                depth += 1
            elif depth == 0 and ch in ";])}":
                break
            elif ch in ")}]":
                depth -= 1
            i += 1
        reason = _check_single(text[vstart:i])
        if reason:
            return line, f"attribute {name}: {reason}"
        if i < n and text[i] == ";":
            i += 1


def _new_style(text: str, path: str | None, first_line: int) -> ClassAd:
    # Scan first: classad2 ignores anything after the closing bracket; we do not.
    problem = _locate_new_style(text, first_line)
    if problem:
        raise ClassAdError(problem[1], path=path, line=problem[0])
    try:
        return ClassAd(text)
    except classad2.ClassAdException:
        raise ClassAdError("malformed ClassAd", path=path, line=first_line) from None


def old_syntax(value: str) -> str:
    """An expression in old ClassAd syntax rewritten in the new syntax classad2 parses by default.

    Old syntax (history files, `condor_status -l`, `condor_history -l`, ClassAd transaction logs
    such as Accountantnew.log, the wire) differs from the new only in its string literals, as
    HTCondor's lexer reads them (`tokenizeStringOld`): a backslash is literal, `\\"` is a quote
    inside the string unless it ends the line (then the string ends in a backslash), and there
    are no other escapes. Each literal is decoded that way and re-quoted with classad2's own
    quoting, so `"C:\\Users\\x\\test"` stays that text; the rest of the expression is
    unchanged, and the strict checks of the new syntax then apply to it.
    """
    if '"' not in value and "'" not in value or "\0" in value:
        return value  # a NUL stays for the strict check to name (classad2 cannot quote it)
    out: list[str] = []
    i, n = 0, len(value)
    while i < n:
        ch = value[i]
        if ch not in "\"'":
            j = i
            while j < n and value[j] not in "\"'":
                j += 1
            out.append(value[i:j])
            i = j
            continue
        parts: list[str] = []
        j = i + 1
        while True:
            k = value.find(ch, j)
            if k < 0:  # unterminated: left as it is, for the strict check to name
                return "".join(out) + value[i:]
            if k > j and value[k - 1] == "\\" and k + 1 < n:
                parts.append(value[j:k - 1] + ch)  # `\"` followed by more text: a quote
                j = k + 1
                continue
            parts.append(value[j:k])
            i = k + 1
            break
        text = "".join(parts)
        if ch == '"':
            out.append(classad2.quote(text))
        else:  # a quoted attribute name
            out.append("'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'")
    return "".join(out)


def _old_style(lines: list[tuple[int, str]], path: str | None) -> ClassAd:
    """Old-style (`Name = value` per line) ad, read as old ClassAd syntax (`old_syntax`); each
    line is checked on its own first.

    classad2's old-style parser drops a bad line and everything after it without a word,
    so a per-line strict check is what turns that into an error naming the line.
    """
    parts: list[str] = []
    for lineno, raw in lines:
        m = _OLD_LINE.match(raw)
        if not m:
            raise ClassAdError(f"expected 'Name = value', got {raw.strip()[:60]!r}", path=path, line=lineno)
        name, value = m.group(1), old_syntax(m.group(2).rstrip())
        if not _NAME.match(name):
            raise ClassAdError(f"invalid attribute name {name!r}", path=path, line=lineno)
        reason = _check_single(value)
        if reason:
            raise ClassAdError(f"attribute {name}: {reason}", path=path, line=lineno)
        parts.append(f"{name} = {value}\n")
    if not parts:
        return ClassAd()
    try:
        return ClassAd("[\n" + ";".join(parts) + "]")
    except classad2.ClassAdException:  # pragma: no cover - every line parsed alone
        raise ClassAdError("malformed ClassAd", path=path, line=lines[0][0]) from None


def _content_lines(text: str, first_line: int) -> list[tuple[int, str]]:
    out = []
    for k, raw in enumerate(text.splitlines()):
        s = raw.strip()
        if s and not s.startswith("#") and not s.startswith("//"):
            out.append((first_line + k, raw))
    return out


def _is_new_style(text: str) -> bool:
    i = _skip_ws_comments(text, 0)
    return i < len(text) and text[i] == "["


def parse_ad(text: str, path: str | None = None, *, first_line: int = 1) -> ClassAd:
    """Parse one ad, new-style `[ a = 1; ... ]` or old-style `Name = value` lines.

    A malformed attribute raises ClassAdError with `path` and the line it starts on
    (`first_line` numbers the text's first line, for ads cut out of a larger file).
    """
    if _is_new_style(text):
        return _new_style(text, path, first_line)
    return _old_style(_content_lines(text, first_line), path)


def _read_source(source: str | os.PathLike[str], path: str | None) -> tuple[str, str]:
    """(text, name for messages) from a path or from literal text."""
    if isinstance(source, os.PathLike) or ("\n" not in source and os.path.isfile(source)):
        p = Path(source)
        try:
            return p.read_text(encoding="utf-8", errors="surrogateescape"), path or str(p)
        except OSError as exc:
            raise ClassAdError(f"cannot read: {exc.strerror}", path=str(p)) from None
    return source, path or "<string>"


def _emit(block: list[tuple[int, str]], name: str, on_error: OnError | None) -> Iterator[ClassAd]:
    if not block:
        return
    try:
        yield _old_style(block, name)
    except ClassAdError as exc:
        if on_error is None:
            raise
        on_error(exc, "\n".join(raw for _, raw in block))


def parse_history(source: str | os.PathLike[str], *, path: str | None = None,
                  on_error: OnError | None = None, first_line: int = 1) -> Iterator[ClassAd]:
    """Iterate the job ads of an HTCondor history file (each ad ends with a `*** ...` banner).

    `source` is a path or the file's text. A malformed ad raises ClassAdError naming the
    file and line, unless `on_error` is given: then it receives the error and the ad's raw
    text (for a dead-letter topic) and parsing goes on with the next ad. `first_line` numbers
    the text's first line (a follower reads a file in stretches).
    """
    text, name = _read_source(source, path)
    block: list[tuple[int, str]] = []
    for k, raw in enumerate(text.splitlines(), start=first_line):
        s = raw.strip()
        if s.startswith("***"):
            yield from _emit(block, name, on_error)
            block = []
        elif s and not s.startswith("#"):
            block.append((k, raw))
    yield from _emit(block, name, on_error)


def parse_status_dump(source: str | os.PathLike[str], *, path: str | None = None,
                      on_error: OnError | None = None) -> Iterator[ClassAd]:
    """Iterate the ads of `condor_status -l` (or `condor_q -l`) output: blank-line separated.

    Errors behave as in parse_history.
    """
    text, name = _read_source(source, path)
    block: list[tuple[int, str]] = []
    for k, raw in enumerate(text.splitlines(), start=1):
        s = raw.strip()
        if not s:
            yield from _emit(block, name, on_error)
            block = []
        elif not s.startswith("#"):
            block.append((k, raw))
    yield from _emit(block, name, on_error)


def parse_json_ads(source: str | os.PathLike[str], *, path: str | None = None) -> list[ClassAd]:
    """Ads from `condor_status -json` style text: a JSON list of ads (or one ad object)."""
    text, name = _read_source(source, path)
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ClassAdError(f"invalid JSON: {exc.msg}", path=name, line=exc.lineno) from None
    items = data if isinstance(data, list) else [data]
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise ClassAdError(f"item {k} is not a JSON object", path=name)
        try:
            out.append(ad_from_json(item))
        except ClassAdError as exc:
            raise ClassAdError(f"item {k}: {exc.reason}", path=name) from None
    return out


# ---------------------------------------------------------------------------------------
# HTCondor's JSON form


def is_expr_json(value: object) -> bool:
    """True for a `"/Expr(...)/"` string, which the JSON form uses for unevaluated expressions."""
    return isinstance(value, str) and _EXPR_JSON.match(value) is not None


def _patch(value: Any, out: Any) -> Any:
    """Make printJson's output lossless, walking the ad's Python values alongside it.

    printJson prints reals with 16 digits (3.5987733768283484e16 comes back different, and
    -DBL_MAX overflows), so literal reals are replaced by the exact Python float; literal
    strings that look like `/Expr(...)/` (printJson tells them apart only by escaping the
    slashes of real expressions, which a JSON decoder erases) become `/Expr("...")/`,
    which reads back as the same string.
    """
    if isinstance(value, float):
        return value if isinstance(out, (int, float)) and not isinstance(out, bool) else out
    if isinstance(value, str):
        return f"/Expr({classad2.quote(value)})/" if is_expr_json(value) else out
    if isinstance(value, ClassAd) and isinstance(out, dict):
        lower = {k.lower(): k for k in out}
        for key in value:
            jkey = key if key in out else lower.get(key.lower())
            if jkey is not None:
                out[jkey] = _patch(value[key], out[jkey])
        return out
    if isinstance(value, list) and isinstance(out, list):
        return [_patch(v, o) for v, o in zip(value, out)]
    return out


def ad_to_json(ad: ClassAd) -> dict[str, Any]:
    """The ad in HTCondor's JSON form (as printJson): literals as JSON values, anything else
    as `"/Expr(...)/"`; UNDEFINED is null, ERROR is `"/Expr(error)/"`. Lossless with
    ad_from_json, including reals (exact, and `3.0` stays a float)."""
    text = ad.printJson()
    try:
        obj: dict[str, Any] = orjson.loads(text)
    except orjson.JSONDecodeError:  # a real printed out of double range; patched below
        obj = json.loads(text)
    # only reals, `/Expr(`-looking strings and containers can need patching: look those up
    # alone (a lookup per attribute was most of the cost of converting a slot ad)
    for key, out in obj.items():
        kind = type(out)
        if kind is float or kind is list or kind is dict or (
                kind is str and out.startswith("/Expr(")):
            obj[key] = _patch(ad[key], out)
    return obj


def ad_to_json_bytes(ad: ClassAd) -> bytes:
    """ad_to_json serialized compactly (orjson), for event payloads and files."""
    return orjson.dumps(ad_to_json(ad))


def _from_json_value(value: Any, where: str) -> Any:
    if isinstance(value, str):
        m = _EXPR_JSON.match(value)
        if m is None:
            if "\0" in value:  # classad2 would silently cut the string there
                raise ClassAdError(f"{where}: a NUL character (ClassAd strings cannot hold one)")
            return value
        try:
            return ExprTree(compile_expr(m.group(1)))  # a private copy, not the cached tree
        except ClassAdError as exc:
            raise ClassAdError(f"{where}: {exc.reason}") from None
    if isinstance(value, dict):
        return _ad_from_json(value, where + ".")
    if isinstance(value, (list, tuple)):
        return [_from_json_value(v, f"{where}[{k}]") for k, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, Value, ClassAd, ExprTree)):
        return value
    raise ClassAdError(f"{where}: unsupported JSON value of type {type(value).__name__}")


def _ad_from_json(obj: Mapping[str, Any], prefix: str) -> ClassAd:
    ad = ClassAd()
    for key, value in obj.items():
        if not isinstance(key, str):
            raise ClassAdError(f"{prefix}{key!r}: attribute names must be strings")
        ad[key] = _from_json_value(value, prefix + key)
    return ad


def ad_from_json(obj: Mapping[str, Any]) -> ClassAd:
    """Build a ClassAd from HTCondor's JSON form (the inverse of ad_to_json).

    Plain Python values are accepted too (None is UNDEFINED); a bad `/Expr(...)/` raises
    ClassAdError naming the attribute path.
    """
    if isinstance(obj, ClassAd):
        return obj
    return _ad_from_json(obj, "")


# ---------------------------------------------------------------------------------------
# evaluation and matchmaking (MY = the ad the expression belongs to, TARGET = the other)


def _as_ad(ad: AdLike | None) -> ClassAd | None:
    if ad is None or isinstance(ad, ClassAd):
        return ad
    return ad_from_json(ad)


# ClassAd function names are case-insensitive; `time()` takes no argument.
TIME_CALL = re.compile(r"\btime\s*\(\s*\)", re.IGNORECASE)
#: the other readings of the wall clock: `formatTime()` and `absTime()` without their time
#: argument, and an unscoped `CurrentTime` (old ClassAds' name for now, which HTCondor's
#: tools still bind); each is rebound to the event time like `time()`
_CLOCK_CALL = re.compile(r"\b(formatTime|absTime)\s*\(\s*\)", re.IGNORECASE)
_CURRENT_TIME = re.compile(r"(?<![.\w])CurrentTime\b", re.IGNORECASE)
#: ClassAd functions whose value is not a function of the expression's inputs.
_NONDETERMINISTIC = re.compile(r"\brandom\s*\(", re.IGNORECASE)


def at_time(text: str, now: float | str) -> str:
    """`text` with every `time()` (and `formatTime()`, `absTime()`, `CurrentTime`) reading
    `now` instead of the wall clock: the integer seconds of an event or cycle time, or an
    attribute name bound to it (the simulator's `CurrentTime`).

    Why a rewrite: classad2's `time()` always reads the wall clock and has no hook to bind it
    (its ExprTree has only eval/simplify), yet a fold must give the same result on every
    replay and the negotiator must judge a job at its cycle's `now`. This is the one place
    every evaluator (folds, negotiator, simulator) takes that rewrite from.
    """
    if "time" not in text.lower():
        return text
    value = now if isinstance(now, str) else str(int(now))
    text = TIME_CALL.sub(value, text)
    text = _CLOCK_CALL.sub(lambda m: f"{m.group(1)}({value})", text)
    return _CURRENT_TIME.sub(value, text)


def nondeterministic(text: str) -> str | None:
    """The nondeterministic ClassAd function `text` calls (`random()`), or None."""
    m = _NONDETERMINISTIC.search(text)
    return m.group(0).rstrip("( ").lower() + "()" if m else None


def ad_at_time(ad: dict[str, Any], now: float) -> dict[str, Any]:
    """A JSON-form ad whose `/Expr(...)/` attributes read `time()` as `now` (the same dict
    when none mentions time(), so the common case costs one scan)."""
    out: dict[str, Any] | None = None
    for key, value in ad.items():
        if type(value) is str and value.startswith("/Expr(") and "time" in value.lower():
            bound = at_time(value, now)
            if bound != value:
                if out is None:
                    out = dict(ad)
                out[key] = bound
    return ad if out is None else out


def _classad_at_time(ad: ClassAd, now: float) -> ClassAd:
    """`ad_at_time` for a ClassAd: a copy when an attribute mentions time()."""
    texts = {key: str(ad.lookup(key)) for key in ad.keys()}
    bound = {key: at_time(text, now) for key, text in texts.items()}
    if bound == texts:
        return ad
    copy = ClassAd()
    for key, text in bound.items():
        copy[key] = compile_expr(text)
    return copy


def _ad_at(ad: AdLike | None, now: float) -> ClassAd | None:
    if ad is None:
        return None
    if isinstance(ad, ClassAd):
        return _classad_at_time(ad, now)
    return ad_from_json(ad_at_time(dict(ad), now))


def evaluate(expr: str | ExprTree, my: AdLike | None = None, target: AdLike | None = None,
             *, now: float | None = None) -> Any:
    """Evaluate an expression with MY (and unscoped names) in `my` and TARGET in `target`.

    With `now` (an event's or a cycle's time), `time()` in the expression and in the ads'
    attributes evaluates to `int(now)` (`at_time`), never to the wall clock: folds and the
    negotiator always pass it. Returns classad2's Python value: bool, int, float, str, list,
    ClassAd, datetime, or UNDEFINED/ERROR. Beware: those two are IntEnum members, so test
    them with `is` first.
    """
    if now is None:
        return eval_tree(compile_expr(expr), _as_ad(my), _as_ad(target))
    text = expr if isinstance(expr, str) else str(expr)
    return eval_tree(compile_expr(at_time(text, now)), _ad_at(my, now), _ad_at(target, now))


def eval_tree(tree: ExprTree, my: ClassAd | None = None, target: ClassAd | None = None) -> Any:
    """`tree.eval(my, target)`, with classad2's refusal (an expression nested too deep, or
    one whose references multiply past its work limit) as ClassAdError naming the
    expression, so that one hostile ad is that ad's problem and never its reader's crash."""
    try:
        return tree.eval(scope=my, target=target)
    except classad2.ClassAdException:
        raise ClassAdError(f"{excerpt(str(tree))}: {UNEVALUABLE}") from None


@functools.lru_cache(maxsize=4096)
def evaluation_problem(text: str) -> str | None:
    """Why classad2 cannot evaluate the expression `text` whatever the ads it meets (it is
    not one expression, it nests too deep, it is too much work), or None."""
    try:
        tree = compile_expr(text)
    except ClassAdError as exc:
        return exc.reason
    try:
        tree.eval()
    except classad2.ClassAdException:
        return UNEVALUABLE
    return None


def excerpt(text: str, width: int = 60) -> str:
    """`text` quoted for a one-line message: whole when short, else its start and length."""
    text = text.strip()
    return repr(text) if len(text) <= width else f"{text[:width]!r}... ({len(text)} characters)"


def matches(my: AdLike, target: AdLike) -> bool:
    """True when `my`'s Requirements are true against `target` (one side of a match); an
    expression classad2 refuses to evaluate is no match."""
    a, b = _as_ad(my), _as_ad(target)
    assert a is not None and b is not None
    try:
        return b.matches(a)
    except classad2.ClassAdException:
        return False


def symmetric_match(a: AdLike, b: AdLike) -> bool:
    """True when both ads' Requirements are true, each evaluated with the other as TARGET."""
    x, y = _as_ad(a), _as_ad(b)
    assert x is not None and y is not None
    try:
        return x.symmetricMatch(y)
    except classad2.ClassAdException:
        return False


def rank(my: AdLike, target: AdLike, attr: str = "Rank") -> float:
    """`my`'s Rank against `target` as a float; undefined/error/non-numeric rank 0.0 (as
    HTCondor's negotiator and startd treat it), booleans 1.0/0.0."""
    a, b = _as_ad(my), _as_ad(target)
    assert a is not None
    try:
        expr = a.lookup(attr)
    except KeyError:
        return 0.0
    try:
        value = eval_tree(expr, a, b)
    except ClassAdError:
        return 0.0
    if isinstance(value, Value):
        return 0.0
    if isinstance(value, (bool, int, float)):
        return float(value)
    return 0.0


# ---------------------------------------------------------------------------------------
# the daemons' side: policy expressions as a startd or schedd evaluates them
#
# Two HTCondor behaviours classad2 does not give on its own are supplied here for the
# simulated daemons (services/pool):
# - `time()` reads the *virtual* clock: a policy expression is compiled once with `time()`
#   rewritten to `CurrentTime` (`at_time`) and evaluated with the simulated now in scope;
# - an unscoped reference missing from MY falls back to TARGET in HTCondor's matchmaking
#   (`START = Owner == "coltrane"`), so the MY scope is built over the target's attributes.


@dataclass(frozen=True, slots=True, eq=False)
class Expr:
    """A policy expression attribute: its normalized text (published) and its evaluation tree."""

    text: str
    tree: ExprTree

    def to_json(self) -> str:
        """HTCondor's JSON form of an expression, as classad2's printJson writes it."""
        return f"/Expr({self.text})/"


@functools.lru_cache(maxsize=8192)
def expr(text: str) -> Expr:
    """Parse a policy expression strictly (once per distinct text); ClassAdError when it is not
    exactly one expression."""
    normalized = str(compile_expr(text))
    return Expr(normalized, compile_expr(at_time(normalized, "CurrentTime")))


def plain(value: Any) -> Any:
    """What classad2 takes for an attribute value (the tree of an Expr, else the literal)."""
    return value.tree if isinstance(value, Expr) else value


def scope(my: Mapping[str, Any], target: Mapping[str, Any] | None, now: float) -> ClassAd:
    """The MY ad for evaluation: MY's attributes over TARGET's (HTCondor's fallback), plus now."""
    merged: dict[str, Any] = {}
    if target is not None:
        merged.update((k, plain(v)) for k, v in target.items())
    merged.update((k, plain(v)) for k, v in my.items())
    merged["CurrentTime"] = int(now)
    return ClassAd(merged)


def as_ad(attrs: Mapping[str, Any], now: float | None = None) -> ClassAd:
    """A plain classad2 ad of `attrs` (the TARGET side of an evaluation)."""
    ad = ClassAd({k: plain(v) for k, v in attrs.items()})
    if now is not None and "CurrentTime" not in ad:
        ad["CurrentTime"] = int(now)
    return ad


def evaluate_policy(e: Expr | str, my: Mapping[str, Any], target: Mapping[str, Any] | None,
                    now: float) -> Any:
    """Evaluate a policy expression with MY = `my` and TARGET = `target` at virtual time `now`."""
    ex = expr(e) if isinstance(e, str) else e
    try:
        return eval_tree(ex.tree, scope(my, target, now),
                         as_ad(target, now) if target is not None else None)
    except ClassAdError:
        return ERROR


def is_true(value: Any) -> bool:
    """ClassAd truth as the startd uses it: only True (or a non-zero number) is true."""
    if isinstance(value, Value):
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    return False


def is_false(value: Any) -> bool:
    """Strictly FALSE (UNDEFINED is not FALSE: `FALSE || UNDEFINED` leaves the Owner state)."""
    if isinstance(value, Value):
        return False
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value == 0
    return False


def as_number(value: Any, default: float) -> float:
    """A numeric result, or `default` when the expression was UNDEFINED/ERROR/non-numeric."""
    if isinstance(value, Value):  # an int enum: never a number here
        return default
    if isinstance(value, (bool, int, float)):
        return float(value)
    return default


def is_constant(e: Expr) -> bool:
    """True when `e` references nothing (no attribute, no time()): no need to poll it."""
    if "time(" in e.text or nondeterministic(e.text):
        return False
    return all(r == "" for r in ClassAd().externalRefs(e.tree))


def attrs_to_json(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """An attribute dict in HTCondor's JSON form (expressions as "/Expr(...)/" strings)."""
    return {k: (v.to_json() if isinstance(v, Expr) else v) for k, v in attrs.items()}


def attrs_from_json(ad: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `attrs_to_json`: "/Expr(...)/" strings become Expr values again."""
    out: dict[str, Any] = {}
    for k, v in ad.items():
        m = _EXPR_JSON.match(v) if isinstance(v, str) else None
        out[k] = expr(m.group(1)) if m is not None else v
    return out


def policy_matches(a: Mapping[str, Any], b: Mapping[str, Any], now: float) -> bool:
    """Both Requirements hold, each evaluated in its own ad against the other (symmetric match)."""
    ra = a.get("Requirements", True)
    rb = b.get("Requirements", True)
    if isinstance(ra, Expr) and not is_true(evaluate_policy(ra, a, b, now)):
        return False
    if isinstance(rb, Expr) and not is_true(evaluate_policy(rb, b, a, now)):
        return False
    return (ra is True or isinstance(ra, Expr)) and (rb is True or isinstance(rb, Expr))
