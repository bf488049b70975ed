"""Accounting replay throughput: decode + Ledger.apply on a job-heavy log, against bare decoding.

    python bench/accounting.py [--events 200000] [--skip-faust] [--faust-timeout 900]

The log (`job_heavy_events`) extends `streams.synthetic.mixed_events` to a large pool: 2,000
slots whose ads (about 25 attributes, expressions included, ClassAdLifetime 3600) refresh every
30 minutes, 240 submitters in the mixed config's groups and `<none>`, jobs that are submitted,
started, stopped (completed, evicted, removed) and closed with a `job.history` ad, concurrency
limits, a negotiation cycle every 60 s, a few admin edits and knob changes, and redelivered
duplicates. About 90% of the events are job events.

Paths, all over the same encoded log, measured in this run:
  (a) decode baseline: `orjson.loads` per line, nothing else;
  (b) embedded fold: `schemas.events.decode` + `Ledger.apply` into a fresh ledger (what the
      embedded and replay runners do per event), with their collector settings
      (`streams.gcpolicy.long_fold`) and the core as installed (compiled by mypyc unless
      POOLLEDGER_COMPILE=0); the state digest is taken after the timed runs;
  (c) faust: the log is produced to a fresh events topic, `python -m streams.faust_app worker`
      folds it, timed until the consumer group's committed offset reaches the end (start-up
      included; `faust_rss_mb` is its peak RSS, `faust_cpu_seconds` the CPU time it used, a
      steadier figure on a shared machine). Kafka is `KAFKA_BOOTSTRAP` if set, else a broker
      started with `compose.kafka.KafkaServer`;
  (d) faust restore: a worker of a second app on the same topic is killed (SIGKILL) once it
      committed half the log; `faust_restore_seconds` is the time from starting its
      replacement until that one has restored the tables from their changelogs, rejoined the
      group and folded past the offset the killed one had committed (it then folds the rest,
      and its state must be the embedded fold's too: `faust_restore_state_match`).
Target (issue: a year of a 100,000-slot pool's log in about five minutes): (b) >= 100,000
events/s. The last line is key=value pairs for scripts.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import orjson

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from schemas.events import (AdminCommanded, AdUpdated, ConfigChanged, Envelope,  # noqa: E402
                            JobHistory, JobStarted, JobStopped, JobSubmitted, NegotiationCycled,
                            Payload, decode, encode, make_event, partition_key)
from compose.kafka import broker  # noqa: E402
from schemas.settings import load_settings  # noqa: E402
from streams.core.ledger import Ledger  # noqa: E402
from streams.gcpolicy import long_fold  # noqa: E402
from streams.synthetic import LIMITS, SCHEDD, START, mixed_config  # noqa: E402

GROUP_PREFIXES = ("", "", "group_physics.", "group_physics.hep.", "group_chemistry.",
                  "group_chemistry.sub.", "nice-user.")


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the log

def _slot_ad(name: str, machine: str, slot_id: int, cpus: int, state: str) -> dict[str, Any]:
    return {
        "Name": name, "MyType": "Machine", "Machine": machine, "SlotID": slot_id,
        "Cpus": cpus, "Memory": 2048 * cpus, "Disk": 10_000_000, "TotalCpus": 16,
        "TotalMemory": 65536, "State": state, "Activity": "Idle" if state == "Unclaimed" else "Busy",
        "OpSys": "LINUX", "Arch": "X86_64", "LoadAvg": 0.0 if state == "Unclaimed" else 1.0,
        "KeyboardIdle": 86400, "CondorLoadAvg": 0.0, "NETWORK": "ethernet",
        "Start": "/Expr(true)/", "Requirements": "/Expr(START)/", "Rank": 0.0,
        "CurrentRank": 0.0, "IsWakeAble": False, "HasFileTransfer": True,
        "ClassAdLifetime": 3600, "UidDomain": "example.org",
        "StartdIpAddr": "<10.0.0.1:9618?sock=startd>",
    }


def job_heavy_events(n: int, seed: int = 11, slots: int = 2000, users: int = 240,
                     refresh: float = 1800.0) -> Iterator[Envelope]:
    """About `n` events of a large pool, mostly job events (deterministic for a seed)."""
    rng = random.Random(seed)
    seqs: dict[str, int] = {}
    now = START

    def ev(payload: Payload, source: str) -> Envelope:
        seqs[source] = seqs.get(source, 0) + 1
        return make_event(payload, ts=now, source=source, seq=seqs[source])

    names = [(f"slot{i % 8 + 1}@ep{i // 8:04d}.example.org", f"ep{i // 8:04d}.example.org",
              i % 8 + 1, 1 + (i % 3 == 0)) for i in range(slots)]
    submitters = [f"{GROUP_PREFIXES[i % len(GROUP_PREFIXES)]}u{i:03d}@example.org"
                  for i in range(users)]
    free = list(range(slots))
    running: dict[int, tuple[str, str, float, str]] = {}  # slot -> job id, user, weight, limits
    running_slots: list[int] = []
    idle: list[tuple[str, str]] = []
    cluster = 0
    next_cycle = now + 60
    ad_due = [START + refresh * i / slots for i in range(slots)]
    ad_next = 0
    cycle = 0
    recent: list[Envelope] = []
    emitted = 0
    while emitted < n:
        now += rng.expovariate(1 / 0.09)
        batch: list[Envelope] = []
        while ad_due[ad_next] <= now:  # periodic ad refresh, spread evenly over the period
            name, machine, slot_id, cpus = names[ad_next]
            state = "Claimed" if ad_next in running else "Unclaimed"
            batch.append(ev(AdUpdated("Machine", name, _slot_ad(name, machine, slot_id, cpus, state)),
                            f"startd@{machine}"))
            ad_due[ad_next] += refresh
            ad_next = (ad_next + 1) % slots
        if now >= next_cycle:
            cycle += 1
            batch.append(ev(NegotiationCycled("negotiator@cm", cycle, now), "negotiator@cm"))
            next_cycle = now + 60
        roll = rng.random()
        if roll < 0.30 and len(idle) < 1000:
            cluster += 1
            user = submitters[int(rng.paretovariate(1.2)) % users]
            for proc in range(rng.choice((1, 1, 1, 2, 4))):
                jid = f"{cluster}.{proc}"
                batch.append(ev(JobSubmitted(jid, SCHEDD, user, {
                    "ClusterId": cluster, "ProcId": proc, "Owner": user.split("@")[0].split(".")[-1],
                    "RequestCpus": 1, "RequestMemory": 2048, "JobUniverse": 5, "JobPrio": 0,
                    "Cmd": "/home/user/run.sh", "Iwd": "/home/user", "QDate": int(now),
                    "JobStatus": 1, "AccountingGroup": user.split("@")[0],
                    "Requirements": "/Expr(TARGET.Memory >= RequestMemory)/"}), SCHEDD))
                idle.append((jid, user))
        elif roll < 0.62 and idle and free:
            jid, user = idle.pop(rng.randrange(len(idle)))
            slot = free.pop(rng.randrange(len(free)))
            name, _, _, cpus = names[slot]
            limits = rng.choice(LIMITS)
            batch.append(ev(JobStarted(jid, SCHEDD, user, name, float(cpus), {"Cpus": cpus},
                                       limits), SCHEDD))
            running[slot] = (jid, user, float(cpus), limits)
            running_slots.append(slot)
        elif roll < 0.95 and running_slots:
            i = rng.randrange(len(running_slots))
            running_slots[i], running_slots[-1] = running_slots[-1], running_slots[i]
            slot = running_slots.pop()
            jid, user, _, _ = running.pop(slot)
            free.append(slot)
            reason = rng.choices(("completed", "evicted", "removed"), (85, 10, 5))[0]
            batch.append(ev(JobStopped(jid, names[slot][0], reason, SCHEDD, user), SCHEDD))  # type: ignore[arg-type]
            if reason == "evicted":
                idle.append((jid, user))
            else:
                c, p = jid.split(".")
                batch.append(ev(JobHistory({
                    "GlobalJobId": f"ap1.example.org#{jid}#{int(START)}", "ClusterId": int(c),
                    "ProcId": int(p), "Owner": user.split("@")[0], "JobStatus": 4 if reason ==
                    "completed" else 3, "RemoteWallClockTime": 600.0, "ExitCode": 0,
                    "LastRemoteHost": names[slot][0], "CompletionDate": int(now)}), SCHEDD))
        elif roll < 0.952:
            op, value = rng.choice((("setfactor", 2000.0), ("setprio", 3.0), ("resetusage", None)))
            batch.append(ev(AdminCommanded(op, rng.choice(submitters), value, "root",  # type: ignore[arg-type]
                                           "bench"), "userprio@cm"))
        elif roll < 0.953:
            batch.append(ev(ConfigChanged("PRIORITY_HALFLIFE", rng.choice(("43200", "86400")),
                                          "root"), "config@cm"))
        elif roll < 0.96 and recent:
            batch.append(rng.choice(recent))  # a redelivered duplicate: must change nothing
        for env in batch:
            yield env
            emitted += 1
            if emitted >= n:
                return
        recent = (recent + batch)[-50:]


# --------------------------------------------------------------------------- paths

def timed(label: str, n: int, fn: Any, repeat: int = 1) -> tuple[float, float]:
    """Run `fn` `repeat` times; events/s of the best and of the median run."""
    times = []
    for i in range(repeat):
        progress(f"{label}: {n:,} events{f' (run {i + 1}/{repeat})' if repeat > 1 else ''} ...")
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        progress(f"  run {i + 1}: {n / times[-1]:,.0f} events/s")
    best, median = n / min(times), n / statistics.median(times)
    progress(f"{label}: best {best:,.0f} events/s, median {median:,.0f} ({min(times):.2f}s)")
    return best, median


def bare_decode(lines: list[bytes]) -> None:
    loads = orjson.loads
    for line in lines:
        loads(line)


def embedded_fold(lines: list[bytes], settings: Any, report: dict[str, Any]) -> None:
    """Fold the log into a fresh ledger (the replay runner's loop); the ledger goes to `report`
    so its digest is taken outside the timed region (serializing the state is not folding)."""
    ledger = Ledger(settings)
    apply = ledger.apply
    derived = 0
    step = max(1, len(lines) // 4)
    t = time.perf_counter()
    with long_fold():  # the runners' collector settings (streams/gcpolicy.py)
        for i, line in enumerate(lines, 1):
            derived += len(apply(decode(line)))
            if i % step == 0:
                progress(f"  folded {i:,} ({i / (time.perf_counter() - t):,.0f} events/s so far)")
    report["derived"] = derived
    report["ledger"] = ledger


def _committed(admin: Any, group: str, topic: str) -> int:
    """The consumer group's committed offsets on `topic`, summed (0 while it has none)."""
    from kafka import errors as kerrors

    try:
        result = admin.list_group_offsets({group: None})
    except kerrors.KafkaError:  # the group coordinator may still be loading
        return 0
    return sum(meta.offset for tp, meta in result.get(group, {}).items()
               if tp.topic == topic and meta.offset > 0)


class FaustRun:
    """The log produced once to a fresh events topic on `bootstrap`; `worker` starts faust
    workers of an app on it (each app its own consumer group and changelogs)."""

    def __init__(self, bootstrap: str, lines: list[bytes], envs: list[Envelope],
                 knobs: dict[str, str]) -> None:
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic

        self.bootstrap, self.knobs, self.n = bootstrap, knobs, len(lines)
        self.logs: dict[int, Path] = {}  # per worker pid, its log
        self.run = uuid.uuid4().hex[:8]
        self.topic = f"bench.events.{self.run}"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_topics([NewTopic(self.topic, 1, 1)])
        finally:
            admin.close()
        progress(f"faust: producing {len(lines):,} events to {self.topic} ...")
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20,
                                 acks=1)
        for env, line in zip(envs, lines):
            producer.send(self.topic, value=line, key=partition_key(env).encode())
        producer.flush()
        producer.close()

    def worker(self, app_id: str) -> subprocess.Popen[bytes]:
        """Start a worker of `app_id` (its log in a fresh directory)."""
        workdir = Path(tempfile.mkdtemp(prefix=f"{app_id}-"))
        config = workdir / "condor_config"
        config.write_text("".join(f"{k} = {v}\n" for k, v in self.knobs.items()))
        env_vars = {**os.environ, "POOLLEDGER_BROKER": f"kafka://{self.bootstrap}",
                    "POOLLEDGER_FAUST_APP": app_id, "POOLLEDGER_EVENTS_TOPIC": self.topic,
                    "POOLLEDGER_CONFIG": str(config), "POOLLEDGER_HOME": str(workdir),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                os.environ.get("PYTHONPATH")]))}
        log = open(workdir / "worker.log", "wb")
        progress(f"faust: worker {app_id} (log {workdir / 'worker.log'}) ...")
        proc = subprocess.Popen([sys.executable, "-m", "streams.faust_app", "worker", "-l",
                                 "warn", "--without-web"],
                                cwd=workdir, env=env_vars, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.logs[proc.pid] = workdir / "worker.log"
        return proc

    def wait(self, proc: subprocess.Popen[bytes], app_id: str, until: int, t: float,
             timeout: float) -> None:
        """Until the committed offset of `app_id` passes `until` (polled every 0.1 s: a 1 s
        poll quantised a ~10 s run to whole seconds); progress from `t` on."""
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            done, last = 0, 0.0
            while done < until:
                if proc.poll() is not None:
                    raise RuntimeError(f"faust worker exited with {proc.returncode}; see "
                                       f"{self.logs[proc.pid]}")
                if time.perf_counter() - t > timeout:
                    raise TimeoutError(f"faust: only {done:,} of {until:,} committed "
                                       f"after {timeout:.0f}s")
                time.sleep(0.1)
                done = _committed(admin, app_id, self.topic)
                if time.perf_counter() - last > 10:
                    last = time.perf_counter()
                    progress(f"  faust committed {done:,} ({done / (last - t):,.0f} events/s so far)")
        finally:
            admin.close()

    def committed(self, app_id: str) -> int:
        """The committed offset of `app_id` on the events topic now."""
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            return _committed(admin, app_id, self.topic)
        finally:
            admin.close()

    def state_matches(self, app_id: str, check_state: str) -> bool:
        """Whether the ledger in `app_id`'s changelogs has the embedded fold's digest."""
        from streams.faust_adapter import read_state

        led = read_state(self.bootstrap, load_settings(env={}, overrides=self.knobs), app_id)
        digest = hashlib.sha256(led.to_json().encode()).hexdigest()[:16] if led else None
        progress(f"faust: {app_id}'s changelog state {'matches' if digest == check_state else 'DIFFERS from'}"
                 f" the embedded fold ({digest} vs {check_state})")
        return digest == check_state


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a worker as an operator would (SIGTERM), killing it if it has not gone in 60 s."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) the process has used so far: on a shared machine a
    steadier measure than the wall clock."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def faust_fold(run: FaustRun, timeout: float, check_state: str | None,
               report: dict[str, Any]) -> float:
    """Run a faust worker on the produced log, timed until it committed all (start-up
    included); events/s. Its peak RSS goes to `report`."""
    app_id = f"poolledger-bench-{run.run}"
    t = time.perf_counter()
    proc = run.worker(app_id)
    try:
        run.wait(proc, app_id, run.n, t, timeout)
        dt = time.perf_counter() - t
        report["faust_rss_mb"] = peak_rss_mb(proc.pid)
        report["faust_cpu_seconds"] = cpu_seconds(proc.pid)
    finally:
        _stop(proc)
    eps = run.n / dt
    progress(f"faust: {eps:,.0f} events/s ({dt:.1f}s, includes worker start-up); "
             f"{report['faust_cpu_seconds']:.1f} CPU-s; peak RSS {report['faust_rss_mb']:,.0f} MB")
    if check_state is not None:
        report["faust_state_match"] = run.state_matches(app_id, check_state)
    return eps


def faust_restore(run: FaustRun, timeout: float, check_state: str | None,
                  report: dict[str, Any]) -> float:
    """A worker of a fresh app folds half the log and is killed with SIGKILL; the seconds
    from starting its replacement until that one has restored the tables from their
    changelogs (faust's recovery, then the ledger rebuilt from the entries), rejoined the
    group (the dead member's session times out) and folded past the offset the killed one
    had committed. The replacement then folds the rest: its state must be the embedded one."""
    app_id = f"poolledger-bench-{run.run}-restore"
    t = time.perf_counter()
    first = run.worker(app_id)
    try:
        run.wait(first, app_id, run.n // 2, t, timeout)
    finally:
        first.kill()
        first.wait()
    at_kill = run.committed(app_id)
    progress(f"faust: killed the worker (SIGKILL) at offset {at_kill:,}; restarting ...")
    t = time.perf_counter()
    second = run.worker(app_id)
    try:
        run.wait(second, app_id, at_kill + 1, t, timeout)
        restore = time.perf_counter() - t
        progress(f"faust: restored and caught up in {restore:.1f}s; folding the rest ...")
        run.wait(second, app_id, run.n, t, timeout)
    finally:
        _stop(second)
    if check_state is not None:
        report["faust_restore_state_match"] = run.state_matches(app_id, check_state)
    return restore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--slots", type=int, default=2000, help="pool size of the generated log")
    ap.add_argument("--quota-updates", choices=("event", "cycle"), default="cycle",
                    help="POOLLEDGER_QUOTA_UPDATES for every path (default: cycle, the knob's "
                         "default)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of (a) and (b); the best counts (the median is printed too)")
    ap.add_argument("--skip-faust", action="store_true")
    ap.add_argument("--faust-timeout", type=float, default=900.0)
    args = ap.parse_args()

    progress(f"generating a job-heavy log of {args.events:,} events ...")
    envs = list(job_heavy_events(args.events, slots=args.slots))
    lines = [encode(e) for e in envs]
    kinds: dict[str, int] = {}
    for e in envs:
        kinds[e.type] = kinds.get(e.type, 0) + 1
    progress("mix: " + ", ".join(f"{k} {v / len(envs):.1%}" for k, v in
                                 sorted(kinds.items(), key=lambda kv: -kv[1])))
    knobs = {**mixed_config(), "POOLLEDGER_QUOTA_UPDATES": args.quota_updates}
    settings = load_settings(env={}, overrides=knobs)
    n = len(lines)
    report: dict[str, Any] = {}
    decode_eps, _ = timed("(a) bare orjson.loads", n, lambda: bare_decode(lines), args.repeat)
    embedded_eps, embedded_median = timed("(b) embedded fold (decode + Ledger.apply)", n,
                                           lambda: embedded_fold(lines, settings, report), args.repeat)
    report["state_sha256"] = hashlib.sha256(report.pop("ledger").to_json().encode()).hexdigest()[:16]
    faust_eps = restore = float("nan")
    faust_note = "skipped"
    if not args.skip_faust:
        try:
            with broker(progress) as bootstrap:
                run = FaustRun(bootstrap, lines, envs, knobs)
                faust_eps = faust_fold(run, args.faust_timeout, report.get("state_sha256"), report)
                faust_note = "ok"
                restore = faust_restore(run, args.faust_timeout, report.get("state_sha256"), report)
        except Exception as exc:  # noqa: BLE001 - report, keep the other numbers
            faust_note = type(exc).__name__
            progress(f"faust path failed: {exc}")
    ratio = embedded_eps / decode_eps
    progress(f"embedded is {ratio:.3f}x bare decoding; target 100,000 events/s: "
             f"{'met' if embedded_eps >= 100_000 else 'NOT met'}")
    print(f"events={n} slots={args.slots} quota_updates={args.quota_updates} decode_eps={decode_eps:.0f} embedded_eps={embedded_eps:.0f} "
          f"embedded_median_eps={embedded_median:.0f} faust_eps={faust_eps:.0f} embedded_vs_decode={ratio:.4f} "
          f"faust_vs_decode={faust_eps / decode_eps:.4f} faust={faust_note} "
          f"derived={report.get('derived')} state_sha256={report.get('state_sha256')} "
          f"faust_state_match={report.get('faust_state_match')} "
          f"faust_restore_seconds={restore:.1f} "
          f"faust_restore_state_match={report.get('faust_restore_state_match')} "
          f"faust_rss_mb={report.get('faust_rss_mb', float('nan')):.0f} "
          f"faust_cpu_seconds={report.get('faust_cpu_seconds', float('nan')):.1f}")


if __name__ == "__main__":
    main()
