"""streams.gcpolicy: the runners' collector settings for a long fold."""
from __future__ import annotations

import gc

from streams.gcpolicy import FOLD_THRESHOLD, long_fold


def test_long_fold_tunes_the_collector_and_restores_it() -> None:
    before = gc.get_threshold()
    with long_fold():
        assert gc.get_threshold() == FOLD_THRESHOLD and gc.get_freeze_count() > 0
        with long_fold():
            pass
        assert gc.get_threshold() == FOLD_THRESHOLD  # an inner fold leaves the outer's alone
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
