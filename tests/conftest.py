"""Shared pytest fixtures: real services for the tests that need them (no mocks, DESIGN.md).

Each service fixture is session-scoped and picks, in order: an address from the environment
(`KAFKA_BOOTSTRAP`, ...), a testcontainers container when a Docker engine answers, else the
local launcher under `compose/`. Add new services as another section following that pattern.
"""
from __future__ import annotations

import os
from typing import Iterator

import pytest

# --------------------------------------------------------------------------- docker


def docker_available() -> bool:
    """Whether a Docker engine answers within a second (laptops yes, CI machines no)."""
    try:
        import docker

        client = docker.from_env(timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no daemon: all mean "use the launcher"
        return False


# --------------------------------------------------------------------------- kafka

KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"  # Confluent Platform 7.9 = Apache Kafka 3.9


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """`host:port` of a real Kafka broker for the whole session (mark users `kafka`)."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
    elif docker_available():
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer(KAFKA_IMAGE).with_kraft() as container:
            yield container.get_bootstrap_server()
    else:
        from compose.kafka import KafkaServer

        with KafkaServer() as bootstrap:
            yield bootstrap
