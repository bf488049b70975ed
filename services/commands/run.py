"""`poolledger run [SCENARIO]`: the main job — a simulated pool, the processors and the
negotiator on one log, in compressed virtual time, ending with condor_userprio's table, cycle
statistics and the seed's "User Priority" / "Fair Share" graphs.

By default everything goes to the data directory every other command reads (POOLLEDGER_HOME,
default `./out`): a fresh embedded log per run, so `make run` then `poolledger userprio`
shows that run. `--out DIR` writes the run into DIR instead (`poolledger --home DIR ...` reads
it). A log is replaced only when a run wrote it and nothing was appended since (no admin
edit, no import: `RUN_MARKER`), or with `--overwrite`; otherwise the run is refused with one
line, and an explicit `--home DIR` holding events is never replaced without `--overwrite` (a
second run's events would collide with the first's ids). The history database goes with the
log it was made from. With `--broker kafka://HOST:PORT` the run appends
to its own Kafka topic and a faust worker (its own app id) folds that topic; its changelog
state must equal the loop's ledger, or the command exits 1; its files go to `--out` (default
`kafka/` in the data directory, so an embedded run's files are left alone).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.config import SettingsLike
from services.commands import broker_url, home_dir, kafka_login
from streams.log.embedded import EmbeddedLog, looks_like_log_dir
from streams.log.events import EventLog, open_log
from streams.log.files import atomic_file
from streams.log.port import Log, LogError
from streams.log.topics import EVENTS

if TYPE_CHECKING:  # the pool, the loop and the negotiator load when a run starts, not for --help
    from services.mainloop import FaustCheck, MainLoop, RunResult
    from services.pool import Scenario

#: Where bundled scenarios live: `scenarios/` beside the packages (an editable install or a
#: source checkout, which is what `make run` uses).
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
DEFAULT_SCENARIO = "small"
#: Longest virtual run (ten years): beyond it a typo like `--hours 1e9` would fill the disk.
MAX_HOURS = 10 * 365 * 24.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="run a simulated pool end to end (embedded log by default)",
        description="Run a scenario's pool with the ledger and the negotiator on one log, "
                    "then print the userprio table and cycle statistics and write plots.")
    p.add_argument("scenario", nargs="?", default=DEFAULT_SCENARIO, metavar="SCENARIO",
                   help="a scenario file (.toml/.json) or a bundled scenario name "
                        f"({', '.join(bundled()) or 'none found'}); default {DEFAULT_SCENARIO}")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="where plots, the exported log and (without --home) the log go "
                        "(default: the data directory, --home; with --broker its kafka/)")
    p.add_argument("--hours", type=float, metavar="H",
                   help="virtual hours to run (default: the scenario's duration)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--no-history", action="store_true",
                   help="do not bring the history database (history.duckdb) up to date")
    p.add_argument("--adstash", metavar="URL",
                   help="index the run's job.history into this Elasticsearch while it runs "
                        "(the adstash sink; other ADSTASH_* knobs apply)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the log (and the history database made from it) already in "
                        "the output directory, even one holding edits or imports")
    p.add_argument("--negotiator-service", action="store_true",
                   help="do not negotiate in this process: wait for the cycles of `poolledger "
                        "negotiator --name negotiator@<the scenario's central manager>` on the "
                        "log (embedded log; start the negotiators on the same --home first)")
    p.set_defaults(func=run)


def bundled() -> list[str]:
    """Names of the bundled scenarios."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml")) if SCENARIO_DIR.is_dir() else []


def resolve_scenario(name: str) -> Path:
    """A scenario path: an existing file, else a bundled scenario by name."""
    path = Path(name)
    if path.exists():
        return path
    for candidate in (SCENARIO_DIR / name, SCENARIO_DIR / f"{name}.toml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no scenario {name!r}: not a file, and not one of the bundled "
                            f"scenarios ({', '.join(bundled()) or 'none found in ' + str(SCENARIO_DIR)})")


def check_scenario_config(scenario: Scenario, settings: Any) -> str | None:
    """Why the scenario's knobs (its `[config]` and its `config` actions, in time order) would
    not load, or None. They reach the log as `config.changed` events, whose fold ignores a bad
    value; checked here, a typo or `PRIORITY_HALFLIFE = -1` stops the run before it starts
    (exit 2) instead of being counted as applied. Unknown names are warned about, as in files
    (the simulated startds' and schedds' knobs are in the one table, schemas.knobs)."""
    from schemas.errors import ConfigError
    from schemas.knobs import find_knob, unknown_knob_message
    from services.pool.sim import issued_text

    layers: list[tuple[str, dict[str, str]]] = [
        ("[config]", {k: issued_text(v) for k, v in scenario.config.items()})]
    for action in sorted(scenario.actions, key=lambda a: a.at):
        if action.kind == "config":
            knob = str(action.params["knob"])
            layers.append((f"config action at {action.at:g} s",
                           {knob: issued_text(action.params["value"])}))
    current = settings
    for where, knobs in layers:
        for knob in knobs:
            if find_knob(knob) is None:
                print(f"poolledger run: warning: {scenario.path}: {where} "
                      f"{unknown_knob_message(knob)}", file=sys.stderr)
        try:
            current = current.with_overrides(knobs, source=f"{scenario.path} {where}")
        except ConfigError as exc:
            return f"{where}: {exc}"
    return None


def _events_in(log: Log, topic: str) -> int:
    try:
        return sum(log.end_offsets(topic).values())
    except LogError:
        return 0


def _explicit_home(args: argparse.Namespace, settings: Any) -> bool:
    return bool(getattr(args, "home", None)) or settings.is_set("POOLLEDGER_HOME")


def _embedded_home(args: argparse.Namespace, settings: SettingsLike) -> tuple[Path, bool]:
    """(home of the embedded log, whether this run owns it and may replace an old run's):
    a home named by --home / POOLLEDGER_HOME is never replaced; `--out DIR` or the default
    data directory is the run's own."""
    if _explicit_home(args, settings):
        return home_dir(settings, create=False), False
    return (args.out if args.out is not None else home_dir(settings, create=False)), True


def _out_dir(args: argparse.Namespace, settings: SettingsLike, broker: str | None) -> Path:
    """Where the plots and the exported log go (see `--out`)."""
    if args.out is not None:
        return Path(args.out)
    home = home_dir(settings, create=False)
    return home / "kafka" if broker else home


def _looks_like_embedded_log(path: Path) -> bool:
    return path.is_dir() and looks_like_log_dir(path)


#: The embedded log's state row naming what a run left: every topic's end offsets. A log whose
#: offsets still equal it holds nothing but that run's events, so the next run may replace it.
RUN_MARKER = "run.created"


def _end_offsets(log: EmbeddedLog) -> dict[str, dict[str, int]]:
    """Every topic's end offsets, empty topics left out (a reader may create one)."""
    ends = {t: {str(p): n for p, n in log.end_offsets(t).items()} for t in sorted(log.topics())}
    return {t: offs for t, offs in ends.items() if any(offs.values())}


def _mark_run(log: Log) -> None:
    """Record that this run wrote the log as it now ends (`RUN_MARKER`)."""
    import orjson

    if isinstance(log, EmbeddedLog):
        log.put_state(RUN_MARKER, orjson.dumps(_end_offsets(log), option=orjson.OPT_SORT_KEYS))


def _replaceable(logdir: Path, owned: bool, overwrite: bool) -> str | None:
    """Why the log in `logdir` may not be replaced by this run (None: it may). Only a log a
    run wrote and nothing appended to since (`RUN_MARKER`) in the run's own output directory
    is replaced without `--overwrite`: an admin edit or an imported history is the user's."""
    import orjson

    if overwrite:
        return None
    with EmbeddedLog(logdir) as log:
        events = _events_in(log, EVENTS)
        if not events:
            return None
        if not owned:
            return None  # refused below, naming the events and --overwrite
        marker = log.state(RUN_MARKER)
        if marker is not None and orjson.loads(marker) == _end_offsets(log):
            return None
    what = ("events appended since the run that wrote it (admin edits, imports)"
            if marker is not None else "events no `poolledger run` wrote")
    return (f"{logdir} already holds a log with {what}; use another --out DIR, or --overwrite "
            "to replace it and its history database")


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    from services.pool import PoolError, load_scenario
    from services.pooldriver import NegotiatorSilentError, PoolDriverError

    try:
        path = resolve_scenario(args.scenario)
        scenario = load_scenario(path)
    except (FileNotFoundError, PoolError) as exc:  # a scenario is configuration: exit 2
        print(f"poolledger run: {exc}", file=sys.stderr)
        return 2
    if args.hours is not None and not 0 < args.hours <= MAX_HOURS:  # False for nan too
        print(f"poolledger run: --hours must be a number of hours in (0, {MAX_HOURS:g}], got "
              f"{args.hours}", file=sys.stderr)
        return 2
    span = scenario.end - scenario.start
    if args.hours is not None and args.hours * 3600.0 > span:
        print(f"poolledger run: note: scenario {scenario.name} lasts {span / 3600.0:g} h; its "
              f"submitters submit nothing after, so the last {args.hours - span / 3600.0:g} h "
              "of --hours only drain the queues and decay the priorities (users with no "
              "usage left leave the userprio table)", file=sys.stderr)
    problem = check_scenario_config(scenario, settings)
    if problem is not None:
        print(f"poolledger run: {path}: {problem}", file=sys.stderr)
        return 2
    broker = broker_url(settings)
    if broker and args.negotiator_service:
        print("poolledger run: --negotiator-service needs the embedded log (a Kafka run "
              "writes a topic of its own, which no negotiator service follows)", file=sys.stderr)
        return 2
    out = args.out = _out_dir(args, settings, broker)
    out.mkdir(parents=True, exist_ok=True)
    if broker:
        return _run_kafka(args, settings, scenario, path, broker)
    home, owned = _embedded_home(args, settings)
    logdir = home / "log"
    if logdir.exists() and not args.negotiator_service:  # negotiators may have it open
        if not _looks_like_embedded_log(logdir):
            print(f"poolledger run: {logdir} exists and is not an embedded log; "
                  "choose another --out", file=sys.stderr)
            return 1
        refusal = _replaceable(logdir, owned, args.overwrite)
        if refusal is not None:
            print(f"poolledger run: {refusal}", file=sys.stderr)
            return 1
        if args.overwrite or owned:
            shutil.rmtree(logdir)  # a run's own log, or one the user lets go (--overwrite)
            from adstash.history.db import default_path, remove_db

            remove_db(default_path(home))  # its history database, positions included
    home.mkdir(parents=True, exist_ok=True)
    log = open_log(None, home)
    try:
        already = _events_in(log, EVENTS)
        if already:
            print(f"poolledger run: the log in {logdir} already holds {already} events of "
                  "another run; use a fresh --home DIR (or omit --home), or --overwrite to "
                  "replace it", file=sys.stderr)
            return 1
        print(f"PoolLedger run: scenario {scenario.name} ({path}), seed {args.seed}, "
              f"embedded log in {logdir}")
        try:
            loop = _loop(args, scenario, settings, log)
        except PoolDriverError as exc:
            print(f"poolledger run: {exc}", file=sys.stderr)
            return 2
        live = _live_adstash(args, settings, lambda: open_log(None, home), EVENTS)
        try:
            result = loop.run(args.hours)
        except NegotiatorSilentError as exc:
            print(f"poolledger run: {exc}", file=sys.stderr)
            return 1
        exported = out / "events.jsonl"
        EventLog(log).export_jsonl(EVENTS, exported)
        if not args.negotiator_service:
            _mark_run(log)
        history_db = None if args.no_history else _update_history(log, home)
    finally:
        log.close()
    _report(result, scenario, out, exported, home)
    if history_db is not None:
        print(f"History database: {history_db} (poolledger --home {home} history | stats | "
              "sql | report)")
    return _close_adstash(live)


def _loop(args: argparse.Namespace, scenario: Scenario, settings: SettingsLike, log: Log) -> MainLoop:
    """The run's loop: negotiating itself, or (`--negotiator-service`) waiting for the
    negotiator service's cycles on the log."""
    from services.mainloop import MainLoop
    from services.pooldriver import PoolDriver

    progress = None if args.quiet else sys.stderr
    if not args.negotiator_service:
        return MainLoop(scenario, seed=args.seed, settings=settings, log=log, topic=EVENTS,
                        progress=progress)
    name = f"negotiator@{scenario.central_manager}"
    driver = PoolDriver(scenario, seed=args.seed, settings=settings, log=log, negotiator=name,
                        progress=progress)
    print(f"Negotiation cycles: from `poolledger negotiator --name {name}` on this log")
    return driver


def _live_adstash(args: argparse.Namespace, settings: SettingsLike, connect: Any, topic: str) -> Any:
    """`--adstash URL`: the adstash sink following `topic` on its own log connection."""
    if not args.adstash:
        return None
    from services.commands.adstash import LiveAdstash

    return LiveAdstash(args.adstash, settings, connect(), topic, retry_for=10.0)


def _close_adstash(live: Any) -> int:
    if live is None:
        return 0
    line, ok = live.close()
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _update_history(log: Log, home: Path, topic: str | None = None) -> Path:
    """Bring the run's history database up to the log's end (`poolledger history update`);
    a Kafka run's database reads its own `topic`."""
    from adstash.history.db import default_path
    from adstash.history.target import catch_up

    catch_up(log, default_path(home), topics=None if topic is None else (topic,))
    return default_path(home)


def _run_kafka(args: argparse.Namespace, settings: SettingsLike, scenario: Scenario, path: Path,
               broker: str) -> int:
    from services.mainloop import FaustCheck, MainLoop, settings_config_text
    from streams.log.kafka import parse_broker_url
    from streams.log.port import TopicSpec

    run_id = f"run-{scenario.name}-s{args.seed}-{uuid.uuid4().hex[:8]}"
    topic, app_id = f"poolledger.{run_id}.events", f"poolledger-{run_id}"
    out: Path = args.out
    config = out / "faust.conf"
    with atomic_file(config) as f:
        f.write(settings_config_text(settings).encode())
    bootstrap = parse_broker_url(broker)
    log = open_log(broker, out, kafka_login(settings))
    if not args.no_history:
        from adstash.history.db import default_path, remove_db

        remove_db(default_path(out))  # a previous Kafka run's database: this run's replaces it
    print(f"PoolLedger run: scenario {scenario.name} ({path}), seed {args.seed}, "
          f"Kafka {bootstrap} topic {topic}, faust app {app_id}")
    worker: FaustCheck | None = None
    try:
        log.create_topic(TopicSpec(topic))
        # The faust processors fold the run's topic while the loop appends to it.
        worker = FaustCheck(bootstrap, app_id, topic, config, out / "faust")
        loop = MainLoop(scenario, seed=args.seed, settings=settings, log=log, topic=topic,
                        derived_topic=None, progress=None if args.quiet else sys.stderr)
        # the adstash sink: a consumer group of the run's topic beside the faust worker
        live = _live_adstash(args, settings,
                             lambda: open_log(broker, out, kafka_login(settings)), topic)
        result = loop.run(args.hours)
        exported = out / "events.jsonl"
        EventLog(log).export_jsonl(topic, exported)
        history_db = None if args.no_history else _update_history(log, out, topic)
        state = worker.wait(settings, result.ledger.applied)
        problem = worker.compare(state, result.ledger)
        worker.stop()
    finally:
        if worker is not None:
            worker.stop()
        log.close()
    _report(result, scenario, out, exported, None, topic)
    print(f"Events topic: {topic} (query it: poolledger --broker {broker} --topic {topic} "
          "userprio | why | status | q ...)")
    if history_db is not None:
        print(f"History database: {history_db} (poolledger --broker {broker} --home {out} --topic {topic} "
              "history | stats | sql | report)")
    adstash_failed = _close_adstash(live)
    if problem is not None:
        print(f"poolledger run: faust check: MISMATCH — {problem} (worker log: "
              f"{worker.logfile})", file=sys.stderr)
        return 1
    print(f"faust check: OK — the faust worker's state equals the loop's "
          f"({result.ledger.applied} events applied)")
    return adstash_failed


def _report(result: RunResult, scenario: Scenario, out: Path, exported: Path,
            home: Path | None, topic: str | None = None) -> None:
    """The userprio table, cycle statistics and the plots."""
    from services.commands.userprio.views import format_userprio
    from services.plots import write_plots

    led = result.ledger
    now = result.end
    print()
    print(format_userprio(led.priorities(now), now=now,
                          last_update=led.last_priority_update or now,
                          groups=led.group_quotas()), end="")
    for name, neg in sorted(result.negotiators.items()):
        # named negotiators: each one's own accounting (`poolledger userprio -name NEG`)
        print(f"\nNegotiator {name} (its own accounting):")
        print(format_userprio(neg.priorities(now), now=now,
                              last_update=neg.last_priority_update or now,
                              groups=neg.group_quotas()), end="")
    d = result.durations
    mean_ms = 1000.0 * sum(d) / len(d) if d else 0.0
    max_ms = 1000.0 * max(d) if d else 0.0
    hours = (result.end - result.start) / 3600.0
    print()
    print(f"Virtual time: {hours:.1f} h in {result.wall_seconds:.1f} s; events: {result.events}")
    print(f"Negotiation cycles: {result.cycles}   matches: {result.matches}   "
          f"cycle duration mean {mean_ms:.1f} ms, max {max_ms:.1f} ms")
    if result.stale_matches:
        print(f"Matches the pool could not act on (slot gone): {result.stale_matches}")
    if result.rejections:
        print("Rejections by reason (jobs, summed over cycles):")
        for reason, n in sorted(result.rejections.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {reason:45} {n:8}")
    paths = write_plots(result.samples, out, scenario.name)
    print("Plots: " + "  ".join(str(p) for p in paths))
    print(f"Log exported: {exported}")
    if home is not None:
        print(f"Ask why a job did not run: poolledger --home {home} why JOB_ID")
    else:
        print(f"Ask why a job did not run: poolledger why JOB_ID --log {exported}")
