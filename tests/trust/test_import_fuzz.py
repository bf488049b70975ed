"""Issue 28, "Done means": the importers fuzzed with hypothesis — history files, condor_status
-l dumps, Accountantnew.log and exported JSONL logs, written from generated ads and records,
then spoiled (cut at any byte, a junk line anywhere, NUL bytes, Latin-1, hostile names).

The property: no exception escapes an importer (the CLI would print a traceback), and every
ad, record or line written is either imported exactly (its event carries the same values) or
refused with `file:line` (a dead letter whose line lies within what it was written on).
Nothing is imported that was not written.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adstash.sources import ACCOUNTANT_OPS, import_accountant, import_history, import_status
from schemas.events import AdminCommanded, AdUpdated, JobHistory, JobSubmitted, encode, make_event
from streams.log.embedded import EmbeddedLog
from streams.log.events import DeadLetter, EventLog, ensure_topics
from streams.log.topics import EVENTS

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
_RESERVED = {"true", "false", "undefined", "error", "is", "isnt", "my", "target", "parent",
             "fuzzk", "globaljobid", "completiondate", "clusterid", "procid", "mytype", "name"}

attr_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True).filter(
    lambda n: n.lower() not in _RESERVED)
#: any character a file can hold but NUL (which the spoiler puts in where it likes)
#: and the line breaks (an old-syntax attribute is one line: HTCondor cannot write them in one)
TEXT = st.characters(blacklist_characters="\x00\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
                     blacklist_categories=["Cs"])
LATIN1 = "abcXYZ019 _-.éèàüßÉ"  # its non-ASCII letters never form UTF-8 together
values = st.one_of(st.integers(-2**63, 2**63 - 1),
                   st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False),
                   st.booleans(),
                   st.text(TEXT, max_size=30))


@st.composite
def ads(draw: Any, latin1: bool) -> dict[str, Any]:
    names = draw(st.lists(attr_names, max_size=6, unique_by=str.lower))
    strings = st.text(alphabet=LATIN1, max_size=12)
    pick = st.one_of(st.integers(-2**63, 2**63 - 1), strings) if latin1 else values
    return {n: draw(pick) for n in names}


def literal(value: Any, latin1: bool) -> str:
    """The value as the schedd writes it in old ClassAd syntax: a backslash is literal, only a
    quote is escaped (`\\"`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    return repr(value)


@dataclass
class Written:
    """A file as written: its bytes and, per item, (first line, last line, expected)."""

    raw: bytes = b""
    items: list[tuple[int, int, Any]] = field(default_factory=list)
    lines: int = 0
    starts: list[int] = field(default_factory=list)  # each item's first byte

    def add(self, text: str, expected: Any, encoding: str) -> None:
        first = self.lines + 1
        self.starts.append(len(self.raw))
        self.raw += text.encode(encoding)
        self.lines += text.count("\n")
        self.items.append((first, self.lines, expected))


@st.composite
def spoiled(draw: Any, written: Written) -> bytes:
    """The file, spoiled one way or not at all (a cut drops the items it leaves nothing of)."""
    raw = written.raw
    how = draw(st.sampled_from(["none", "cut", "junk", "nul"]))
    if how == "cut" and raw:
        cut = draw(st.integers(0, len(raw) - 1))
        written.items = [item for item, start in zip(written.items, written.starts)
                         if start < cut]
        return raw[:cut]
    lines = raw.split(b"\n")
    at = draw(st.integers(0, max(0, len(lines) - 1)))
    if how == "junk":  # never a separator, comment or attribute: a line no parser accepts
        junk = draw(st.text(alphabet="abc =\t\x1b!", max_size=20))
        lines.insert(at, ("=" + junk).encode())
    elif how == "nul" and lines[at]:
        k = draw(st.integers(0, len(lines[at])))
        lines[at] = lines[at][:k] + b"\x00" + lines[at][k:]
    return b"\n".join(lines)


def run(importer: Any, raw: bytes, name: str) -> tuple[list[Any], list[DeadLetter], Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(raw)
        log = EmbeddedLog(Path(tmp) / "log")
        try:
            ensure_topics(log)
            elog = EventLog(log)
            importer(elog, [path])  # any exception here is the traceback the CLI would print
            events = [env for _, env in elog.read(EVENTS)]
            dead = elog.dead_letters(EVENTS)
        finally:
            log.close()
    return events, dead, path


def check(written: Written, got: dict[int, Any], dead: list[DeadLetter], path: Path,
          total_lines: int) -> None:
    """Each item imported exactly or refused with a line of its own, or inside a refused
    block (a spoiled `***` banner joins two ads into one, refused at its first bad line);
    every refusal names file:line within the file."""
    for d in dead:
        assert d.path == str(path) and d.line is not None, d.reason
        assert 1 <= d.line <= total_lines + 1, (d.line, d.reason)
        assert d.reason.startswith(f"{path}:{d.line}: ") or d.reason.startswith(
            f"{path}:"), d.reason
    refused = {d.line for d in dead}
    for first, last, expected in written.items:
        if not isinstance(expected, dict):
            continue  # a line that only frames the items (an accountant's 101 or 107)
        k = expected["FuzzK"]
        if k in got:
            assert got[k] == expected, (got[k], expected)
        else:
            mine = expected.get("line")
            assert any(first <= line <= last + 1 for line in refused if line is not None) or (
                mine is not None and any(d.line is not None and d.line <= first and mine in d.raw
                                         for d in dead)), (k, first, last, [d.reason for d in dead])
    assert set(got) <= {e.get("FuzzK") for _, _, e in written.items if isinstance(e, dict)}


# --- history files (schedd history: ads ended by *** banners) -----------------------------------

@FUZZ
@given(st.data(), st.booleans())
def test_history_import_fuzz(data: st.DataObject, latin1: bool) -> None:
    encoding = "latin-1" if latin1 else "utf-8"
    written = Written()
    for k, attrs in enumerate(data.draw(st.lists(ads(latin1), max_size=4))):
        ad = {"FuzzK": k, "GlobalJobId": f"fuzz#{k}.0#1", "CompletionDate": 1763800000 + k,
              **attrs}
        body = "".join(f"{n} = {literal(v, latin1)}\n" for n, v in ad.items())
        written.add(body + f"*** Offset = {k} ClusterId = {k}\n",
                    {**ad, "line": f"FuzzK = {k}\n".encode()}, encoding)
    raw = data.draw(spoiled(written))
    events, dead, path = run(import_history, raw, "history")
    got = {}
    for env in events:
        assert isinstance(env.data, JobHistory)
        got[env.data.ad["FuzzK"]] = {**env.data.ad, "line": f"FuzzK = {env.data.ad['FuzzK']}\n".encode()}
    check(written, got, dead, path, raw.count(b"\n"))


# --- condor_status -l dumps (ads ended by a blank line) -----------------------------------------

@FUZZ
@given(st.data())
def test_status_import_fuzz(data: st.DataObject) -> None:
    written = Written()
    for k, attrs in enumerate(data.draw(st.lists(ads(False), max_size=4))):
        name = f"slot{k}@fuzz" + data.draw(st.text(TEXT, max_size=3))
        ad = {"MyType": "Machine", "Name": name, "FuzzK": k, "UpdateSequenceNumber": k + 1,
              **attrs, "LastHeardFrom": 1763800000 + k}  # a dump dates its ads (or is refused)
        written.add("".join(f"{n} = {literal(v, False)}\n" for n, v in ad.items()) + "\n",
                    {**ad, "line": f"FuzzK = {k}\n".encode()}, "utf-8")
    raw = data.draw(spoiled(written))
    events, dead, path = run(import_status, raw, "status")
    got = {}
    for env in events:
        assert isinstance(env.data, AdUpdated) and env.data.name == env.data.ad["Name"]
        got[env.data.ad["FuzzK"]] = {**env.data.ad, "line": f"FuzzK = {env.data.ad['FuzzK']}\n".encode()}
    check(written, got, dead, path, raw.count(b"\n"))


# --- Accountantnew.log (a ClassAd transaction log) ------------------------------------------

@FUZZ
@given(st.data())
def test_accountant_import_fuzz(data: st.DataObject) -> None:
    written = Written()
    written.add("107 1 CreationTimestamp 1763790000\n", None, "utf-8")
    numbers = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False)
    edits = 0
    for k in range(data.draw(st.integers(0, 3))):
        user = f"u{k}" + data.draw(st.text(alphabet="ab.-\x1b é", max_size=3)) + "@fuzz"
        written.add(f"101 Customer.{user} * *\n", None, "utf-8")
        for attr in data.draw(st.lists(st.sampled_from(sorted(ACCOUNTANT_OPS)), unique=True,
                                       max_size=3)):
            value = data.draw(numbers)
            written.add(f"103 Customer.{user} {attr} {value!r}\n",
                        {"FuzzK": edits, "target": user, "op": ACCOUNTANT_OPS[attr],
                         "value": value}, "utf-8")
            edits += 1
    raw = data.draw(spoiled(written))
    events, dead, path = run(partial(import_accountant, by="root@localhost/localhost"), raw,
                            "Accountantnew.log")
    got: dict[int, Any] = {}
    for env in events:
        d = env.data
        assert isinstance(d, AdminCommanded) and isinstance(d.value, float)
        assert math.isfinite(d.value)
        found = {"target": d.target, "op": d.op, "value": d.value}
        k = next(e["FuzzK"] for _, _, e in written.items
                 if isinstance(e, dict) and {**e, "FuzzK": None} == {**found, "FuzzK": None})
        got[k] = {**found, "FuzzK": k}
    undated = [d for d in dead if d.line is None]
    if undated:  # its 107 line spoiled: the whole file is refused, named, nothing imported
        assert [d.reason for d in undated] == [
            f"{path}: no LastUpdateTime, creation timestamp or LastUsageTime to date the "
            "records by"] and not events
        return
    check(written, got, dead, path, raw.count(b"\n"))


# --- exported JSONL logs (`log import`) ---------------------------------------------------------

@FUZZ
@given(st.data())
def test_jsonl_import_fuzz(data: st.DataObject) -> None:
    written = Written()
    for k in range(data.draw(st.integers(0, 4))):
        env = make_event(JobSubmitted(f"{k}.0", "schedd@fuzz",
                                      data.draw(st.text(max_size=8)) or "x", {"FuzzK": k}),
                         ts=data.draw(st.floats(-1e12, 1e12)), source="schedd@fuzz", seq=k + 1)
        written.add(encode(env).decode() + "\n", {"FuzzK": k, "value": encode(env)}, "utf-8")
    raw = data.draw(spoiled(written))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(raw)
        log = EmbeddedLog(Path(tmp) / "log")
        try:
            ensure_topics(log)
            elog = EventLog(log)
            elog.import_jsonl(path, EVENTS)
            stored = [r.value for r in log.read(EVENTS, 0, 0, 1000)]
            dead = elog.dead_letters(EVENTS)
        finally:
            log.close()
    got = {}
    for value in stored:
        k = orjson.loads(value)["data"]["ad"]["FuzzK"]
        got[k] = {"FuzzK": k, "value": value}  # byte for byte
    check(written, got, dead, path, raw.count(b"\n"))
