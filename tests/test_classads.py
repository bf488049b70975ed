"""schemas.classads: strict parsing with file:line errors, lossless JSON form, MY/TARGET evaluation."""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import classad2
import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from schemas.classads import (
    ERROR, UNDEFINED, ClassAd, ExprTree, ad_from_json, ad_to_json, ad_to_json_bytes, compile_expr,
    evaluate, is_expr_json, matches, parse_ad, parse_history, parse_json_ads, parse_status_dump, rank,
    symmetric_match,
)
from schemas.errors import ClassAdError

DATA = Path(__file__).parent / "data"


# --- parsing ---------------------------------------------------------------------------


def test_parse_ad_new_and_old_style_agree() -> None:
    new = parse_ad('[ Owner = "x"; Cpus = 2; Requirements = TARGET.Memory > 1024 ]')
    old = parse_ad('Owner = "x"\nCpus = 2\nRequirements = TARGET.Memory > 1024\n')
    assert new == old
    assert new["Cpus"] == 2 and isinstance(new["Requirements"], ExprTree)


@pytest.mark.parametrize("text, line, words", [
    ('[\n a = 1;\n b = ;\n c = 2\n]', 3, "attribute b"),
    ('[\n a = 1;\n\n b = (1 + ]', 4, "attribute b"),
    ('[ a = 1 ]\n; b = 2 ]', 2, "after the closing"),  # classad2 alone would ignore this
    ('[ a = 1;\n b = "unterminated ]', 2, "attribute b"),
])
def test_parse_ad_new_style_error_names_line(text: str, line: int, words: str) -> None:
    with pytest.raises(ClassAdError) as exc:
        parse_ad(text, path="job.ad")
    assert exc.value.path == "job.ad" and exc.value.line == line
    assert words in str(exc.value) and str(exc.value).startswith(f"job.ad:{line}:")


@pytest.mark.parametrize("text, line", [
    ("A = 1\nB = 1 +\nC = 3\n", 2),
    ("A = 1\nB = 1; X = 2\n", 2),     # classad2's old parser silently drops X
    ("A = 1\n\nnot an attribute\n", 3),
    ("A = 1\n9x = 3\n", 2),
])
def test_parse_ad_old_style_error_names_line(text: str, line: int) -> None:
    with pytest.raises(ClassAdError) as exc:
        parse_ad(text, path="f")
    assert (exc.value.path, exc.value.line) == ("f", line)


def test_parse_ad_keeps_strings_with_semicolons_and_brackets() -> None:
    ad = parse_ad('[ a = "x;]\\"y"; b = { [ c = 1; d = "]" ], 2 }; e = x[1] ]')
    assert ad["a"] == 'x;]"y'
    assert ad["b"][0]["d"] == "]"


def test_parse_history_file() -> None:
    ads = list(parse_history(DATA / "history.sample"))
    assert [(a["ClusterId"], a["ProcId"]) for a in ads] == [(101, 0), (101, 1), (102, 0)]
    first = ads[0]
    # old ClassAd syntax: `\"` is a quote, every other backslash is literal; the file says
    # `C:\\tmp`, which is two backslashes (the new syntax's escapes read one: issue 25 item 11)
    assert first["Args"] == '--input "data set.txt" C:\\\\tmp'
    assert first["RemoteWallClockTime"] == 3600.0 and isinstance(first["RemoteWallClockTime"], float)
    assert first["TransferInputStats"]["CedarFilesCount"] == 2
    assert isinstance(first["RequestMemory"], ExprTree)
    assert first["WantCheckpoint"] is False
    assert ads[2]["Undef"] is UNDEFINED
    # path given as text works too, the banner line is not an attribute
    assert len(list(parse_history((DATA / "history.sample").read_text()))) == 3
    assert "CompletionDate" not in ads[1] or ads[1]["CompletionDate"] == 0


@pytest.mark.parametrize("line, value", [
    ('Iwd = "C:\\Users\\x\\test"', "C:\\Users\\x\\test"),          # no \U, \x, \t escapes
    ('Regex = "^\\d+$"', "^\\d+$"),
    ('TransferInput = "C:\\data\\in\\"', "C:\\data\\in\\"),   # ends in a backslash
    ('Args = "say \\"hi\\" to C:\\"', 'say "hi" to C:\\'),  # \" inside, \ at the end
    ('Cmd = "a\\\\b"', "a\\\\b"),                          # two backslashes stay two
    ('Names = { "C:\\x\\", "y" }', None),                     # \" then more text: a quote
    ("Tab = \"a\tb\"", "a\tb"),                                # a real tab character
])
def test_old_syntax_strings_read_as_htcondor_reads_them(line: str, value: str | None) -> None:
    """History files, condor_status -l and ClassAd logs are old syntax: the value is what
    HTCondor's old-syntax parser (classad2's ParserType.Old) reads, not the new escapes."""
    reference = classad2.parseOne(line, classad2.ParserType.Old)
    name = line.split(" = ")[0]
    if value is None:  # HTCondor reads `"C:\x\", "` as one string: the line does not parse
        assert name not in reference
        with pytest.raises(ClassAdError):
            parse_ad(line + "\n", path="h")
        return
    assert reference[name] == value
    ad = parse_ad(line + "\n")
    assert ad[name] == value
    banner = f"ClusterId = 1\n{line}\nProcId = 0\n*** Offset = 0 ClusterId = 1 ProcId = 0\n"
    [job] = parse_history(banner)  # a trailing backslash no longer dead-letters the job
    assert job[name] == value and job["ProcId"] == 0


@given(st.text(alphabet='ab\\" \t/$x', max_size=12))
@settings(max_examples=300, deadline=None)
def test_old_syntax_agrees_with_classad2_old_parser(text: str) -> None:
    """Any string as HTCondor writes it in old syntax (only `"` escaped) reads back as
    classad2's old-syntax parser reads it."""
    line = 'A = "' + text.replace('"', '\\"') + '"'
    reference = classad2.parseOne(line, classad2.ParserType.Old).get("A")
    try:
        mine = parse_ad(line + "\n").get("A")
    except ClassAdError:
        mine = None
    assert mine == reference


def test_parse_history_malformed_line_is_file_and_line() -> None:
    path = DATA / "history.bad"
    with pytest.raises(ClassAdError) as exc:
        list(parse_history(path))
    assert exc.value.path == str(path) and exc.value.line == 7
    assert f"{path}:7" in str(exc.value) and "Requirements" in str(exc.value)


def test_parse_history_on_error_goes_on() -> None:
    bad: list[tuple[ClassAdError, str]] = []
    ads = list(parse_history(DATA / "history.bad", on_error=lambda e, raw: bad.append((e, raw))))
    assert [a["ClusterId"] for a in ads] == [101, 103]
    assert len(bad) == 1 and bad[0][0].line == 7 and "ClusterId = 102" in bad[0][1]


def test_parse_status_dump() -> None:
    ads = list(parse_status_dump(DATA / "status.sample"))
    assert [a["Name"] for a in ads] == ["slot1@ep7.example.org", "slot1_1@ep8.example.org"]
    assert ads[0]["PartitionableSlot"] is True and ads[1]["ChildCpus"] == [1, 1]
    assert ads[0].eval("SlotWeight") == 4


def test_parse_status_dump_malformed_line() -> None:
    path = DATA / "status.bad"
    with pytest.raises(ClassAdError) as exc:
        list(parse_status_dump(path))
    assert (exc.value.path, exc.value.line) == (str(path), 7)


def test_parse_text_names_string_source() -> None:
    with pytest.raises(ClassAdError) as exc:
        list(parse_status_dump("A = 1\n\nB = (\n"))
    assert (exc.value.path, exc.value.line) == ("<string>", 3)


def test_parse_json_ads() -> None:
    ads = parse_json_ads('[{"a": 1, "r": "\\/Expr(TARGET.x + 1)\\/"}, {"b": 2.0}]')
    assert ads[0]["a"] == 1 and str(ads[0]["r"]) == "TARGET.x + 1" and ads[1]["b"] == 2.0
    with pytest.raises(ClassAdError):
        parse_json_ads("[{]")


# --- the JSON form ---------------------------------------------------------------------


def _roundtrip(ad: ClassAd) -> ClassAd:
    return ad_from_json(orjson.loads(ad_to_json_bytes(ad)))


def test_json_form_matches_printjson_and_roundtrips() -> None:
    ad = parse_ad('[ i = 3; r = 3.0; big = 9223372036854775807; neg = -0.5; t = true; f = false;'
                  ' s = "say \\"hi\\" \\\\ back"; l = { 1, 2.5, "x", { true, undefined } };'
                  ' n = [ m = [ k = TARGET.Cpus * 2 ]; z = error ]; e = MY.Memory > 1024;'
                  ' u = undefined; err = error; when = absTime("2020-01-01T00:00:00Z") ]')
    doc = ad_to_json(ad)
    assert doc["i"] == 3 and isinstance(doc["i"], int)
    assert doc["r"] == 3.0 and isinstance(doc["r"], float)
    assert doc["t"] is True and doc["u"] is None and doc["err"] == "/Expr(error)/"
    assert doc["e"] == "/Expr(MY.Memory > 1024)/"
    assert doc["n"]["m"]["k"] == "/Expr(TARGET.Cpus * 2)/"
    assert doc["l"] == [1, 2.5, "x", [True, None]]
    assert doc == orjson.loads(ad.printJson())  # same as HTCondor's own printJson
    back = _roundtrip(ad)
    assert back == ad
    assert isinstance(back["r"], float) and isinstance(back["i"], int)
    assert back["err"] is ERROR and back["u"] is UNDEFINED
    assert back["when"] == datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)


def test_literal_string_that_looks_like_an_expression_stays_a_string() -> None:
    ad = ClassAd({"s": "/Expr(x)/", "l": ["/Expr(y)/"], "n": {"z": "/Expr(1)/"}})
    doc = ad_to_json(ad)
    assert is_expr_json(doc["s"])
    back = ad_from_json(doc)
    assert back["s"] == "/Expr(x)/" and back["l"] == ["/Expr(y)/"] and back["n"]["z"] == "/Expr(1)/"


def test_ad_from_json_bad_expression_names_attribute() -> None:
    with pytest.raises(ClassAdError, match=r"outer\.inner: cannot parse"):
        ad_from_json({"outer": {"inner": "/Expr(1 +)/"}})
    with pytest.raises(ClassAdError, match="smuggle"):
        ad_from_json({"smuggle": "/Expr(1; x = 2)/"})


_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12) | st.sampled_from(
    ['"', "\\", '\\"', "a\\\\b", "/Expr(x)/", "", "semi;colon ]"])
_exprs = st.sampled_from(["TARGET.Memory > 1024", "MY.Cpus * 2 + 1", 'Owner == "x"', "error",
                          "ifThenElse(isUndefined(x), 1, 2.5)", "{ a, b }", "[ q = r ]", "relTime(5)"])
_leaf = (st.integers(min_value=-2**63, max_value=2**63 - 1) | st.booleans() | _text | st.none()
         | st.floats(allow_nan=False, allow_infinity=False) | _exprs.map(lambda s: f"/Expr({s})/"))


def _unique_ci(d: dict[str, Any]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in d.items():
        if k.lower() not in {s.lower() for s in seen}:
            seen[k] = v
    return seen


_docs = st.recursive(
    _leaf,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_names, kids, max_size=4).map(_unique_ci),
    max_leaves=20)
_top = st.dictionaries(_names, _docs, max_size=8).map(_unique_ci)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_top)
def test_json_roundtrip_property(doc: dict[str, Any]) -> None:
    ad = ad_from_json(doc)
    first = ad_to_json(ad)
    back = ad_from_json(orjson.loads(orjson.dumps(first)))
    assert back == ad
    assert ad_to_json(back) == first
    for key, value in doc.items():  # literal types survive: ints stay ints, reals reals
        if isinstance(value, (bool, int, float, str)) and not is_expr_json(value):
            got = back[key]
            assert type(got) is type(value) and got == value


# --- evaluation ------------------------------------------------------------------------


JOB = ClassAd({"RequestMemory": 2048, "Owner": "einstein", "Rank": ExprTree("TARGET.Memory / 1024"),
               "Requirements": ExprTree("TARGET.Memory >= MY.RequestMemory")})
SLOT = ClassAd({"Memory": 8192, "Cpus": 4, "Rank": ExprTree('TARGET.Owner == "einstein"'),
                "Requirements": ExprTree('TARGET.Owner != "mallory"')})


def test_evaluate_my_and_target() -> None:
    assert evaluate("MY.Memory - TARGET.RequestMemory", SLOT, JOB) == 6144
    assert evaluate("TARGET.Memory - MY.RequestMemory", JOB, SLOT) == 6144
    assert evaluate("Memory", JOB, SLOT) == 8192        # unscoped: MY first, then TARGET
    assert evaluate("TARGET.Memory", JOB, None) is UNDEFINED
    assert evaluate("1/0") is ERROR
    assert evaluate("RequestMemory * 2", {"RequestMemory": 3}) == 6   # plain dicts are ads
    assert evaluate(compile_expr("MY.Cpus"), SLOT) == 4


def test_matching_and_rank() -> None:
    assert matches(JOB, SLOT) and matches(SLOT, JOB)
    assert symmetric_match(JOB, SLOT)
    small = ClassAd({"Memory": 1024, "Requirements": True})
    assert matches(small, JOB) and not symmetric_match(JOB, small)
    mallory = ClassAd({"Owner": "mallory", "RequestMemory": 1, "Requirements": True})
    assert not symmetric_match(SLOT, mallory)
    assert rank(JOB, SLOT) == 8.0 and rank(SLOT, JOB) == 1.0
    assert rank(JOB, None) == 0.0 and rank(ClassAd(), SLOT) == 0.0


def test_compile_cache_and_strictness() -> None:
    assert compile_expr("TARGET.Cpus > 1") is compile_expr("TARGET.Cpus > 1")
    for bad in ["1; x = 2", "1 ] junk", "1 +", "", "(1"]:
        with pytest.raises(ClassAdError):
            compile_expr(bad)
    assert compile_expr("1 // comment") is not None
    assert isinstance(classad2.ExprTree("1"), ExprTree)
