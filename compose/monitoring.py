"""Run the real monitoring services on loopback without Docker: Ganglia's gmond, Prometheus
and Graphite's carbon-cache (Debian's ganglia-monitor, prometheus and graphite-carbon).

Each service gets a temp or given directory with its own configuration (free ports, bound to
127.0.0.1, nothing under /etc or /var touched), so several can run side by side. Two ways to
use them, as for Kafka (`compose.kafka`):

* `MonitoringServer(kind, ...)` — in-process owner (tests): `start()` returns its endpoints,
  `stop()` (or leaving the `with` block) stops it and removes a temp dir.
* `start_service(home, kind)` / `stop_service(home, kind)` / `service_status(home, kind)` —
  detached, state in `<home>/services/<kind>.json` (`poolledger services ...`).

`ensure_installed()` apt-installs the Debian packages when a binary is missing (root only);
`python -m compose.monitoring install` runs it for `make test`.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from compose.kafka import die_with_parent, terminate, free_port, pid_alive, poolledger_home

__all__ = ["MonitoringServer", "MonitoringLauncherError", "KINDS", "PACKAGES", "ensure_installed",
           "start_service", "stop_service", "service_status", "free_udp_port"]

KINDS = ("gmond", "prometheus", "graphite")
#: the binary each service needs and the Debian package that has it
PACKAGES = {"gmond": ("gmond", "ganglia-monitor"), "prometheus": ("prometheus", "prometheus"),
            "graphite": ("carbon-cache", "graphite-carbon")}


class MonitoringLauncherError(Exception):
    """A monitoring service could not be installed, started or stopped."""


class _ExitedError(MonitoringLauncherError):
    """The service exited while starting (e.g. its port was taken meanwhile)."""


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 nothing is bound to right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_installed(kinds: tuple[str, ...] = KINDS) -> None:
    """Install the Debian packages of `kinds` whose binaries are missing (needs root and apt;
    `apt-get update` first only when the package lists are stale)."""
    wanted = {k: PACKAGES[k] for k in kinds}
    missing = sorted({pkg for k, (binary, pkg) in wanted.items()
                      if shutil.which(binary) is None or (k == "prometheus" and shutil.which("promtool") is None)})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise MonitoringLauncherError(
            f"missing {', '.join(missing)}: install with apt-get install -y --no-install-recommends "
            + " ".join(missing))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    done = subprocess.run(install, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env)
        done = subprocess.run(install, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise MonitoringLauncherError(f"apt-get install {' '.join(missing)} failed: {done.stderr.strip()[-300:]}")


# --------------------------------------------------------------------------- configurations

def _gmond_conf(udp: int, tcp: int) -> str:
    return f"""globals {{
  daemonize = no
  setuid = no
  user = root
  debug_level = 0
  max_udp_msg_len = 1472
  mute = no
  deaf = no
  allow_extra_data = yes
  host_dmax = 0
  host_tmax = 20
  cleanup_threshold = 300
  gexec = no
  send_metadata_interval = 0
}}
cluster {{
  name = "PoolLedger"
}}
udp_send_channel {{
  host = 127.0.0.1
  port = {udp}
  ttl = 1
}}
udp_recv_channel {{
  port = {udp}
  bind = 127.0.0.1
}}
tcp_accept_channel {{
  port = {tcp}
  bind = 127.0.0.1
}}
"""


def _prometheus_conf(targets: list[str]) -> str:
    listed = ", ".join(f"'{t}'" for t in targets)
    return f"""global:
  scrape_interval: 1s
  evaluation_interval: 15s
scrape_configs:
  - job_name: poolledger
    honor_labels: true
    static_configs:
      - targets: [{listed}]
"""


def _carbon_conf(root: Path, line: int, pickle: int, query: int) -> str:
    return f"""[cache]
STORAGE_DIR = {root}/storage/
LOCAL_DATA_DIR = {root}/storage/whisper/
WHITELISTS_DIR = {root}/storage/lists/
CONF_DIR = {root}/
LOG_DIR = {root}/log/
PID_DIR = {root}/
DATABASE = whisper
ENABLE_LOGROTATION = False
USER =
MAX_CACHE_SIZE = inf
MAX_UPDATES_PER_SECOND = inf
MAX_CREATES_PER_MINUTE = inf
MIN_TIMESTAMP_RESOLUTION = 1
LINE_RECEIVER_INTERFACE = 127.0.0.1
LINE_RECEIVER_PORT = {line}
ENABLE_UDP_LISTENER = False
PICKLE_RECEIVER_INTERFACE = 127.0.0.1
PICKLE_RECEIVER_PORT = {pickle}
CACHE_QUERY_INTERFACE = 127.0.0.1
CACHE_QUERY_PORT = {query}
USE_FLOW_CONTROL = True
LOG_UPDATES = False
LOG_CREATES = False
CACHE_WRITE_STRATEGY = sorted
WHISPER_AUTOFLUSH = True
WHISPER_FALLOCATE_CREATE = False
ENABLE_TAGS = False
CARBON_METRIC_INTERVAL = 0
"""


#: one-minute points for two weeks, then hourly for two years: a replay of an older log still
#: lands (whisper files an old point in the first archive whose retention covers it)
_CARBON_SCHEMAS = """[default]
pattern = .*
retentions = 60s:14d,1h:2y
"""


# --------------------------------------------------------------------------- one server

def _wait(check: Any, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _ExitedError(f"{what} exited with {proc.returncode} (its log: {log}): {_tail(log)}")
        if check():
            return
        time.sleep(0.2)
    raise MonitoringLauncherError(f"{what} not ready within {timeout:.0f}s (its log: {log}): "
                                  f"{_tail(log)}")


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:  # noqa: S310 - loopback URL we built
            return bool(r.status == 200)
    except OSError:
        return False


class MonitoringServer:
    """One gmond, Prometheus or carbon-cache on loopback ports of its own."""

    def __init__(self, kind: str, workdir: str | os.PathLike[str] | None = None, *,
                 scrape: list[str] | None = None, detached: bool = False,
                 timeout: float = 60.0) -> None:
        if kind not in KINDS:
            raise MonitoringLauncherError(f"unknown service {kind!r} (one of {', '.join(KINDS)})")
        self.kind = kind
        self._tmp = workdir is None
        self.dir = Path(tempfile.mkdtemp(prefix=f"poolledger-{kind}-")) if workdir is None else Path(workdir).absolute()
        self.scrape = list(scrape or [])
        self.detached = detached
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    @property
    def log(self) -> Path:
        return self.dir / f"{self.kind}.log"

    def start(self, attempts: int = 3) -> dict[str, Any]:
        """Start the service; its endpoints (ports, config path, data dir). A free port can be
        taken by another process before the service binds it (engineers and CI jobs share the
        machine), so a service that exits at once is started again on new ports."""
        ensure_installed((self.kind,))
        self.dir.mkdir(parents=True, exist_ok=True)
        for _ in range(attempts - 1):
            try:
                return self._start_once()
            except _ExitedError:
                continue
            except MonitoringLauncherError:
                self.stop()
                raise
        try:
            return self._start_once()
        except MonitoringLauncherError:
            self.stop()
            raise

    def _start_once(self) -> dict[str, Any]:
        if self.kind == "gmond":
            udp, tcp = free_udp_port(), free_port()
            conf = self.dir / "gmond.conf"
            conf.write_text(_gmond_conf(udp, tcp))
            cmd = ["gmond", "-c", str(conf), "-f"]
            self.info = {"udp_port": udp, "xml_port": tcp, "config": str(conf),
                         "knob": f"GANGLIA_CONFIG={conf}"}
            ready = (lambda: _tcp_open(tcp))
        elif self.kind == "prometheus":
            port = free_port()
            conf = self.dir / "prometheus.yml"
            conf.write_text(_prometheus_conf(self.scrape))
            data = self.dir / "data"
            cmd = ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={data}",
                   f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=10y",
                   "--web.enable-lifecycle"]
            self.info = {"port": port, "url": f"http://127.0.0.1:{port}", "config": str(conf),
                         "data_dir": str(data), "scrape": self.scrape}
            ready = (lambda: _http_ok(f"http://127.0.0.1:{port}/-/ready"))
        else:
            line, pickle, query = free_port(), free_port(), free_port()
            conf = self.dir / "carbon.conf"
            conf.write_text(_carbon_conf(self.dir, line, pickle, query))
            (self.dir / "storage-schemas.conf").write_text(_CARBON_SCHEMAS)
            (self.dir / "log").mkdir(exist_ok=True)
            cmd = ["carbon-cache", f"--config={conf}", f"--pidfile={self.dir / 'carbon.pid'}",
                   "--nodaemon", f"--logdir={self.dir / 'log'}", "start"]
            self.info = {"port": line, "whisper_dir": str(self.dir / "storage" / "whisper"),
                         "config": str(conf), "knob": f"POOLLEDGER_GRAPHITE=127.0.0.1:{line}"}
            ready = (lambda: _tcp_open(line))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir,
                                         start_new_session=True,
                                         preexec_fn=None if self.detached else die_with_parent)
        try:
            _wait(ready, self.kind, self.proc, self.log, self.timeout)
        except MonitoringLauncherError:
            self._kill()
            raise
        self.info.update(pid=self.proc.pid, dir=str(self.dir), log=str(self.log), kind=self.kind)
        return self.info

    def _kill(self, timeout: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            terminate(self.proc.pid, timeout, self.proc)
        self.proc = None

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the service (and remove its directory if it was a temp one)."""
        self._kill(timeout)
        if self._tmp:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> dict[str, Any]:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --------------------------------------------------------------------------- detached services

def _state_path(home: Path, kind: str) -> Path:
    return home / "services" / f"{kind}.json"


def service_status(home: str | os.PathLike[str] | None, kind: str) -> dict[str, Any] | None:
    """The recorded state of a detached service if its process is alive, else None."""
    try:
        state: dict[str, Any] = json.loads(_state_path(poolledger_home(home), kind).read_text())
    except (OSError, ValueError):
        return None
    return state if "pid" in state and pid_alive(int(state["pid"])) else None


def start_service(home: str | os.PathLike[str] | None, kind: str,
                  scrape: list[str] | None = None) -> dict[str, Any]:
    """Start a detached service under `<home>/services/<kind>` (idempotent)."""
    root = poolledger_home(home)
    state = service_status(root, kind)
    if state is not None:
        return state
    server = MonitoringServer(kind, root / "services" / kind, scrape=scrape, detached=True)
    info = server.start()
    path = _state_path(root, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def stop_service(home: str | os.PathLike[str] | None, kind: str, timeout: float = 15.0) -> bool:
    """Stop a detached service; whether one was running. Its data is kept."""
    root = poolledger_home(home)
    state = service_status(root, kind)
    _state_path(root, kind).unlink(missing_ok=True)
    if state is None:
        return False
    terminate(int(state["pid"]), timeout)
    return True


def main(argv: list[str] | None = None) -> int:
    """`python -m compose.monitoring install`: what `make test` runs before the tests."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m compose.monitoring")
    parser.add_argument("action", choices=("install",))
    parser.parse_args(argv)
    try:
        ensure_installed()
    except MonitoringLauncherError as exc:
        print(f"compose.monitoring: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
