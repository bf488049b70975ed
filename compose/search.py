"""Run a real Elasticsearch or OpenSearch node (single node, loopback, security off) without Docker.

Both come as the "integ-test" zips their projects publish to Maven Central (no Docker, no
package repository needed). Versions are pinned:

* Elasticsearch 8.19.21 — the newest 8.x, which runs on the Java 17 already on these machines.
  The pinned Python client is `elasticsearch>=8.15,<9`: a client's major must not exceed the
  server's, and 9.x servers would need Java 21 and a 9.x client for nothing adstash uses.
* OpenSearch 3.6.0 — needs Java 21+, taken from a Temurin JDK under /usr/lib/jvm (or
  `$POOLLEDGER_JAVA21`); the client is `opensearch-py` 3.x.

Both refuse to run as root, so the node runs as the system user `poolledger-search` (created on
first use) through `runuser`, with its home, data and temp dirs owned by that user.

* `SearchServer(kind)` — in-process owner (tests, benchmarks): `start()` returns the URL,
  `stop()` kills the node and removes its temp dir, `kill()` is a `kill -9` for fault tests.
* `start_service(kind, home)` / `stop_service` / `service_status` — a detached node whose pid
  and URL live in `<home>/services/<kind>.json` (`poolledger services start elasticsearch`).
"""
from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from compose.kafka import die_with_parent, terminate, cache_root, free_port, pid_alive, \
    poolledger_home

SERVICE_USER = "poolledger-search"


class SearchLauncherError(Exception):
    """The search engine could not be fetched, started or stopped."""


@dataclass(frozen=True, slots=True)
class Distribution:
    """Where a pinned integ-test zip lives on Maven Central and what it needs to run."""

    kind: str
    version: str
    group_path: str
    artifact: str
    java_major: int
    home_env: str      # the variable pointing the start script at its config dir

    @property
    def url(self) -> str:
        return (f"https://repo1.maven.org/maven2/{self.group_path}/{self.artifact}/"
                f"{self.version}/{self.artifact}-{self.version}.zip")


DISTRIBUTIONS: dict[str, Distribution] = {
    "elasticsearch": Distribution("elasticsearch", "8.19.21",
                                  "org/elasticsearch/distribution/integ-test-zip",
                                  "elasticsearch", 17, "ES_PATH_CONF"),
    "opensearch": Distribution("opensearch", "3.6.0",
                               "org/opensearch/distribution/integ-test-zip",
                               "opensearch", 21, "OPENSEARCH_PATH_CONF"),
}


def distribution(kind: str) -> Distribution:
    try:
        return DISTRIBUTIONS[kind]
    except KeyError:
        raise SearchLauncherError(f"unknown search engine {kind!r}: "
                                  f"one of {', '.join(DISTRIBUTIONS)}") from None


# --------------------------------------------------------------------------- fetching


def fetch(kind: str) -> Path:
    """The unpacked distribution directory, downloading and unpacking it once (cached)."""
    dist = distribution(kind)
    base = _unpack_root() / f"{kind}-{dist.version}"
    home = base / f"{kind}-{dist.version}"
    marker = base / ".complete"
    if marker.exists():
        return home
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:  # parallel sessions fetch only once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return home
        archive = base / f"{kind}.zip"
        if not archive.exists():
            part = archive.with_suffix(".part")
            try:
                with urllib.request.urlopen(dist.url, timeout=60) as resp, open(part, "wb") as f:
                    shutil.copyfileobj(resp, f, 1 << 20)
            except (urllib.error.URLError, OSError) as exc:
                raise SearchLauncherError(f"cannot download {dist.url}: {exc}") from exc
            part.rename(archive)
        shutil.rmtree(home, ignore_errors=True)
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():  # zipfile drops the mode bits: restore them
                out = zf.extract(info, base)
                mode = info.external_attr >> 16
                if mode:
                    os.chmod(out, mode & 0o7777)
        if not (home / "bin" / kind).exists():
            raise SearchLauncherError(f"{archive} did not unpack to {home}")
        archive.unlink()
        marker.write_text(dist.version + "\n")
    return home


def _unpack_root() -> Path:
    """Where distributions are unpacked: `cache_root()`, except as root, whose home the
    unprivileged service user cannot traverse: then the world-readable /var/cache/poolledger."""
    if os.geteuid() == 0 and "POOLLEDGER_CACHE" not in os.environ:
        return Path("/var/cache/poolledger")
    return cache_root()


def java_home(major: int) -> Path:
    """A JDK of at least `major`: `$POOLLEDGER_JAVA<major>` / `$JAVA_HOME`, else /usr/lib/jvm."""
    for var in (f"POOLLEDGER_JAVA{major}_HOME", "JAVA_HOME"):
        if os.environ.get(var) and _java_major(Path(os.environ[var])) >= major:
            return Path(os.environ[var])
    best: tuple[int, Path] | None = None
    jvm = Path("/usr/lib/jvm")
    for cand in sorted(jvm.iterdir()) if jvm.is_dir() else []:
        v = _java_major(cand)
        if v >= major and (best is None or v > best[0]):
            best = (v, cand)
    if best is None:
        raise SearchLauncherError(f"no JDK {major}+ found under /usr/lib/jvm "
                                  f"(set POOLLEDGER_JAVA{major}_HOME)")
    return best[1]


def _java_major(home: Path) -> int:
    release = home / "release"
    if not (home / "bin" / "java").exists() or not release.exists():
        return 0
    for line in release.read_text(errors="replace").splitlines():
        if line.startswith("JAVA_VERSION="):
            v = line.split("=", 1)[1].strip('"')
            head = v.split(".")[0]
            return int(head) if head.isdigit() else 0
    return 0


def ensure_user() -> pwd.struct_passwd:
    """The unprivileged system user the node runs as (created once)."""
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        pass
    proc = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                           "/usr/sbin/nologin", SERVICE_USER], capture_output=True, text=True,
                          check=False)
    if proc.returncode not in (0, 9):  # 9: created meanwhile by a parallel session
        raise SearchLauncherError(f"cannot create user {SERVICE_USER}: {proc.stderr.strip()}")
    return pwd.getpwnam(SERVICE_USER)


def unreachable(path: Path, user: pwd.struct_passwd) -> Path | None:
    """The first directory above `path` that `user` may not enter (no search permission for
    it as owner, group member or other), else None."""
    groups = {user.pw_gid} | {g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem}
    for parent in reversed(path.parents):
        st = parent.stat()
        bit = (0o100 if st.st_uid == user.pw_uid else
               0o010 if st.st_gid in groups else 0o001)
        if not st.st_mode & bit:
            return parent
    return None


def health(url: str, timeout: float = 2.0) -> str | None:
    """The cluster health status ("green", "yellow", "red") or None if nothing answers.
    (The stripped ES zip answers no root endpoint, so health is the probe.)"""
    try:
        with urllib.request.urlopen(f"{url}/_cluster/health", timeout=timeout) as resp:
            return str(json.loads(resp.read())["status"])
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return None


# --------------------------------------------------------------------------- server


class SearchServer:
    """One single-node Elasticsearch/OpenSearch on 127.0.0.1 with a free HTTP port.

    `data_dir` keeps config, data and logs (a temp dir removed by `stop()` when None). The node
    runs as SERVICE_USER; unless `detached`, it dies with the thread that started it.
    """

    def __init__(self, kind: str = "elasticsearch", data_dir: str | os.PathLike[str] | None = None,
                 *, port: int | None = None, heap: str = "512m", startup_timeout: float = 180.0,
                 detached: bool = False) -> None:
        self.dist = distribution(kind)
        self.kind = kind
        # absolute: the node runs in this directory and reads the paths written into its config
        self._given_dir = Path(data_dir).absolute() if data_dir is not None else None
        self._dir: Path | None = None
        self._port = port
        self.heap = heap
        self.startup_timeout = startup_timeout
        self.detached = detached
        self._proc: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise SearchLauncherError(f"{self.kind} is not started")
        return self._proc.pid

    @property
    def data_dir(self) -> Path:
        if self._dir is None:
            raise SearchLauncherError(f"{self.kind} is not started")
        return self._dir

    def start(self) -> str:
        """Fetch, configure and launch the node; return its URL once the cluster is green/yellow.
        Restarting a stopped/killed server keeps its data dir and port."""
        if self._proc is not None and self.url is not None:
            return self.url
        home = fetch(self.kind)
        if self._dir is None:
            if self._given_dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix=f"poolledger-{self.kind}-"))
            else:
                self._dir = self._given_dir
        d = self._dir
        for sub in ("config", "data", "logs", "tmp"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        if self._port is None:
            self._port = free_port()
        transport = free_port()
        self._write_config(home, d, self._port, transport)
        if os.geteuid() == 0:
            user = ensure_user()
            blocked = unreachable(d, user)
            if blocked is not None:
                raise SearchLauncherError(
                    f"{self.kind} runs as user {SERVICE_USER} (it refuses root), who cannot "
                    f"enter {blocked} (mode {blocked.stat().st_mode & 0o777:o}) on the way to "
                    f"{d}: choose a --home below directories others may enter")
            for p in [d, *d.rglob("*")]:
                os.chown(p, user.pw_uid, user.pw_gid)
        os.chmod(d, 0o755)
        jdk = java_home(self.dist.java_major)
        prefix = "ES" if self.kind == "elasticsearch" else "OPENSEARCH"
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(d), "JAVA_HOME": str(jdk),
               f"{prefix}_JAVA_HOME": str(jdk), self.dist.home_env: str(d / "config"),
               f"{prefix}_TMPDIR": str(d / "tmp"),
               f"{prefix}_JAVA_OPTS": f"-Xms{self.heap} -Xmx{self.heap}"}
        # both engines refuse root: as root, run the node as the unprivileged service user
        argv = [str(home / "bin" / self.kind)]
        if os.geteuid() == 0:
            argv = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", SERVICE_USER, "--", *argv]
        console = open(d / "console.log", "ab")
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, cwd=d,
                env=env, start_new_session=True,
                preexec_fn=None if self.detached else die_with_parent)
        finally:
            console.close()
        self.url = f"http://127.0.0.1:{self._port}"
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _write_config(self, home: Path, d: Path, port: int, transport: int) -> None:
        conf = d / "config"
        for f in (home / "config").iterdir():
            if f.is_file() and not (conf / f.name).exists():
                shutil.copy(f, conf / f.name)
        # the stock jvm.options writes GC logs and heap dumps relative to the (read-only)
        # distribution directory: point them into the data dir
        opts = conf / "jvm.options"
        if opts.exists():
            text = opts.read_text()
            text = text.replace("file=logs/gc.log", f"file={d / 'logs' / 'gc.log'}")
            text = text.replace("HeapDumpPath=data", f"HeapDumpPath={d / 'data'}")
            text = text.replace("ErrorFile=logs/", f"ErrorFile={d / 'logs'}/")
            opts.write_text(text)
        # OpenSearch's integ-test zip has no security plugin at all (nothing to switch off)
        security = "xpack.security.enabled: false\n" if self.kind == "elasticsearch" else ""
        (conf / f"{self.kind}.yml").write_text(
            f"cluster.name: poolledger-{self.kind}\n"
            f"node.name: node-1\n"
            f"path.data: {d / 'data'}\n"
            f"path.logs: {d / 'logs'}\n"
            "network.host: 127.0.0.1\n"
            f"http.port: {port}\n"
            f"transport.port: {transport}\n"
            "discovery.type: single-node\n"
            "cluster.routing.allocation.disk.threshold_enabled: false\n"
            + security)

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.url is not None and self._dir is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise SearchLauncherError(
                    f"{self.kind} exited with code {self._proc.returncode} during start-up "
                    f"(its log: {self._dir / 'console.log'})\n{self._tail()}")
            if health(self.url, 1.0) in ("green", "yellow"):
                return
            time.sleep(0.3)
        raise SearchLauncherError(f"{self.kind} did not answer on {self.url} within "
                                  f"{self.startup_timeout:.0f}s (its log: "
                                  f"{self._dir / 'console.log'})\n{self._tail()}")

    def _tail(self) -> str:
        assert self._dir is not None
        try:
            return "\n".join((self._dir / "console.log").read_text(errors="replace")
                             .splitlines()[-30:])
        except OSError:
            return "(no console log)"

    def kill(self) -> None:
        """`kill -9` the node (fault tests); `start()` again restarts it on the same data."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the node's process group (SIGKILL after `timeout`); remove a temp dir."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(Exception):
                terminate(proc.pid, timeout, proc)
        if self._given_dir is None and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.url = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# --------------------------------------------------------------------------- service


def _state_path(kind: str, home: Path) -> Path:
    return home / "services" / f"{kind}.json"


def service_status(kind: str, home: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The recorded state of the detached node if its process is alive, else None."""
    try:
        state: dict[str, Any] = json.loads(_state_path(kind, poolledger_home(home)).read_text())
    except (OSError, ValueError):
        return None
    if "pid" not in state or not pid_alive(int(state["pid"])):
        return None
    return state


def start_service(kind: str, home: str | os.PathLike[str] | None = None) -> str:
    """Start a detached node with its data in `<home>/services/<kind>`; idempotent."""
    root = poolledger_home(home)
    state = service_status(kind, root)
    if state is not None and health(state["url"]) is not None:
        return str(state["url"])
    port: int | None = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        port = int(json.loads(_state_path(kind, root).read_text())["port"])
    server = SearchServer(kind, root / "services" / kind, port=port, detached=True)
    url = server.start()
    _state_path(kind, root).write_text(json.dumps({
        "pid": server.pid, "port": server._port, "url": url, "version": server.dist.version,
        "data_dir": str(server.data_dir), "started": time.time()}, indent=2) + "\n")
    return url


def stop_service(kind: str, home: str | os.PathLike[str] | None = None) -> bool:
    """Stop the detached node (data kept); whether one was running."""
    root = poolledger_home(home)
    state = service_status(kind, root)
    path = _state_path(kind, root)
    if state is None:
        path.unlink(missing_ok=True)
        return False
    terminate(int(state["pid"]), 30.0)
    path.write_text(json.dumps({"port": state["port"]}) + "\n")
    return True
