"""`userprio` from the runner's snapshot against a full replay of the same log, in one run.

    python bench/queries.py [--events 10000000] [--slots 2000] [--repeat 3]

The log is bench/accounting.py's job-heavy log (`job_heavy_events`: a 2,000-slot pool, 240
submitters in the mixed config's groups, ~90% job events) in an embedded log under
`compose.kafka.cache_root()/bench-queries/`, generated once per size (generation is not
measured; delete the directory to regenerate): streamed into the log in batches of 50,000,
~465 bytes per event on disk (10,000,000 events: ~4.6 GB, ~3 minutes). The embedded runner
(`streams.runner`) folds it once and leaves its snapshot in the log (setup, not measured,
skipped when a usable snapshot already covers the log); it keeps no derived events (about 3.4
per event here, ~10 GB more at 10M, which no query reads).

Paths, both `poolledger userprio` run in this process (`services.cli.main`), output compared:
  (a) snapshot: the command as users run it: it restores the newest snapshot and folds the
      tail (none here: the snapshot covers the log, as at the end of `poolledger run`);
  (b) replay: the same command with `--set PRIORITY_HALFLIFE=86400`, the knob's default: the
      same answer, but knobs set away from the snapshot's make it a what-if, which folds the
      whole log from the start (what every query did before snapshots).
Target (issue 11): (a) < 2 s on 10,000,000 events. The last line is key=value pairs.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import resource
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the repository, not bench/ (whose adstash.py would shadow the adstash package the CLI loads)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.accounting import job_heavy_events, progress  # noqa: E402
from compose.kafka import cache_root  # noqa: E402
from schemas.settings import Settings, load_settings  # noqa: E402
from services.cli import main as cli  # noqa: E402
from streams.log.embedded import EmbeddedLog  # noqa: E402
from streams.log.events import EventLog  # noqa: E402
from streams.log.port import TopicSpec  # noqa: E402
from streams.log.topics import DERIVED, EVENTS  # noqa: E402
from streams.runner import EmbeddedRunner  # noqa: E402
from streams.snapshot import SnapshotStore  # noqa: E402
from streams.synthetic import mixed_config  # noqa: E402

CHUNK = 50_000


def prepare(home: Path, events: int, slots: int) -> None:
    """The cached log (generated when missing or incomplete)."""
    done = home / "complete"
    if done.exists():
        return
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    progress(f"generating a job-heavy log of {events:,} events in {home} (once) ...")
    t0 = time.perf_counter()
    with EmbeddedLog(home / "log") as log:
        elog = EventLog(log, batch=CHUNK)
        for topic in (EVENTS, DERIVED):
            log.create_topic(TopicSpec(topic))
        chunk = []
        written = 0
        for env in job_heavy_events(events, slots=slots):
            chunk.append(env)
            if len(chunk) >= CHUNK:
                elog.append(EVENTS, chunk)
                written += len(chunk)
                chunk = []
                if written % 1_000_000 == 0:
                    progress(f"  {written:,} events ({written / (time.perf_counter() - t0):,.0f}"
                             f"/s)")
        if chunk:
            elog.append(EVENTS, chunk)
    done.write_text(f"{events} {slots}\n")
    progress(f"generated in {time.perf_counter() - t0:.0f} s")


def snapshot_log(home: Path, settings: Settings) -> None:
    """The runner's fold of the log, leaving its snapshot (skipped when one covers it)."""
    with EmbeddedLog(home / "log") as log:
        found = SnapshotStore(log).restore(settings)
        if found.header is not None and found.header.positions == log.end_offsets(EVENTS):
            progress(f"snapshot covers the log ({found.header.events:,} events)")
            return
        progress(f"the runner folds the log (setup: {found.problem or 'tail'}) ...")
        t0 = time.perf_counter()
        runner = EmbeddedRunner(EventLog(log), settings, derived_topic=None)
        runner.run_once(every=500_000, progress=lambda n: progress(f"  {n:,} events"))
        progress(f"folded and snapshotted in {time.perf_counter() - t0:.0f} s")


def userprio(home: Path, config: Path, *extra: str) -> tuple[float, str]:
    """Seconds and stdout of one in-process `poolledger userprio`."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli(["--home", str(home), "--config", str(config), *extra, "userprio"])
    seconds = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"userprio exited {status}: {err.getvalue().strip()}")
    return seconds, out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--slots", type=int, default=2000, help="pool size of the generated log")
    ap.add_argument("--repeat", type=int, default=3, help="runs of (a); the best counts")
    args = ap.parse_args()
    home = cache_root() / "bench-queries" / f"{args.events}-{args.slots}"
    prepare(home, args.events, args.slots)
    config = home / "mixed.conf"
    config.write_text("".join(f"{k} = {v}\n" for k, v in mixed_config().items()))
    snapshot_log(home, load_settings(config))
    fast = [userprio(home, config) for _ in range(args.repeat)]
    snap_s = min(s for s, _ in fast)
    progress(f"(a) userprio from the snapshot: best {snap_s:.3f} s of {args.repeat}")
    replay_s, full = userprio(home, config, "--set", "PRIORITY_HALFLIFE=86400")
    progress(f"(b) userprio by a full replay: {replay_s:.1f} s")
    same = all(text == full for _, text in fast)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    progress(f"same answer: {same}; snapshot is {replay_s / snap_s:.0f}x faster; target < 2 s: "
             f"{'met' if snap_s < 2.0 else 'NOT met'}; peak RSS {rss:.0f} MiB")
    print(f"events={args.events} slots={args.slots} snapshot_seconds={snap_s:.3f} "
          f"replay_seconds={replay_s:.2f} speedup={replay_s / snap_s:.1f} same_answer={int(same)} "
          f"peak_rss_mib={rss:.0f}")


if __name__ == "__main__":
    main()
