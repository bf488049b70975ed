"""`poolledger gangliad`: condor_gangliad over the log — the pool's metrics to Ganglia,
Prometheus and Graphite at every GANGLIAD_INTERVAL of event time.

Publishing only the current view (gmond, the exporter, `--once --dry-run`), it starts from the
newest usable snapshot of the embedded log and folds only the events after it; Graphite,
`--openmetrics` and a following `--dry-run` want every interval, so they fold from the start.

It runs as the `gangliad` sink on the sink runner (streams/sink.py), so it reads the embedded
log and Kafka alike. Every boundary reached goes to every publisher (Graphite and
`--openmetrics` keep them all; gmond and the exporter show the latest); the view at the log's
end is published once caught up. `--once` stops there; otherwise the command follows the log.
`--dry-run` publishes nothing and lists each metric the way gangliad's NOOP mode logs it.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.commands import add_log_source, broker_url, events_topic, home_dir
from services.commands.errors import CLIError

if TYPE_CHECKING:
    from ganglia.publish import Publisher
    from ganglia.sink import MetricsTarget
    from schemas.config import SettingsLike

PUBLISHERS = ("ganglia", "prometheus", "graphite")


def register(sub: Any) -> None:
    p = sub.add_parser("gangliad", help="publish pool metrics (Ganglia, Prometheus, Graphite)",
                       description=__doc__)
    p.add_argument("--once", action="store_true", help="fold the log to its end, publish, exit")
    p.add_argument("--dry-run", action="store_true",
                   help="publish nothing; list each metric and value (gangliad's NOOP log)")
    p.add_argument("--publish", metavar="LIST", default="",
                   help="comma-separated publishers: ganglia, prometheus, graphite")
    p.add_argument("--openmetrics", metavar="FILE", type=Path,
                   help="also write every evaluation to an OpenMetrics file (promtool backfill)")
    p.add_argument("--reconcile", action="store_true",
                   help="also publish the drift between PoolLedger's accounting and the real "
                        "negotiator's Accounting ads (the Reconciliation metrics: "
                        "htcondor_accounting_drifting, ...; folds the whole ledger, not only "
                        "the collector view)")
    p.add_argument("--poll", metavar="SECONDS", type=float, default=1.0,
                   help="following: how often to look for new events (default 1)")
    add_log_source(p)
    p.set_defaults(func=run)


def _publishers(text: str) -> list[str]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in PUBLISHERS]
    if bad:
        raise CLIError(f"--publish {bad[0]!r}: not one of {', '.join(PUBLISHERS)}")
    return names


def _host_port(knob: str, value: Any) -> tuple[str, int]:
    from schemas.errors import ConfigError

    host, _, port = str(value).rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not host or not 0 < number < 65536:
        raise ConfigError(f"expected HOST:PORT, got {value!r}", knob=knob)
    return host, number


def _open_publishers(args: argparse.Namespace, settings: SettingsLike, names: list[str]) -> list[tuple[Publisher, str]]:
    from ganglia.gmetric import GmondPublisher, gmond_channels
    from ganglia.graphite import GraphitePublisher
    from ganglia.prometheus import OpenMetricsWriter, PrometheusExporter
    from ganglia.publish import HISTORY, LIVE

    out: list[tuple[Publisher, str]] = []
    if "ganglia" in names:
        send, xml_at = gmond_channels(str(settings.get("GANGLIA_CONFIG")))
        out.append((GmondPublisher(send, xml_at, all_hosts=bool(settings.get("GANGLIA_SEND_DATA_FOR_ALL_HOSTS"))),
                    LIVE))
    if "prometheus" in names:
        if not args.once:
            host, port = _host_port("POOLLEDGER_PROMETHEUS_LISTEN", settings.get("POOLLEDGER_PROMETHEUS_LISTEN"))
            exporter = PrometheusExporter(host, port)
            print(f"poolledger gangliad: Prometheus exporter on http://{host}:{exporter.port}/metrics",
                  file=sys.stderr, flush=True)
            out.append((exporter, LIVE))
    if args.openmetrics is not None:
        out.append((OpenMetricsWriter(args.openmetrics), HISTORY))
    if "graphite" in names:
        host, port = _host_port("POOLLEDGER_GRAPHITE", settings.get("POOLLEDGER_GRAPHITE"))
        out.append((GraphitePublisher(host, port, str(settings.get("POOLLEDGER_GRAPHITE_PREFIX") or "htcondor")),
                    HISTORY))
    return out


def noop_lines(metrics: Any) -> list[str]:
    """gangliad's NOOP-mode log line for each metric."""
    from ganglia.gmetric import spoof_host

    return [f"noop mode: publishing {m.name}={m.text}, group={m.group}, units={m.units}, "
            f"derivative={int(m.derivative)}, type={m.type}, title={m.title}, desc={m.desc}, "
            f"cluster={m.cluster}, spoof_host={spoof_host(m)}" for m in metrics]


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    from ganglia.errors import GangliaError, MetricConfigError
    from ganglia.gangliad import Gangliad
    from ganglia.metrics import GangliadConfig, load_metrics
    from ganglia.publish import Delivery
    from ganglia.sink import MetricsTarget

    try:
        names = _publishers(args.publish)
        if "prometheus" in names and args.once and args.openmetrics is None and not args.dry_run:
            raise CLIError("--publish prometheus with --once needs --openmetrics FILE (an exporter "
                           "would be gone before Prometheus scrapes it)")
    except CLIError as exc:
        print(f"poolledger gangliad: {exc}", file=sys.stderr)
        return 2
    cfg = GangliadConfig.from_settings(settings)
    try:
        defs, problems = load_metrics(settings.get("GANGLIAD_METRICS_CONFIG_DIR") or None)
    except MetricConfigError as exc:
        print(f"poolledger gangliad: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"poolledger gangliad: {problem}", file=sys.stderr)
    try:
        publishers = [] if args.dry_run else _open_publishers(args, settings, names)
    except GangliaError as exc:
        print(f"poolledger gangliad: {exc}", file=sys.stderr)
        return 2
    warnings: Counter[str] = Counter()

    def seen(ev: Any) -> None:
        warnings.update(ev.warnings)
        if args.dry_run and not args.once and args.log_file is None:
            _print_noop(ev)

    target = MetricsTarget(Gangliad(defs, cfg, settings, reconcile=args.reconcile),
                           Delivery(publishers), on_evaluation=seen, topic=events_topic(settings))
    try:
        if args.log_file is not None:
            status = _from_file(args, settings, target)
        else:
            status = _from_log(args, settings, target, names)
    finally:
        target.close()
    for reason, n in sorted(warnings.items()):
        print(f"poolledger gangliad: warning: {reason} ({n} time{'s' if n != 1 else ''})", file=sys.stderr)
    if status == 0 and problems:
        return 2
    return status


def _print_noop(ev: Any) -> None:
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ev.at))}: {len(ev.metrics)} metrics")
    print("\n".join(noop_lines(ev.metrics)), flush=True)


def _finish(args: argparse.Namespace, target: MetricsTarget) -> int:
    """The view at the log's end, published (or listed with --dry-run) and drained."""
    final = target.finish()
    if final is None:
        print("poolledger gangliad: the log is empty; nothing to publish", file=sys.stderr)
        return 0
    if args.dry_run:
        _print_noop(final)
        return 0
    if not target.delivery.drain():
        print(f"poolledger gangliad: not delivered to {', '.join(target.delivery.undelivered())} "
              "(unreachable; see the warnings above)", file=sys.stderr)
        return 1
    sent = ", ".join(f"{slot.publisher.name} ({slot.sent} values)" for slot in target.delivery.slots)
    at = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(final.at))
    print(f"gangliad: {len(final.metrics)} metrics as of {at} published"
          + (f" to {sent}" if sent else " to no publisher (--publish names them)"))
    return 0


def _from_file(args: argparse.Namespace, settings: SettingsLike, target: MetricsTarget) -> int:
    """An exported log (`--log FILE.jsonl`): folded to its end, like --once."""
    from services.commands import load_events

    for env in load_events(args, settings):
        target.feed(env)
    target.delivery.flush(force=True)
    return _finish(args, target)


def _resume(log: Any, settings: SettingsLike, target: MetricsTarget) -> None:
    """Start the daemon's view from the newest usable snapshot of the embedded log (one
    warning line when it is not usable), when no publisher wants the intervals before it."""
    from streams.log.events import EventLog
    from streams.replay import start_of

    topic = events_topic(settings)
    start = start_of(EventLog(log), settings, topic=topic, warn=lambda line: print(
        f"poolledger gangliad: warning: {line}", file=sys.stderr))
    if start.ledger is None or start.positions is None or start.last_ts is None:
        return
    if target.daemon.ledger is not None:  # --reconcile: the whole ledger folds on
        target.daemon.resume_ledger(start.ledger, start.last_ts)
    else:
        state, dedup = start.ledger.collector_view()
        target.daemon.resume(state, dedup, start.last_ts)
    target.resume({topic: start.positions})


def _from_log(args: argparse.Namespace, settings: SettingsLike, target: MetricsTarget, names: list[str]) -> int:
    """The configured log through the sink runner: catch up, publish the view at the end,
    then (without --once) follow until interrupted."""
    from streams.log.events import ensure_topics, open_log
    from streams.sink import SinkRunner, TargetUnavailableError

    topic = events_topic(settings)
    log = open_log(broker_url(settings), home_dir(settings))
    try:
        ensure_topics(log)
        if log.partitions(topic) != 1:
            print(f"poolledger gangliad: {topic} has {log.partitions(topic)} partitions; the pool "
                  "is one ordered stream and must not be folded from several", file=sys.stderr)
            return 2
        history = args.openmetrics is not None or "graphite" in names  # every interval
        if not history and (args.once or not args.dry_run):
            _resume(log, settings, target)
        runner = SinkRunner(log, target, give_up_after=30.0 if args.once else None)
        try:
            runner.run_once()
        except TargetUnavailableError as exc:
            print(f"poolledger gangliad: {exc} (gave up after 30 s)", file=sys.stderr)
            return 1
        status = _finish(args, target)
        if args.once:
            return status
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            runner.follow(stop, poll_seconds=args.poll)
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        log.close()
