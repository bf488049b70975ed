"""The event contract: roundtrip, validation messages, upcasting, JSON Schema."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import msgspec
import orjson
import pytest
from hypothesis import given, strategies as st

from schemas.errors import EventValidationError
from schemas.events import (ADMIN_OPS, MAX_QUANTITY, PAYLOAD_TYPES, AdminCommanded, AdInvalidated, AdRefresh,
                            AdsRefreshed, AdUpdated, ConfigChanged,
                            JobHistory, JobStarted, JobStopped, JobSubmitted, LimitChanged, Matched,
                            NegotiationCycled, PriorityChanged, QuotaComputed, decode, encode,
                            json_schema, make_event, partition_key, payload_from_dict)

EXAMPLES = [
    AdUpdated("Machine", "slot1@ep1", {"Cpus": 4, "Start": "/Expr(TARGET.Memory > 1024)/"}),
    AdInvalidated("Machine", "slot1@ep1"),
    AdsRefreshed([AdRefresh("Machine", "slot1@ep1", "Machine/slot1@ep1", 1763800300.0, 7, 9, 2,
                            {"LoadAvg": 0.5, "LastHeardFrom": 1763800300})]),
    JobSubmitted("1.0", "schedd@ap1", "alice@example.org", {"ClusterId": 1, "ProcId": 0}),
    JobStarted("123.0", "schedd@ap1.example.org", "group_physics.einstein@example.org",
               "slot1_3@ep7.example.org", 2.0, {"Cpus": 2, "Memory": 4096}, "xsw,fileserver:3"),
    JobStopped("123.0", "slot1_3@ep7.example.org", "preempted", "schedd@ap1", "alice@example.org"),
    JobHistory({"GlobalJobId": "ap1#1.0#1", "JobStatus": 4}),
    NegotiationCycled("negotiator", 7, 1763800000.5, {"poolledger.events": {"0": 10}},
                      {"alice@example.org": {"matches": 2}}, 0.25, 2, {"no match found": 1}),
    Matched("negotiator", 7, "1.0", "schedd@ap1", "alice@example.org", "<none>", "slot1@ep1",
            "Priority", "bob@example.org"),
    AdminCommanded("setfactor", "alice@example.org", 10.0, "root", "fair share", 3600.0),
    ConfigChanged("PRIORITY_HALFLIFE", "3600", "root"),
    PriorityChanged("alice@example.org", 12.5, 1000.0, 12500.0, "schedd@ap1:4", 10.0, 1000.0, 2, 2.0),
    QuotaComputed("group_physics", 20.0, 20.0, 20.0, "startd@ep1:1"),
    LimitChanged("xsw", 3.0, 1.0, "schedd@ap1:9"),
]


def test_every_type_has_an_example() -> None:
    assert {type(p) for p in EXAMPLES} == set(PAYLOAD_TYPES)


@pytest.mark.parametrize("payload", EXAMPLES, ids=lambda p: p.TYPE)
def test_roundtrip_and_schema(payload: object) -> None:
    env = make_event(payload, ts=1763800000.5, source="schedd@ap1", seq=42)  # type: ignore[arg-type]
    assert env.id == "schedd@ap1:42"
    raw = encode(env)
    assert decode(raw) == env
    jsonschema.validate(orjson.loads(raw), json_schema(type(payload)))  # type: ignore[arg-type]


def test_design_example_decodes() -> None:
    raw = json.dumps({"id": "schedd@ap1.example.org:1042", "type": "job.started", "v": 1,
                      "ts": 1763800000.0, "source": "schedd@ap1.example.org", "seq": 1042,
                      "data": {"job_id": "123.0", "schedd": "schedd@ap1.example.org",
                               "submitter": "group_physics.einstein@example.org",
                               "slot": "slot1_3@ep7.example.org", "slot_weight": 2.0,
                               "resources": {"Cpus": 2, "Memory": 4096},
                               "concurrency_limits": "xsw,fileserver:3"}})
    env = decode(raw)
    assert isinstance(env.data, JobStarted) and env.data.slot_weight == 2.0
    assert partition_key(env) == "group_physics.einstein@example.org"


def _bad(data_override: dict, **env_override: object) -> str:
    env = {"id": "schedd@ap1:7", "type": "job.started", "v": 1, "ts": 1.0, "source": "schedd@ap1",
           "seq": 7, "data": {"job_id": "1.0", "schedd": "s", "submitter": "a@b", "slot": "x",
                              "slot_weight": 1.0}}
    env["data"].update(data_override)  # type: ignore[union-attr]
    env.update(env_override)
    with pytest.raises(EventValidationError) as info:
        decode(json.dumps(env))
    return str(info.value)


def test_validation_names_event_type_and_field() -> None:
    msg = _bad({"slot_weight": "heavy"})
    assert "'schedd@ap1:7'" in msg and "'job.started'" in msg and "'data.slot_weight'" in msg
    assert "expected" in msg and "str" in msg
    assert "'data.slot'" in _bad({"slot": None})
    assert "unknown event type" in _bad({}, type="job.exploded")
    assert "'ts'" in _bad({}, ts="yesterday")
    assert "'seq'" in _bad({}, seq=None) and "must be an integer" in _bad({}, seq="7")
    stopped = {"id": "s:1", "type": "job.stopped", "v": 2, "ts": 1, "source": "s", "seq": 1,
               "data": {"job_id": "1.0", "slot": "x", "reason": "exploded"}}
    with pytest.raises(EventValidationError, match="'exploded' is not one of completed"):
        decode(json.dumps(stopped))


def test_missing_field_and_bad_json() -> None:
    env = {"id": "s:1", "type": "job.started", "v": 1, "ts": 1, "source": "s", "seq": 1,
           "data": {"job_id": "1.0"}}
    with pytest.raises(EventValidationError, match="required field is missing") as info:
        decode(json.dumps(env))
    assert info.value.field == "data.schedd" and info.value.event_id == "s:1"
    with pytest.raises(EventValidationError, match="not valid JSON"):
        decode(b"{not json")
    with pytest.raises(EventValidationError, match="field 'seq'"):
        decode(json.dumps({k: v for k, v in env.items() if k != "seq"}))


def test_upcast_job_stopped_v1() -> None:
    v1 = {"id": "s:1", "type": "job.stopped", "v": 1, "ts": 1, "source": "s", "seq": 1,
          "data": {"job_id": "1.0", "slot": "slot1@ep", "reason": "completed"}}
    env = decode(json.dumps(v1))
    assert env.v == 2 and env.data == JobStopped("1.0", "slot1@ep", "completed", "", "")


def test_newer_version_rejected() -> None:
    v9 = {"id": "s:1", "type": "job.started", "v": 9, "ts": 1, "source": "s", "seq": 1, "data": {}}
    with pytest.raises(EventValidationError, match="version 9 is newer"):
        decode(json.dumps(v9))


@given(st.from_regex(r"[^\s\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]{1,40}", fullmatch=True),
       st.floats(allow_nan=False, allow_infinity=False, width=64),
       st.integers(min_value=0, max_value=2**53))
def test_roundtrip_property(name: str, weight: float, seq: int) -> None:
    """A SlotWeight within [0, MAX_QUANTITY] round-trips; any other is refused, field named.
    (Submitter names as HTCondor's, issue 28: no whitespace or control characters.)"""
    env = make_event(JobStarted("1.0", "s", name, "slot", weight), ts=1.0, source="s", seq=seq)
    if 0.0 <= weight <= MAX_QUANTITY:
        assert decode(encode(env)) == env
    else:
        with pytest.raises(EventValidationError, match=r"field 'data\.slot_weight'.* is outside"):
            decode(encode(env))


def test_schema_export_cli(tmp_path: Path) -> None:
    out = tmp_path / "schemas"
    proc = subprocess.run([sys.executable, "-m", "services.cli", "--home", str(tmp_path / "h"),
                           "schema", "export", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert "job.stopped.v2.schema.json" in files and len(files) == len(PAYLOAD_TYPES)
    schema = json.loads((out / "job.started.v1.schema.json").read_text())
    assert schema["properties"]["data"]["required"] == ["job_id", "schedd", "submitter", "slot",
                                                        "slot_weight"]


def _refusal(raw: bytes) -> EventValidationError:
    with pytest.raises(EventValidationError) as info:
        decode(raw)
    return info.value


def _started(**data: object) -> bytes:
    env = {"id": "schedd@ap1:7", "type": "job.started", "v": 1, "ts": 1.0, "source": "schedd@ap1",
           "seq": 7, "data": {"job_id": "1.0", "schedd": "s", "submitter": "a@b", "slot": "x",
                              "slot_weight": 1.0, **data}}
    return msgspec.json.encode(env)


@pytest.mark.parametrize(("raw", "field", "reason"), [
    # wrong type, in the envelope and in the payload (bool is no number)
    (_started(slot_weight=True), "data.slot_weight", "expected float, got bool True"),
    (_started(concurrency_limits=5), "data.concurrency_limits", "expected str, got int 5"),
    (_started(resources=[]), "data.resources", "expected object, got list []"),
    # out of range: the bounds come from the types, the value from the record
    (_started(slot_weight=-1), "data.slot_weight", "-1 is outside [0, 1e+15]"),
    (_started(resources={"Cpus": 2, "Memory": 1e16}), "data.resources.Memory",
     "1e+16 is outside [0, 1e+15]"),
    (_started(resources={"Cpus": -2}), "data.resources.Cpus", "-2 is outside [0, 1000000000000000]"),
    # huge integers: beyond a ClassAd's 64 bits, anywhere, named down to the attribute
    (_started(slot_weight=10**30), "data.slot_weight",
     "1000000000000000000000000000000 is outside [0, 1e+15]"),
    (_started(resources={"Cpus": 1, "Deep": [[{"x": 10**30}]]}), "data.resources.Deep[0][0].x",
     "1000000000000000000000000000000 is outside [-9223372036854775808, 9223372036854775807]"),
    (_started(resources={"Cpus": 1, "Deep": [[[[[1]]]]]}), "data.resources.Deep[0][0][0][0]",
     "nested deeper than 4 levels"),
    # non-finite: 1e999 parses to infinity, which no field takes
    (_started().replace(b'"slot_weight":1.0', b'"slot_weight":1e999'), "data.slot_weight",
     "inf is not a finite number"),
    (_started(concurrency_limits="big:1e999"), "data.concurrency_limits",
     "'big:1e999': the increment inf is not a finite number"),
])
def test_msgspec_refusals_name_event_type_field_and_value(raw: bytes, field: str, reason: str) -> None:
    err = _refusal(raw)
    assert (err.event_id, err.event_type, err.field, err.reason) == (
        "schedd@ap1:7", "job.started", field, reason)
    assert str(err) == f"event 'schedd@ap1:7', type 'job.started', field '{field}': {reason}"


def test_msgspec_refusals_of_envelopes_and_other_types() -> None:
    def refused(data: dict[str, object], **env: object) -> tuple[object, ...]:
        err = _refusal(msgspec.json.encode({"id": "a:1", "type": "admin.command", "v": 1, "ts": 1,
                                            "source": "a", "seq": 1, "data": data, **env}))
        return err.event_id, err.event_type, err.field, err.reason

    ok = {"op": "setfactor", "target": "alice@example.org"}
    assert refused(ok, seq=10**30) == ("a:1", "admin.command", "seq", "must be an integer")
    assert refused(ok, v=0) == ("a:1", "admin.command", "v", "must be a positive integer")
    assert refused(ok, v=3) == ("a:1", "admin.command", "v",  # v2: claimed_by (issue 28)
                                "version 3 is newer than this reader's 2")
    assert refused(ok, ts=-5) == ("a:1", "admin.command", "ts",
                                  "event time -5 is outside [0, 2.53402e+11]")
    assert refused(ok, id="") == (None, "admin.command", "id", "must be a non-empty string")
    assert refused(ok, type=5) == ("a:1", None, "type", "unknown event type")
    assert refused({**ok, "op": "explode"})[2:] == (
        "data.op", "'explode' is not one of " + ", ".join(ADMIN_OPS))
    assert refused({**ok, "duration": -4})[2:] == ("data.duration", "-4 is outside [0, 1e+15]")
    assert refused({**ok, "value": "1e999"})[2:] == (
        "data.value", "-setfactor: inf is not a finite number")
    assert refused({"op": "setfactor"})[2:] == ("data.target", "required field is missing")
    assert refused([1])[2:] == ("data", "payload must be a JSON object")  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [b"{", b"", b"\xff\xfe", b"[" * 5000 + b"]" * 5000,
                                 b'{"id":"a:1","ts":1e999'])
def test_malformed_json_is_one_error(raw: bytes) -> None:
    assert _refusal(raw).reason.startswith("not valid JSON: ")


def test_malformed_json_names_line_and_column() -> None:
    assert _refusal(b'{"id": "x\\ud800y"}').reason == (
        "not valid JSON: no low surrogate in string: line 1 column 10 (char 9)")


def test_not_an_object_and_payload_from_dict() -> None:
    assert str(_refusal(b"[1, 2]")) == "an event must be a JSON object"
    with pytest.raises(EventValidationError) as info:
        payload_from_dict("match", {"negotiator": "n", "cycle": "x"}, "sim:1")
    assert str(info.value) == ("event 'sim:1', type 'match', field 'data.cycle': "
                               "expected int, got str 'x'")


def test_events_are_frozen_structs_and_in_range_big_ints_roundtrip() -> None:
    env = make_event(AdUpdated("Machine", "slot1@ep1", {"Big": 2**63 - 1, "L": [[{"x": -2**63}]]}),
                     ts=1.0, source="s", seq=1)
    assert decode(encode(env)) == env and decode(encode(env)).data.ad["Big"] == 2**63 - 1
    with pytest.raises(AttributeError):
        env.data.name = "other"  # type: ignore[misc]
    assert msgspec.structs.replace(env.data, name="other").name == "other"


def test_encoding_is_orjsons_bytes() -> None:
    """The log's bytes (and so its digests) are orjson's: large floats keep their `e+`."""
    env = make_event(PriorityChanged("a@b", 1e16, 1e21, 1e37, "c:1"), ts=1.0, source="s", seq=1)
    raw = encode(env)
    assert raw == orjson.dumps(env.to_dict()) and b"1e+16" in raw and b"1e+37" in raw
    assert decode(raw) == env


def test_schema_carries_the_bounds_decode_enforces() -> None:
    """JSON Schema and decoding come from the same types: what one refuses, so does the other."""
    schema = json_schema(JobStarted)
    for raw in (_started(slot_weight=-1), _started(resources={"Cpus": 10**16}),
                _started().replace(b'"ts":1.0', b'"ts":1e308'), _started().replace(b'"v":1', b'"v":2')):
        _refusal(raw)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(orjson.loads(raw), schema)
    jsonschema.validate(orjson.loads(_started(resources={"Cpus": 2, "L": [{"x": 1}]})), schema)
