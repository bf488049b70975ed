"""A job queue sorted by columns (`_JobSorter.sort_queue`'s numpy path) must come out exactly
as the job-by-job path sorts it: same jobs in the same order, same shapes per job. The
queues below hit both the common case and every input that makes the column path step aside
(mixed value types, NaN, huge or float ids, absent ids, differing attribute names)."""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from services.negotiator import matchmaker

SIGNIFICANT = ("requestmemory", "requirements", "owner")


def queue(rng: random.Random, n: int, **change: Any) -> list[dict[str, Any]]:
    ads = []
    for p in range(n):
        ad: dict[str, Any] = {
            "ClusterId": 100 + rng.randrange(5), "ProcId": rng.randrange(50),
            "QDate": 1_700_000_000 + rng.randrange(3), "JobPrio": rng.randrange(-2, 3),
            "RequestMemory": rng.choice((1024, 2048)), "Owner": "u",
            "Requirements": "/Expr(TARGET.Memory >= RequestMemory)/"}
        for key, fn in change.items():
            v = fn(p)
            if v is matchmaker._ABSENT:
                ad.pop(key, None)
            else:
                ad[key] = v
        ads.append(ad)
    return ads


def by_job(ads: Sequence[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    sorter = matchmaker._JobSorter(SIGNIFICANT, "u@x", "schedd")
    for k, ad in enumerate(ads):
        sorter.add(k, ad)
    return sorter.ordered()


def by_columns(ads: Sequence[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    return matchmaker._JobSorter(SIGNIFICANT, "u@x", "schedd").sort_queue(ads)


def flat(out: tuple[list[Any], list[Any]]) -> list[tuple[Any, ...]]:
    """Each job with its shape's values (shape numbering may differ, grouping may not)."""
    jobs, shapes = out
    return [(j.job_id, j.schedd, j.cluster, j.limits, sorted(shapes[j.ac].items(), key=str))
            for j in jobs]


ABSENT = matchmaker._ABSENT
CASES: dict[str, dict[str, Any]] = {
    "common": {},
    "float prio and qdate": {"JobPrio": lambda p: p % 3 * 0.5, "QDate": lambda p: 1e9 + p % 2},
    "expert priorities": {"PreJobPrio1": lambda p: p % 2, "PostJobPrio2": lambda p: -(p % 3)},
    "no ids": {"ClusterId": lambda p: ABSENT, "ProcId": lambda p: ABSENT},
    "no proc id": {"ProcId": lambda p: ABSENT},
    "int and float memory": {"RequestMemory": lambda p: 1024 if p % 2 else 1024.0},
    "bool prio": {"JobPrio": lambda p: p % 2 == 0},
    "NaN prio": {"JobPrio": lambda p: float("nan") if p % 7 == 0 else 1},
    "huge cluster": {"ClusterId": lambda p: 2**60 + p % 3},
    "float cluster": {"ClusterId": lambda p: 100.0 + p % 3},
    "text prio": {"JobPrio": lambda p: "high"},
    "differing names": {"Extra": lambda p: 1 if p % 3 else ABSENT},
    "concurrency limits": {"ConcurrencyLimits": lambda p: "db"},
    "list value": {"Owner": lambda p: ["u"]},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_columns_sort_as_job_by_job(case: str) -> None:
    ads = queue(random.Random(case), 400, **CASES[case])
    assert flat(by_columns(ads)) == flat(by_job(ads))


def test_common_case_takes_the_column_path() -> None:
    """The bench's and a schedd's usual queue is sorted by columns (else this test file
    compares the job-by-job path with itself)."""
    sorter = matchmaker._JobSorter(SIGNIFICANT, "u@x", "schedd")
    assert sorter._columns(queue(random.Random(1), 50)) is not None
    assert sorter._columns(queue(random.Random(1), 50, **CASES["NaN prio"])) is None


def test_ad_values_usual_and_unusual_dicts() -> None:
    """`ad_values`' pass for the usual dict ad gives what its general loop gives: expression
    strings as ExprText, names lowered, the last of names alike but for case counting."""
    ExprText = matchmaker.ExprText
    assert matchmaker.ad_values({"Name": "slot1@h", "Cpus": 8, "Busy": False, "X": None,
                                 "Start": "/Expr(true)/", "Note": "/Expr(no"}) == {
        "name": "slot1@h", "cpus": 8, "busy": False, "x": None,
        "start": ExprText("true"), "note": "/Expr(no"}
    assert matchmaker.ad_values({"A": "/Expr(1 + 1)/", "a": 5}) == {"a": 5}
    assert matchmaker.ad_values({"a": 5, "A": "/Expr(1 + 1)/"}) == {"a": ExprText("1 + 1")}
    assert isinstance(matchmaker.ad_values({"L": [1, 2]})["l"], ExprText)
