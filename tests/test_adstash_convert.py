"""adstash's conversion without a cluster: expressions are evaluated in a sub-ad of the
attributes they name, which must give exactly what the whole ad gives."""
from __future__ import annotations

from adstash.convert import to_doc

AD = {"GlobalJobId": "ap1#1.0#100", "ClusterId": 1, "ProcId": 0, "JobStatus": 4,
      "CompletionDate": 200, "memoryusage": 4096, "Baz": 5, "Unrelated": 7,
      "RequestMemory": "/Expr(ifthenelse(MemoryUsage =!= undefined, "
                       "MAX({ 2048, MemoryUsage * 3 / 2 }), 2048))/",
      "Foo": "/Expr(Bar + 1)/", "Bar": "/Expr(baz * 2)/",
      "ViaEval": "/Expr(eval(strcat(\"Unrel\", \"ated\")) + 1)/",
      "Requirements": "/Expr(TARGET.Memory >= RequestMemory && MY.Baz > 1)/",
      "Nothing": None}


def test_expressions_evaluate_as_in_the_whole_ad() -> None:
    doc = to_doc(AD, fallback_time=0)
    assert doc is not None
    assert doc["RequestMemory"] == 6144          # a literal named in another case
    assert doc["foo"] == "11"                    # a chain of expressions (unknown: a string)
    assert doc["viaeval"] == "8"                 # eval() of a computed name: the whole ad
    assert doc["Requirements_EXPR"] == "TARGET.Memory >= RequestMemory && MY.Baz > 1"
    assert doc["nothing_EXPR"] == "undefined"
    assert doc["MemoryUsage"] == 4096 and doc["RecordTime"] == 200


def test_an_expression_naming_no_attribute_of_the_ad() -> None:
    doc = to_doc({**AD, "Foo": "/Expr(Missing + 1)/"}, fallback_time=0)
    assert doc is not None and doc["foo_EXPR"] == "Missing + 1"


def test_literals_are_cast_as_the_generic_cast_does() -> None:
    """The inline casts of plain literals give what `_typed` (adstash's casts) gives, for every
    kind of field and hostile values (64-bit edges, zero dates, long strings, wrong types)."""
    from adstash import convert

    attrs = ["Owner", "Cmd", "RemoteWallClockTime", "RequestMemory", "ImageSize",
             "WantDocker", "IsNoopJob", "QDate", "JobCurrentStartDate", "TransferInputStats",
             "SomeOtherAttr"]
    values: list[object] = [0, 1, -1, 2**63 - 1, 2**63, -2**63, -2**63 - 1, 1.5, -0.0, 0.0,
                            True, False, "", "x", "x" * 300, "lots", 1e300]
    for attr in attrs:
        key, kind = convert._plan(attr)
        for value in values:
            ad = {"GlobalJobId": "ap1#1.0#100", "JobStatus": 4, "CompletionDate": 100,
                  attr: value}
            doc = to_doc(ad, fallback_time=0)
            assert doc is not None
            got = {k: v for k, v in doc.items() if k in (key, f"{key}_STRING")}
            typed = convert._typed(key, kind, value)
            want = {} if typed is None else {typed[0]: convert._cut(typed[1])}
            assert got == want and [type(v) for v in got.values()] == [
                type(v) for v in want.values()], (attr, value)


def test_a_memoized_expression_equals_a_fresh_evaluation() -> None:
    """Expressions are memoized by their text and the typed values they name: 1, 1.0 and
    true (equal in Python) and 0.0/-0.0 still give their own answers; time() is never kept."""
    from adstash import convert

    ads = [{"GlobalJobId": f"ap1#1.{k}#100", "JobStatus": 4, "CompletionDate": 100,
            "Foo": "/Expr(X * 2)/", "Bar": "/Expr(1.0 / Y)/", "X": x, "Y": y}
           for k, (x, y) in enumerate([(1, 0.0), (1.0, -0.0), (True, 0.0), (1, -0.0),
                                       (1, 0.0), ("a", 2)])]
    ads.append({"GlobalJobId": "ap1#2.0#100", "JobStatus": 4, "CompletionDate": 100,
                "Now": "/Expr(time())/"})
    memoized = [to_doc(ad, fallback_time=0) for ad in ads]
    memoized += [to_doc(ad, fallback_time=0) for ad in ads]  # the second pass hits the memo
    fresh = []
    for ad in ads * 2:
        convert._MEMO.clear()
        fresh.append(to_doc(ad, fallback_time=0))
    assert memoized == fresh
    first, second = memoized[0], memoized[1]
    assert first is not None and second is not None
    assert first["foo"] == "2" and second["foo"] == "2.0"
    assert "bar_EXPR" in first and second["bar"] == "-inf"  # 1.0/0.0, 1.0/-0.0
    assert not any("time" in k for key in convert._MEMO for k in key if isinstance(k, str)
                   and k.startswith("/Expr"))
