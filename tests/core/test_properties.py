"""Property suite (issue 10): random streams of valid and invalid events — duplicates,
reorders, extreme times and numbers, malformed payloads, and (issue 28) late copies of
events hours older (late ads, starts after their stops) and one source's chain of events a
day apart — through the embedded runner and the
replay runner: no exception escapes, every distinct input is applied, dead-lettered at
validation or rejected by the ledger (applied + dead-lettered == input; a second version of
an id, a conflicting duplicate, is rejected), every number in the
state is finite, and the same log gives byte-identical state in both runners."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from schemas.errors import EventValidationError
from schemas.events import content_checksum, decode, encode
from schemas.settings import load_settings
from streams.log.embedded import EmbeddedLog
from streams.log.events import EventLog
from streams.log.port import TopicSpec
from streams.log.topics import DERIVED, EVENTS
from streams.replay import replay
from streams.runner import EmbeddedRunner
from streams.synthetic import mixed_config, mixed_events

SETTINGS = load_settings(env={}, overrides=mixed_config())
BASE = [orjson.loads(encode(e)) for e in mixed_events(400)]
EXTREME = st.sampled_from([1e308, -1e308, 1e15 + 1, -1.0, 0.0, 1e10, 2**63 - 1, "1e999", "nan",
                           None, "x", {}, []])


@st.composite
def streams(draw: Any) -> list[bytes]:
    lines = [dict(e) for e in BASE]
    for _ in range(draw(st.integers(0, 12))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["dup", "swap", "ts", "number", "malformed", "far-seq",
                                   "late", "ahead"]))
        e = dict(lines[i])
        if op in ("ts", "number", "far-seq", "late", "ahead") and not (
                isinstance(e.get("data"), dict) and {"ts", "source"} <= e.keys()):
            op = "dup"  # an entry an earlier mutation malformed has no fields to mutate
        if op == "dup":
            lines.insert(draw(st.integers(0, len(lines))), e)
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "ts":
            lines[i] = dict(e, ts=draw(st.sampled_from([1e10, 1e308, -5.0, 0.0, e["ts"] + 86401])))
        elif op == "number":
            field = draw(st.sampled_from(sorted(e["data"]) or ["x"]))
            lines[i] = dict(e, data=dict(e["data"], **{field: draw(EXTREME)}))
        elif op == "malformed":
            lines[i] = draw(st.sampled_from([{"id": e["id"]}, {**e, "data": "x"}, {**e, "v": 99},
                                             {**e, "type": "nope"}]))
        elif op == "late":  # the same event again, hours older, under a new seq, later on
            seq = 10**6 + len(lines)
            lines.insert(draw(st.integers(i, len(lines))),
                         dict(e, ts=e["ts"] - draw(st.sampled_from([60.0, 14_400.0])), seq=seq,
                              id=f"{e['source']}:{seq}"))
        elif op == "ahead":  # a chain from one source, each a day ahead of the last
            at = draw(st.integers(0, len(lines)))
            for k in range(1, 4):
                lines.insert(at + k - 1, dict(e, ts=e["ts"] + 86_000.0 * k, source="walker@x",
                                              seq=k, id=f"walker@x:{k}"))
        else:
            lines.insert(0, dict(e, id=f"{e['source']}:999999999", seq=999_999_999))
    return [orjson.dumps(x) for x in lines]


def _finite(node: Any) -> bool:
    if isinstance(node, float):
        return math.isfinite(node)
    if isinstance(node, dict):
        return all(_finite(v) for v in node.values())
    if isinstance(node, list):
        return all(_finite(v) for v in node)
    return True


@hsettings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(streams())
def test_random_streams_through_embedded_and_replay(lines: list[bytes]) -> None:
    valid, invalid = [], 0
    for raw in lines:
        try:
            valid.append(decode(raw))
        except EventValidationError:
            invalid += 1
    led = replay(valid, SETTINGS)
    # each distinct id counts once, and so does each later event reusing an id with other
    # content than its first (a conflicting duplicate, rejected: issue 28 item 8)
    first: dict[str, int] = {}
    conflicting = sum(first.setdefault(e.id, content_checksum(e)) != content_checksum(e) for e in valid)
    assert led.applied + led.rejected == len(first) + conflicting
    doc = led.to_doc()
    assert _finite(doc) and "Infinity" not in led.to_json() and "NaN" not in led.to_json()
    honest = max((e.ts for e in valid if e.source != "walker@x" and e.ts < 1e10), default=0.0)
    assert led.now is None or led.now <= honest + 86_400  # no walk: one skew step at most
    with tempfile.TemporaryDirectory() as tmp:
        elog = EventLog(EmbeddedLog(Path(tmp) / "log"))
        for topic in (EVENTS, DERIVED):
            elog.log.create_topic(TopicSpec(topic))
        elog.append_raw(EVENTS, [(None, raw, 1.0) for raw in lines])
        runner = EmbeddedRunner(elog, SETTINGS)
        assert runner.run_once() == len(valid)
        letters = elog.dead_letters(EVENTS)
        assert len(letters) == invalid + runner.ledger.rejected  # applied + dead-lettered == input
        assert runner.ledger.to_json() == led.to_json()  # same log, byte-identical state
        elog.log.close()
