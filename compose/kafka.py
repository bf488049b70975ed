"""Run a real Apache Kafka broker (KRaft, single node, loopback) without Docker.

Development machines and CI have Java and Maven but no Docker engine, so the broker is
resolved from Maven Central (`org.apache.kafka:kafka_2.13` plus its runtime dependencies),
cached, and started as a child JVM. Two ways to use it:

* `KafkaServer` — in-process owner (tests, benchmarks): `start()` returns the bootstrap
  address, `stop()` (or leaving the `with` block) kills the broker and removes a temp dir.
* `start_service(home)` / `stop_service(home)` — a detached broker that outlives the
  process that started it (CLI); its pid and port live in `<home>/services/kafka.json`.

`python -m compose.kafka start|stop|status` wraps the service functions.

Secured mode (`KafkaServer(security=KafkaSecurity(...))`): clients authenticate with
SASL/SCRAM-SHA-512 (credentials written into the KRaft metadata at format time, `kafka-storage
format --add-scram`), the StandardAuthorizer checks ACLs, and the pipeline's principal is the
only super user; `grant` adds ACLs for other principals (e.g. the admins' CLI). The controller
listener uses SASL/PLAIN with the pipeline's credentials (KRaft controllers cannot read SCRAM
credentials before the metadata log is up), so no listener admits an anonymous client.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Mapping

KAFKA_VERSION = "3.9.1"
SCALA_VERSION = "2.13"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
STATE_FILE = "kafka.json"
_MAIN_CLASS = "kafka.Kafka"


class KafkaLauncherError(Exception):
    """The broker could not be resolved, started or stopped."""


# --------------------------------------------------------------------------- locations


def poolledger_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The PoolLedger home (`$POOLLEDGER_HOME`, default the POOLLEDGER_HOME knob's `out`),
    made absolute: the launchers start their daemons in `<home>/services/<svc>` and hand
    them paths, which a relative home would resolve from there instead of from here."""
    if home is not None:
        return Path(home).expanduser().absolute()
    from schemas.knobs import find_knob

    knob = find_knob("POOLLEDGER_HOME")
    default = knob.default if knob is not None else "out"
    return Path(os.environ.get("POOLLEDGER_HOME", default)).expanduser().absolute()


def cache_root() -> Path:
    """Where downloaded distributions are kept (`$POOLLEDGER_CACHE` or the XDG cache)."""
    if "POOLLEDGER_CACHE" in os.environ:
        return Path(os.environ["POOLLEDGER_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "poolledger"


def _java() -> str:
    """The Java 17+ launcher: `$POOLLEDGER_JAVA`, `$JAVA_HOME/bin/java`, else `java` on PATH."""
    if "POOLLEDGER_JAVA" in os.environ:
        return os.environ["POOLLEDGER_JAVA"]
    if "JAVA_HOME" in os.environ:
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("java")
    if not found:
        raise KafkaLauncherError("no `java` found: install a JDK 17+ or set POOLLEDGER_JAVA")
    return found


# --------------------------------------------------------------------------- resolution

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>poolledger.local</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{version}</version>
    </dependency>
    <!-- the broker logs through SLF4J; Kafka 3.x ships reload4j as its backend -->
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>1.7.36</version>
    </dependency>
  </dependencies>
</project>
"""


def resolve_kafka(version: str = KAFKA_VERSION, *, mvn: str = "mvn", timeout: float = 1200.0) -> Path:
    """Return a directory holding the broker's jars, resolving them with Maven if needed.

    The jar set is cached under `cache_root()/kafka-<version>/libs` and marked complete only
    after Maven succeeded, so an interrupted download is retried. Maven runs offline first
    (everything may already be in ~/.m2) and goes online only if that fails.
    """
    base = cache_root() / f"kafka-{version}"
    libs = base / "libs"
    marker = libs / ".complete"
    if marker.exists():
        return libs
    if shutil.which(mvn) is None:
        raise KafkaLauncherError(f"`{mvn}` not found: Maven is needed to fetch Kafka {version}")
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:  # parallel test sessions resolve only once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return libs
        return _maven_copy(base, libs, marker, version, mvn, timeout)


def _maven_copy(base: Path, libs: Path, marker: Path, version: str, mvn: str,
                timeout: float) -> Path:
    (base / "pom.xml").write_text(_POM.format(version=version, scala=SCALA_VERSION))
    staging = base / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    goal = f"{DEPENDENCY_PLUGIN}:copy-dependencies"
    cmd = [mvn, "-q", "-B", "-f", str(base / "pom.xml"), goal,
           f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
    errors = ""
    for offline in (True, False):
        try:
            proc = subprocess.run(cmd + (["-o"] if offline else []), capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise KafkaLauncherError(f"Maven did not resolve Kafka {version} in {timeout:.0f}s") from exc
        if proc.returncode == 0:
            break
        errors = (proc.stdout + proc.stderr)[-4000:]
    else:
        raise KafkaLauncherError(f"Maven could not resolve kafka_{SCALA_VERSION}:{version}:\n{errors}")
    if not any(staging.glob(f"kafka_{SCALA_VERSION}-{version}.jar")):
        raise KafkaLauncherError(f"Maven finished but kafka_{SCALA_VERSION}-{version}.jar is missing")
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    marker.write_text(version + "\n")
    return libs


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether 127.0.0.1:`port` can be bound (no listener holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding. Never one that
    starts with '-' (1 in 64 would): the storage tool would read it as an option and fail, so,
    like Kafka's own Uuid.randomUuid, draw again."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _tail(path: Path, lines: int = 30) -> str:
    """The broker log's ERROR/FATAL lines (the cause) followed by its last `lines` lines."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    errors: list[str] = []
    for i, line in enumerate(text):
        if (" ERROR " in line or " FATAL " in line) and len(errors) < 15:
            errors.extend(text[i:i + 2])  # the message and the exception that follows it
    head = "\n".join(errors) + "\n...\n" if errors else ""
    return head + "\n".join(text[-lines:])


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process; reaps it if it is our exited child."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _is_our_broker(pid: int, props: Path) -> bool:
    """Guard against pid reuse: the process must be a Kafka JVM on our properties file."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid_alive(pid)
    return _MAIN_CLASS.encode() in cmdline and str(props).encode() in cmdline


def broker_ready(bootstrap: str, timeout: float = 5.0,
                 client: Mapping[str, Any] | None = None) -> bool:
    """Whether a broker at `bootstrap` answers a metadata request and lists itself
    (`client`: extra kafka-python settings, e.g. SASL credentials)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    ms = max(int(timeout * 1000), 1000)
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ms,
                                 bootstrap_timeout_ms=ms, client_id="poolledger-probe",
                                 **dict(client or {}))
    except (KafkaError, OSError):
        return False
    try:
        admin.list_topics()
        return bool(admin.describe_cluster().get("brokers"))
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()


# --------------------------------------------------------------------------- server

SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class KafkaSecurity:
    """SASL/SCRAM users of a secured broker (name -> password) and the super user among them
    (the pipeline: faust workers, the run loop). Passwords never appear in a repr."""

    users: Mapping[str, str] = field(repr=False)
    super_user: str

    def client(self, user: str) -> dict[str, Any]:
        """kafka-python settings authenticating as `user`."""
        from streams.log.kafka import SaslLogin

        return SaslLogin(SCRAM_MECHANISM, user, self.users[user]).client_config()



class KafkaServer:
    """One single-node KRaft broker (combined broker + controller) on 127.0.0.1.

    `data_dir` holds the configuration, the server log and the Kafka log dirs; when it is
    None a temp dir is made and removed again by `stop()`. An existing, formatted data dir
    is reused (its records survive a restart).

    Unless `detached`, Linux delivers SIGTERM to the broker when the thread that started it
    exits, so a killed test run leaves no JVM behind: start it from a long-lived thread.
    """

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, port: int | None = None,
                 version: str = KAFKA_VERSION, heap: str | None = None,
                 startup_timeout: float = 120.0, detached: bool = False,
                 overrides: Mapping[str, str] | None = None,
                 security: KafkaSecurity | None = None) -> None:
        # absolute: the JVM runs in this directory and reads the paths written into its files
        self._given_dir = Path(data_dir).absolute() if data_dir is not None else None
        self._dir: Path | None = None
        self._port = port
        self.version = version
        self.heap = heap or os.environ.get("POOLLEDGER_KAFKA_HEAP", "1g")
        self.startup_timeout = startup_timeout
        self.detached = detached
        self.overrides = dict(overrides or {})
        self.security = security
        self._proc: subprocess.Popen[bytes] | None = None
        self._bootstrap: str | None = None

    # -- properties

    @property
    def bootstrap(self) -> str:
        """`127.0.0.1:PORT` of the running broker."""
        if self._bootstrap is None:
            raise KafkaLauncherError("broker is not started")
        return self._bootstrap

    @property
    def pid(self) -> int:
        """The JVM's process id."""
        if self._proc is None:
            raise KafkaLauncherError("broker is not started")
        return self._proc.pid

    @property
    def data_dir(self) -> Path:
        """The directory holding config, logs and data."""
        if self._dir is None:
            raise KafkaLauncherError("broker is not started")
        return self._dir

    @property
    def server_log(self) -> Path:
        """The broker's log4j output file."""
        return self.data_dir / "server.log"

    # -- lifecycle

    def start(self) -> str:
        """Resolve, configure, format and launch the broker; return once it serves requests.

        Free ports are picked before the JVM binds them, so another process may take one in
        between: a start that fails on a taken port is retried with fresh ports.
        """
        if self._proc is not None:
            return self.bootstrap
        libs = resolve_kafka(self.version)
        if self._given_dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="poolledger-kafka-"))
        else:
            self._dir = self._given_dir
            self._dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._port is not None else 3
        for attempt in range(attempts):
            try:
                return self._launch(libs)
            except KafkaLauncherError:
                self._kill()
                if attempt + 1 < attempts and "failed to bind" in _tail(self.server_log):
                    continue
                self.stop()
                raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _launch(self, libs: Path) -> str:
        assert self._dir is not None
        port = self._port if self._port is not None else free_port()
        controller_port = free_port()
        while controller_port == port:
            controller_port = free_port()
        props = self._write_config(port, controller_port)
        java = _java()
        classpath = f"{libs}/*"
        if not (self._dir / "kraft" / "meta.properties").exists():
            self._format(java, classpath, props)
        console = open(self._dir / "console.log", "ab")  # JVM crashes land here
        try:
            self._proc = subprocess.Popen(
                [java, "-Xms256m", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                 "-Djava.awt.headless=true",
                 f"-Dlog4j.configuration=file:{self._dir / 'log4j.properties'}",
                 f"-Dkafka.logs.dir={self._dir}", "-cp", classpath, _MAIN_CLASS, str(props)],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                cwd=self._dir, start_new_session=True,
                preexec_fn=None if self.detached else die_with_parent)
        finally:
            console.close()
        self._bootstrap = f"127.0.0.1:{port}"
        self._wait_ready()
        return self._bootstrap

    def _kill(self, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc.pid, timeout, proc)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the broker's process group, SIGKILL after `timeout`, remove a temp dir."""
        self._kill(timeout)
        if self._given_dir is None and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._bootstrap = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- internals

    def _write_config(self, port: int, controller_port: int) -> Path:
        assert self._dir is not None
        settings: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self._dir / "kraft"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            # the log is the system of record: nothing expires by age or size
            "log.retention.ms": "-1",
            "log.retention.bytes": "-1",
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        if self.security is not None:
            settings.update(self._secured(port, controller_port))
        settings.update(self.overrides)
        props = self._dir / "server.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        log_file = self._dir / "server.log"
        (self._dir / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, file\n"
            "log4j.appender.file=org.apache.log4j.RollingFileAppender\n"
            f"log4j.appender.file.File={log_file}\n"
            "log4j.appender.file.MaxFileSize=20MB\n"
            "log4j.appender.file.MaxBackupIndex=2\n"
            "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            "log4j.logger.kafka=INFO\n"
            "log4j.logger.org.apache.kafka=INFO\n"
            "log4j.logger.state.change.logger=WARN\n"
            "log4j.logger.kafka.request.logger=WARN\n")
        return props

    def _secured(self, port: int, controller_port: int) -> dict[str, str]:
        """server.properties entries of the secured mode (see the module docstring)."""
        sec = self.security
        assert sec is not None
        su, su_pw = sec.super_user, sec.users[sec.super_user]
        plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
                 f'username="{su}" password="{su_pw}" user_{su}="{su_pw}";')
        scram = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
                 f'username="{su}" password="{su_pw}";')
        return {
            "listeners": f"CLIENT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"CLIENT://127.0.0.1:{port}",
            "inter.broker.listener.name": "CLIENT",
            "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.client.sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.client.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": scram,
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": plain,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{su}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def _super_client(self) -> dict[str, Any] | None:
        sec = self.security
        return None if sec is None else sec.client(sec.super_user)

    def grant(self, user: str, topic: str, operations: tuple[str, ...] = ("WRITE", "DESCRIBE"),
              ) -> None:
        """Allow `user` the ACL `operations` (kafka-python ACLOperation names) on `topic`,
        created as the super user (secured mode only)."""
        from kafka import KafkaAdminClient
        from kafka.admin import (ACL, ACLOperation, ACLPermissionType, ResourcePattern,
                                 ResourceType)

        client = self._super_client()
        if client is None:
            raise KafkaLauncherError("grant needs a broker started with security")
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, **client)
        try:
            acls = [ACL(f"User:{user}", "*", ACLOperation[op], ACLPermissionType.ALLOW,
                        ResourcePattern(ResourceType.TOPIC, topic)) for op in operations]
            result = admin.create_acls(acls)
            if result.get("failed"):
                raise KafkaLauncherError(f"creating ACLs for {user} on {topic} failed: "
                                         f"{result['failed']}")
        finally:
            admin.close()

    def _format(self, java: str, classpath: str, props: Path) -> None:
        assert self._dir is not None
        cmd = [java, "-Xmx256m", f"-Dlog4j.configuration=file:{self._dir / 'log4j.properties'}",
               "-cp", classpath, "kafka.tools.StorageTool", "format",
               "-t", _cluster_id(), "-c", str(props), "--ignore-formatted"]
        if self.security is not None:
            for user, password in sorted(self.security.users.items()):
                cmd += ["--add-scram",
                        f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise KafkaLauncherError(f"kafka storage format failed ({proc.returncode}):\n"
                                     f"{proc.stdout}{proc.stderr}")

    def _wait_ready(self) -> None:
        assert self._proc is not None and self._dir is not None and self._bootstrap is not None
        host, port = self._bootstrap.rsplit(":", 1)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise KafkaLauncherError(
                    f"Kafka exited with code {code} during start-up (its logs: "
                    f"{self._dir / 'server.log'}, {self._dir / 'console.log'})\n"
                    f"server log tail:\n{_tail(self._dir / 'server.log')}\n"
                    f"--- console:\n{_tail(self._dir / 'console.log')}")
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    pass
            except OSError:
                time.sleep(0.2)
                continue
            if broker_ready(self._bootstrap, timeout=max(1.0, min(5.0, deadline - time.monotonic())),
                            client=self._super_client()):
                return
            time.sleep(0.2)
        raise KafkaLauncherError(
            f"Kafka did not answer on {self._bootstrap} within {self.startup_timeout:.0f}s "
            f"(its log: {self._dir / 'server.log'})\n"
            f"server log tail:\n{_tail(self._dir / 'server.log')}")


def die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM the service (broker, search engine, gmond...) if its owner dies; shared by every launcher under compose/"""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def terminate(pid: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the process group led by `pid`, wait, then SIGKILL it."""
    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)

    def gone(wait: float) -> bool:
        if proc is not None:
            try:
                proc.wait(wait)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return True
            time.sleep(0.1)
        return not pid_alive(pid)

    send(signal.SIGTERM)
    if gone(timeout):
        return
    send(signal.SIGKILL)
    if not gone(10.0):
        raise KafkaLauncherError(f"Kafka (pid {pid}) survived SIGKILL")


# --------------------------------------------------------------------------- service


def _state_path(home: Path) -> Path:
    return home / "services" / STATE_FILE


def service_status(home: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The recorded state of the detached broker if its process is still alive, else None."""
    path = _state_path(poolledger_home(home))
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if "pid" not in state or not _is_our_broker(int(state["pid"]), Path(state["props"])):
        return None
    return state


def start_service(home: str | os.PathLike[str] | None = None, *, port: int | None = None,
                  version: str = KAFKA_VERSION) -> str:
    """Start a detached broker with its data in `<home>/services/kafka` and return its bootstrap.

    Idempotent: when the recorded broker is alive and answering, its address is returned. A
    restarted service keeps its data and tries to keep its previous port.
    """
    root = poolledger_home(home)
    state = service_status(root)
    if state is not None:
        if broker_ready(state["bootstrap"]):
            return str(state["bootstrap"])
        terminate(int(state["pid"]), 30.0)
    previous: int | None = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        previous = int(json.loads(_state_path(root).read_text())["port"])
    if port is None and previous is not None and port_is_free(previous):
        port = previous
    server = KafkaServer(root / "services" / "kafka", port=port, version=version, detached=True)
    bootstrap = server.start()
    _state_path(root).write_text(json.dumps({
        "pid": server.pid, "port": int(bootstrap.rsplit(":", 1)[1]), "bootstrap": bootstrap,
        "version": version, "data_dir": str(server.data_dir),
        "props": str(server.data_dir / "server.properties"), "log": str(server.server_log),
        "started": time.time()}, indent=2) + "\n")
    return bootstrap


def stop_service(home: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> bool:
    """Stop the detached broker; return whether one was running. Its data is kept."""
    root = poolledger_home(home)
    state = service_status(root)
    path = _state_path(root)
    if state is None:
        path.unlink(missing_ok=True)
        return False
    terminate(int(state["pid"]), timeout)
    # keep the port for the next start; drop the pid so status says "stopped"
    path.write_text(json.dumps({"port": state["port"]}) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    """`python -m compose.kafka start|stop|status [--home DIR]`."""
    parser = argparse.ArgumentParser(prog="python -m compose.kafka", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--home", default=None, help="PoolLedger home (default $POOLLEDGER_HOME or ./out)")
    parser.add_argument("--port", type=int, default=None, help="broker port (start; default: free port)")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            print(start_service(args.home, port=args.port))
            return 0
        if args.command == "stop":
            print("stopped" if stop_service(args.home) else "not running")
            return 0
        state = service_status(args.home)
        if state is None:
            print("not running")
            return 3
        ready = broker_ready(state["bootstrap"])
        print(f"{'running' if ready else 'not answering'} {state['bootstrap']} pid {state['pid']}")
        return 0 if ready else 1
    except KafkaLauncherError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())


@contextlib.contextmanager
def broker(say: Callable[[str], None] = lambda _msg: None) -> Iterator[str]:
    """`host:port` of KAFKA_BOOTSTRAP when set, else of a broker launched for the block."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    say("starting a Kafka broker (compose.kafka.KafkaServer) ...")
    with KafkaServer() as bootstrap:
        say(f"broker up at {bootstrap}")
        yield bootstrap
