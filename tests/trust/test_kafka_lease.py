"""Issue 28 item 15 on Kafka: `GroupLease.fence()` with a real broker. A leader stopped
(SIGSTOP) past the group's session timeout loses partition 0 to the standby; resumed, its
next fenced append is refused (LeaseLostError) before it writes, and the standby's passes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from streams.log.kafka import KafkaLog
from streams.log.lease import LeaseLostError
from streams.log.port import TopicSpec

ROOT = Path(__file__).resolve().parents[2]

#: the leader: takes the lease, says so, then on each line of stdin tries a fenced append
LEADER = """
import sys
from streams.log.kafka import KafkaLog
from streams.log.lease import LeaseLostError
log = KafkaLog(sys.argv[1])
lease = log.lease(sys.argv[2], sys.argv[3])
while not lease.held():
    pass
print("held", flush=True)
for _line in sys.stdin:
    try:
        with lease.fence():
            log.append(sys.argv[3], [(None, b"leader", 1.0)])
        print("appended", flush=True)
    except LeaseLostError as exc:
        print(f"refused: {exc}", flush=True)
"""


def _until(what, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.kafka
def test_a_stopped_kafka_leader_is_fenced_when_it_resumes(kafka_bootstrap: str) -> None:
    topic, group = f"lease-{uuid.uuid4().hex[:8]}", f"lease-{uuid.uuid4().hex[:8]}"
    with KafkaLog(kafka_bootstrap) as log:
        log.create_topic(TopicSpec(topic, 1))
        leader = subprocess.Popen(
            [sys.executable, "-c", LEADER, kafka_bootstrap, group, topic], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        assert leader.stdin is not None and leader.stdout is not None
        standby = log.lease(group, topic)
        try:
            assert leader.stdout.readline().strip() == "held"
            leader.stdin.write("append\n")
            leader.stdin.flush()
            assert leader.stdout.readline().strip() == "appended"  # the holder's fence passes
            assert not standby.held()
            with pytest.raises(LeaseLostError, match="assigned to another member"):
                with standby.fence():
                    pytest.fail("the standby's fenced block ran while the leader held the lease")
            os.kill(leader.pid, signal.SIGSTOP)
            _until(standby.held)  # after the session timeout (6 s) the standby holds it
            with standby.fence():
                log.append(topic, [(None, b"standby", 1.0)])
            os.kill(leader.pid, signal.SIGCONT)
            leader.stdin.write("append\n")
            leader.stdin.flush()
            line = leader.stdout.readline().strip()
            assert line.startswith("refused: ") and "assigned to another member" in line, line
            assert standby.held()
        finally:
            standby.release()
            os.kill(leader.pid, signal.SIGCONT)
            leader.kill()
            leader.wait()
        values = [r.value for r in log.read(topic, 0, 0, 10)]
    assert values == [b"leader", b"standby"]  # the resumed leader appended nothing
