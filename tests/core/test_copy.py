"""The records whose __init__ is written out (compiled, not @dataclass's) copy and pickle:
the compiled class's __new__ runs __init__, so they rebuild through `__reduce__`
(`Ledger.priorities_at_cycle` deep-copies the accountant, match records included)."""
from __future__ import annotations

import copy
import pickle

from streams.core.accountant import ResourceMatch
from streams.core.collector import AdRecord
from streams.core.outcomes import JobOutcomes


def test_records_deep_copy_and_pickle_equal_and_unshared() -> None:
    ad = AdRecord("Machine", "slot1@ep1", {"Cpus": 4, "Tags": ["a"]}, 1.0, 3601.0,
                  source="startd@ep1", weight=4.0)
    records: list[object] = [ResourceMatch("slot1@ep1", "1.0", "u@x", "group_a", 2.0, 100.0, "db:2"),
               JobOutcomes("1.0", "schedd@ap1", "u@x", 5.0, outcomes={"not offered": 2},
                           match={"slot": "slot1@ep1"}, synced=3), ad]
    for rec in records:
        for twin in (copy.deepcopy(rec), pickle.loads(pickle.dumps(rec)), copy.copy(rec)):
            assert twin == rec and twin is not rec
    deep = copy.deepcopy(ad)
    assert deep.ad is not ad.ad
    deep.ad["Tags"].append("b")
    assert ad.ad["Tags"] == ["a"]
