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
