"""A follower on Kafka: no transaction spans the append and the position, so a crash between
them appends the same events again on restart, with the same ids, which the ledger drops."""
from __future__ import annotations

from pathlib import Path

import pytest

from services.follow import base
from services.follow.eventlog import JobEventLogFollower
from streams.core.ledger import Dedup
from streams.log.events import EventLog, ensure_topics, open_log
from streams.log.topics import EVENTS
from tests.follow.helpers import job_lifecycle

pytestmark = pytest.mark.kafka


class _CrashError(Exception):
    pass


def test_crash_between_append_and_position_repeats_ids(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, home = tmp_path / "EventLog", tmp_path / "home"
    path.write_text(job_lifecycle(1) + job_lifecycle(2))
    log = open_log(f"kafka://{kafka_bootstrap}", home)
    ensure_topics(log)
    elog = EventLog(log)
    name = f"kafka-{tmp_path.name}"

    def follower() -> JobEventLogFollower:
        return JobEventLogFollower(elog, path, name=name, home=home, schedd="ap1",
                                   uid_domain="example.org")

    f = follower()
    f.poll()  # the first poll stores the file's identity, then reads: 6 events

    def crash(*_: object, **__: object) -> None:
        raise _CrashError

    with open(path, "a") as out:
        out.write(job_lifecycle(3))
    monkeypatch.setattr(base, "atomic_file", crash)  # dies after the append, before the position
    with pytest.raises(_CrashError):
        follower().poll()
    monkeypatch.undo()
    follower().poll()  # restarted: reads job 3 again from the stored position
    mine = [env for _, env in elog.read(EVENTS) if env.source == f"eventlog@{name}"]
    assert len(mine) == 12  # job 3's three events are on the topic twice...
    dedup = Dedup()
    fresh = [env for env in mine if not dedup.seen(env)]
    assert len(fresh) == 9  # ...with the same ids: the ledger folds each once
    assert [e.data.job_id for e in fresh] == ["1001.0"] * 3 + ["1002.0"] * 3 + ["1003.0"] * 3
    assert (home / "follow").is_dir()
    log.close()
