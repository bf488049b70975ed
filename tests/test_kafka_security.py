"""A secured broker (issue 10, reproduction 7): on the launcher's SASL/SCRAM + ACL broker an
unauthenticated producer is refused on the events topic, an authenticated principal without
an ACL is refused, and the admins' principal (ACL) and the pipeline (super user) are
accepted — through the same log adapter and CLI knobs users run."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaError

from compose.kafka import KafkaSecurity, KafkaServer
from schemas.events import AdminCommanded, make_event
from streams.log.events import EventLog, open_log
from streams.log.kafka import SaslLogin
from streams.log.port import LogError, TopicSpec
from streams.log.topics import EVENTS

pytestmark = pytest.mark.kafka

PIPELINE, ADMIN, INTRUDER = "pipeline", "poolledger-admin", "intruder"


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple[KafkaServer, KafkaSecurity]]:
    security = KafkaSecurity({PIPELINE: secrets.token_hex(12), ADMIN: secrets.token_hex(12),
                              INTRUDER: secrets.token_hex(12)}, PIPELINE)
    server = KafkaServer(security=security, heap="512m")
    server.start()
    try:
        pipeline = open_log(f"kafka://{server.bootstrap}", Path("."),
                            SaslLogin("SCRAM-SHA-512", PIPELINE, security.users[PIPELINE]))
        try:
            pipeline.create_topic(TopicSpec(EVENTS, 1))
        finally:
            pipeline.close()
        server.grant(ADMIN, EVENTS)  # the admins may append edits, nothing else
        yield server, security
    finally:
        server.stop()


def _edit(by: str) -> list:  # type: ignore[type-arg]
    return [make_event(AdminCommanded("setfactor", "alice@example.org", 5.0, by, "test"),
                       ts=time.time(), source="userprio@test", seq=0, id=f"userprio@test:{by}")]


def test_unauthenticated_producer_is_refused(secured: tuple[KafkaServer, KafkaSecurity]) -> None:
    server, _ = secured
    with pytest.raises(KafkaError):
        producer = KafkaProducer(bootstrap_servers=server.bootstrap, max_block_ms=5000,
                                 request_timeout_ms=5000)
        try:
            producer.send(EVENTS, b'{"anonymous": true}').get(timeout=5)
        finally:
            producer.close(timeout=1)
    with pytest.raises(LogError):  # through the adapter too, as one LogError
        anonymous = open_log(f"kafka://{server.bootstrap}", Path("."))
        try:
            EventLog(anonymous).append(EVENTS, _edit("anonymous"))
        finally:
            anonymous.close()


def test_authenticated_without_acl_is_refused_and_admin_accepted(
        secured: tuple[KafkaServer, KafkaSecurity]) -> None:
    server, security = secured
    url = f"kafka://{server.bootstrap}"
    intruder = open_log(url, Path("."), SaslLogin("SCRAM-SHA-512", INTRUDER,
                                                  security.users[INTRUDER]))
    try:
        with pytest.raises(LogError, match="permission denied"):
            EventLog(intruder).append(EVENTS, _edit(INTRUDER))
    finally:
        intruder.close()
    admin = open_log(url, Path("."), SaslLogin("SCRAM-SHA-512", ADMIN, security.users[ADMIN]))
    try:
        EventLog(admin).append(EVENTS, _edit(ADMIN))
    finally:
        admin.close()
    pipeline = open_log(url, Path("."), SaslLogin("SCRAM-SHA-512", PIPELINE,
                                                  security.users[PIPELINE]))
    try:
        seen = [env.data.by for _r, env in EventLog(pipeline).read(EVENTS)]  # type: ignore[attr-defined]
    finally:
        pipeline.close()
    assert ADMIN in seen and INTRUDER not in seen and "anonymous" not in seen


def test_cli_takes_sasl_from_knobs_and_never_prints_the_password(
        secured: tuple[KafkaServer, KafkaSecurity], tmp_path: Path) -> None:
    server, security = secured
    password = security.users[PIPELINE]
    env = {**os.environ, "POOLLEDGER_BROKER": f"kafka://{server.bootstrap}",
           "POOLLEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "POOLLEDGER_KAFKA_USER": PIPELINE,
           "POOLLEDGER_KAFKA_PASSWORD": password, "POOLLEDGER_HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "services.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    info = cli("log", "info")
    assert info.returncode == 0, info.stderr
    assert EVENTS in info.stdout
    shown = cli("config", "show", "POOLLEDGER_KAFKA_PASSWORD")
    assert shown.returncode == 0 and "POOLLEDGER_KAFKA_PASSWORD = <hidden>" in shown.stdout
    every = cli("config", "show")
    for res in (info, shown, every):
        assert password not in res.stdout + res.stderr
    env["POOLLEDGER_KAFKA_PASSWORD"] = "wrong"
    wrong = cli("log", "info")
    assert wrong.returncode != 0  # a wrong password is refused (one line: services/cli.py's)
    assert "wrong" not in wrong.stdout + wrong.stderr


def test_faust_worker_takes_sasl_from_knobs(secured: tuple[KafkaServer, KafkaSecurity],
                                            tmp_path: Path) -> None:
    """The faust worker authenticates with the POOLLEDGER_KAFKA_* knobs like the other Kafka
    clients: on the secured broker it folds an edit, and its tables read back with the login."""
    from schemas.settings import load_settings
    from streams.faust_adapter import read_state

    server, security = secured
    login = SaslLogin("SCRAM-SHA-512", PIPELINE, security.users[PIPELINE])
    app_id = f"pl-sasl-{secrets.token_hex(4)}"
    topic = f"{app_id}.events"
    pipeline = open_log(f"kafka://{server.bootstrap}", Path("."), login)
    try:
        pipeline.create_topic(TopicSpec(topic, 1))
        EventLog(pipeline).append(topic, _edit(PIPELINE))
    finally:
        pipeline.close()
    env = {**os.environ, "POOLLEDGER_BROKER": f"kafka://{server.bootstrap}",
           "POOLLEDGER_FAUST_APP": app_id, "POOLLEDGER_EVENTS_TOPIC": topic,
           "POOLLEDGER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "POOLLEDGER_KAFKA_USER": PIPELINE,
           "POOLLEDGER_KAFKA_PASSWORD": security.users[PIPELINE], "POOLLEDGER_HOME": str(tmp_path)}
    with open(tmp_path / "worker.log", "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "streams.faust_app", "worker", "-l", "warn"],
                                  env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline, state = time.monotonic() + 120, None
            while time.monotonic() < deadline and worker.poll() is None:
                state = read_state(server.bootstrap, load_settings(env={}), app_id, sasl=login)
                if state is not None and state.applied:
                    break
                time.sleep(1.0)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    assert state is not None and state.applied == 1, (tmp_path / "worker.log").read_text()
