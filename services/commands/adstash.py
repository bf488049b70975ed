"""`poolledger adstash`: index job history into Elasticsearch/OpenSearch/JSON files, as
condor_adstash does, from the log (the sink runner: checkpoint after the cluster's ack)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.commands import broker_url, events_topic, home_dir

if TYPE_CHECKING:
    from schemas.config import SettingsLike


def register(sub: Any) -> None:
    p = sub.add_parser("adstash", help="index job.history events into Elasticsearch, "
                                       "OpenSearch or JSON files (condor_adstash's options)")
    p.add_argument("--interface", choices=("elasticsearch", "opensearch", "jsonfile"),
                   help="where documents go [knob ADSTASH_INTERFACE]")
    # adstash's deprecated --es_* spellings are accepted as it accepts them
    p.add_argument("--se_host", "--es_host", help="HOST:PORT or URL [ADSTASH_SE_HOST]")
    p.add_argument("--se_index_name", "--es_index_name",
                   help="first index; documents go to its write alias [ADSTASH_SE_INDEX_NAME]")
    p.add_argument("--se_bunch_size", "--es_bunch_size", type=int,
                   help="documents per bulk request [ADSTASH_SE_BUNCH_SIZE]")
    p.add_argument("--se_username", "--es_username",
                   help="basic-auth user [ADSTASH_SE_USERNAME]; the password comes from "
                        "ADSTASH_SE_PASSWORD only")
    p.add_argument("--se_use_https", "--es_use_https", action="store_true", default=None,
                   help="HTTPS [ADSTASH_SE_USE_HTTPS]")
    p.add_argument("--checkpoint_file", type=Path, metavar="PATH",
                   help="keep the checkpoint (log positions indexed) in this JSON file, "
                        "written after each acknowledged bulk, instead of the consumer group "
                        "poolledger.sink.adstash-<interface> (created if missing: starts at "
                        "the log's beginning)")
    for option, why in _DAEMON_OPTIONS.items():
        p.add_argument(option, nargs="?", const=True, default=None, help=argparse.SUPPRESS,
                       dest=f"refused_{option.lstrip('-')}", metavar=why)
    p.add_argument("--json_dir", type=Path, help="jsonfile interface directory [ADSTASH_JSON_DIR]")
    p.add_argument("--once", "--standalone", dest="once", action="store_true",
                   help="catch up with the log, then exit (default: follow the log)")
    p.add_argument("--sample_interval", type=float,
                   help="seconds between polls of the log when following "
                        "[ADSTASH_SAMPLE_INTERVAL]")
    p.add_argument("--ad_file", type=Path, action="append", default=[], metavar="FILE",
                   help="import this history file into the log first (repeatable)")
    p.add_argument("--retry_for", type=float, default=60.0, metavar="SECONDS",
                   help="with --once: give up after the cluster was unreachable this long "
                        "(default 60; following never gives up)")
    p.set_defaults(func=run)


#: condor_adstash options that poll HTCondor daemons (or set its own logging/threads); here
#: history enters through the log, so each is refused with what to do instead.
_DAEMON_OPTIONS: dict[str, str] = {
    **{o: "PoolLedger reads job history from its log, not from daemons: import history files "
          "with --ad_file FILE or `poolledger log import-history FILE`"
       for o in ("--schedd_history", "--startd_history", "--schedd_job_epoch_history",
                 "--collectors", "--schedds", "--startds", "--schedd_history_max_ads",
                 "--startd_history_max_ads", "--schedd_history_timeout",
                 "--startd_history_timeout", "--threads")},
    **{o: "log lines go to stderr; `poolledger -v adstash` logs more"
       for o in ("--log_file", "--log_level")},
    **{o: "not supported; use --interface jsonfile to see the documents without a cluster"
       for o in ("--read_only", "--dry_run")},
}


class LiveAdstash:
    """`poolledger run --adstash URL`: the adstash sink follows the run's topic on its own log
    connection (a consumer of the log like any other) while the simulation appends, and
    catches up to the end when the run is over (`close()`)."""

    def __init__(self, url: str, settings: SettingsLike, log: Any, topic: str,
                 retry_for: float = 60.0) -> None:
        from adstash.target import AdstashTarget
        from streams.sink import SinkRunner

        names = ("interface", "se_index_name", "se_bunch_size", "se_username", "se_use_https",
                 "json_dir")
        _, options = _options(argparse.Namespace(**{n: None for n in names}, se_host=url),
                              settings)
        self.url = options.url
        target = AdstashTarget.from_options("elasticsearch", options)
        target.topics = (topic,)
        self.log = log
        self.retry_for = retry_for
        self.runner = SinkRunner(log, target, progress=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="adstash", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        from adstash.convert import AdstashError
        from streams.log.port import LogError

        try:
            self.runner.follow(self._stop, 1.0)
        except (LogError, AdstashError):
            pass  # the catch-up in close() meets it again and reports it in one line

    def close(self) -> tuple[str, bool]:
        """Stop following, catch up to the log's end; (summary line, whether it worked)."""
        from adstash.convert import AdstashError
        from streams.log.port import LogError
        from streams.sink import TargetUnavailableError

        self._stop.set()
        self._thread.join()
        self.runner.give_up_after = self.retry_for
        try:
            self.runner.run_once()
            docs = sum(sum(self.log.committed(self.runner.group, t).values())
                       for t in self.runner.target.topics)
            return (f"adstash: the run's events indexed into {self.url} "
                    f"(checkpoint {docs} events, lag {self.runner.lag()}, refused ones in "
                    f"{self.runner.dlq})", True)
        except (TargetUnavailableError, LogError, AdstashError) as exc:
            return (f"adstash: {exc}; {self.runner.lag()} events not indexed yet "
                    f"(poolledger adstash --once on the run's log catches up)", False)
        finally:
            self.runner.close()
            self.log.close()


def _options(args: argparse.Namespace, settings: SettingsLike) -> tuple[str, Any]:
    from adstash.interfaces import SearchEngineOptions

    def pick(arg: Any, knob: str) -> Any:
        return arg if arg is not None else settings.get(knob)

    home = home_dir(settings)
    json_dir = args.json_dir or settings.get("ADSTASH_JSON_DIR") or home / "log"
    return (str(pick(args.interface, "ADSTASH_INTERFACE")), SearchEngineOptions(
        host=str(pick(args.se_host, "ADSTASH_SE_HOST")),
        index_name=str(pick(args.se_index_name, "ADSTASH_SE_INDEX_NAME")),
        username=pick(args.se_username, "ADSTASH_SE_USERNAME") or None,
        password=settings.get("ADSTASH_SE_PASSWORD") or None,
        use_https=bool(pick(args.se_use_https, "ADSTASH_SE_USE_HTTPS")),
        bunch_size=int(pick(args.se_bunch_size, "ADSTASH_SE_BUNCH_SIZE")),
        timeout=float(settings.get("ADSTASH_SE_TIMEOUT")),
        ca_certs=settings.get("ADSTASH_SE_CA_CERTS") or None,
        log_dir=str(json_dir),
        shards=settings.get("ADSTASH_SE_NUMBER_OF_SHARDS"),      # None: the engine's default
        replicas=settings.get("ADSTASH_SE_NUMBER_OF_REPLICAS")))


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    from adstash.interfaces import InterfaceError
    from adstash.sources import TimeBound, import_history
    from adstash.convert import AdstashError
    from adstash.target import AdstashTarget, CheckpointFile, CheckpointFileError
    from streams.log.events import EventLog, ensure_topics, open_log
    from streams.log.port import LogError
    from streams.sink import SinkRunner, Target, TargetUnavailableError

    for option, why in _DAEMON_OPTIONS.items():
        if getattr(args, f"refused_{option.lstrip('-')}") is not None:
            print(f"poolledger adstash: {option}: {why}", file=sys.stderr)
            return 2
    if args.se_bunch_size is not None and args.se_bunch_size < 1:
        print("poolledger adstash: --se_bunch_size must be >= 1", file=sys.stderr)
        return 2
    for path in args.ad_file:
        if not path.is_file():
            print(f"poolledger adstash: --ad_file {path}: no such file", file=sys.stderr)
            return 2
    interface, options = _options(args, settings)
    try:
        target = AdstashTarget.from_options(interface, options)
    except InterfaceError as exc:
        print(f"poolledger adstash: {exc}", file=sys.stderr)
        return 2
    target.topics = (events_topic(settings),)  # `--topic`: a Kafka run's own
    try:
        log = open_log(broker_url(settings), home_dir(settings))
        ensure_topics(log)
    except LogError as exc:
        print(f"poolledger adstash: {exc}", file=sys.stderr)
        return 1
    sink: Target = target if args.checkpoint_file is None else CheckpointFile(
        target, args.checkpoint_file, log)
    runner = SinkRunner(log, sink, give_up_after=args.retry_for if args.once else None)
    try:
        if args.ad_file:
            rep = import_history(EventLog(log), args.ad_file, TimeBound(
                float(settings.get("POOLLEDGER_MAX_EVENT_SKEW")), time.time()))
            for reason in rep.refused:
                print(f"poolledger adstash: refused: {reason}", file=sys.stderr)
            print(f"imported {rep.imported} job ads ({rep.already} already in the log, "
                  f"{rep.rejected} malformed to the DLQ)")
        if args.once:
            report = runner.run_once()
        else:
            stop = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            poll = args.sample_interval or float(settings.get("ADSTASH_SAMPLE_INTERVAL"))
            report = runner.follow(stop, poll_seconds=poll)
    except TargetUnavailableError as exc:
        print(f"poolledger adstash: gave up after {args.retry_for:g} s of retries: {exc}; "
              f"checkpoint kept, lag {runner.lag()}", file=sys.stderr)
        return 1
    except CheckpointFileError as exc:  # the file an admin named: usage, exit 2
        print(f"poolledger adstash: {exc}", file=sys.stderr)
        return 2
    except (LogError, AdstashError, OSError) as exc:
        print(f"poolledger adstash: {exc}", file=sys.stderr)
        return 1
    finally:
        runner.close()
        log.close()
    if isinstance(sink, CheckpointFile) and sink.replaced:
        print(f"poolledger adstash: note: --checkpoint_file {sink.path} counted in a log since "
              "replaced; this log was indexed from its start (documents of the old log stay in "
              "the index unless their ids recur)", file=sys.stderr)
    print(f"adstash ({interface} {options.url if interface != 'jsonfile' else options.log_dir}): "
          f"{target.indexed} documents indexed from {report.delivered} events read (only "
          f"job.history events are documents), {report.rejected} rejected to "
          f"{runner.dlq}, {report.dead_lettered_at_decode} undecodable, lag {report.lag}")
    return 0
