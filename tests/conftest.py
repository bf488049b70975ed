"""Shared pytest fixtures: real services for the tests that need them (no mocks, DESIGN.md).

Each service fixture is session-scoped and picks, in order: an address from the environment
(`KAFKA_BOOTSTRAP`, ...), a testcontainers container when a Docker engine answers, else the
local launcher under `compose/`. Add new services as another section following that pattern.
"""
from __future__ import annotations

import os
from typing import Any, Iterator

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


# --------------------------------------------------------------------------- elasticsearch / opensearch
# The integ-test zips from Maven Central run anywhere with a JDK (compose/search.py).


@pytest.fixture(scope="session")
def es_server() -> Iterator[Any]:
    """The session's own Elasticsearch (a compose.search.SearchServer), or None when `ES_URL`
    names an existing cluster; fault tests kill -9 and restart it through this object."""
    if os.environ.get("ES_URL"):
        yield None
        return
    from compose.search import SearchServer

    server = SearchServer("elasticsearch")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def es_url(es_server: Any) -> str:
    """URL of a real Elasticsearch 8.x for the whole session (mark users `elasticsearch`)."""
    return os.environ["ES_URL"] if es_server is None else str(es_server.url)


@pytest.fixture(scope="session")
def opensearch_url() -> Iterator[str]:
    """URL of a real OpenSearch 3.x for the whole session (mark users `opensearch`)."""
    if os.environ.get("OPENSEARCH_URL"):
        yield os.environ["OPENSEARCH_URL"]
        return
    from compose.search import SearchServer

    with SearchServer("opensearch") as url:
        yield url
