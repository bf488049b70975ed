"""`poolledger negotiator`: the negotiator as its own service on the log; start a second one
and it stands by, taking over when the active one dies (services.negotiator.daemon).

Pair it with `poolledger run --negotiator-service`, whose pool then waits for this service's
cycles instead of negotiating itself. It runs until SIGTERM or Ctrl-C (then gives its lease
up, so a standby takes over at once), or `--idle S` seconds without a new event.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from schemas.config import SettingsLike
from services.commands import broker_url, events_topic, home_dir, log_name, open_configured_log
from streams.log.lease import FileLease, Lease, lease_file_name
from streams.log.port import Log, TopicSpec
from streams.log.topics import EVENTS


def register(sub: Any) -> None:
    p = sub.add_parser(
        "negotiator", help="run the negotiator as its own service on the log (a second one "
                           "stands by)",
        description="Fold the log and run a negotiation cycle every NEGOTIATOR_INTERVAL of "
                    "the log's event time, while holding the negotiator's lease (a Kafka "
                    "consumer group; a lease with a deadline beside the embedded log). Other instances "
                    "of the same --name stand by and take over when it dies.")
    p.add_argument("--name", metavar="NAME",
                   help="daemon name, as its events carry it (default negotiator@CONDOR_HOST, "
                        "else negotiator@FULL_HOSTNAME); `run --negotiator-service` waits for "
                        "negotiator@<the scenario's central manager>")
    p.add_argument("--topic", help="events topic (default: `poolledger --topic` / "
                                   "POOLLEDGER_EVENTS_TOPIC, else " + EVENTS + ")")
    p.add_argument("--idle", type=float, metavar="S",
                   help="exit after S seconds (wall clock) in which the log did not grow")
    p.add_argument("--reproducible", action="store_true",
                   help="write 0 as each cycle's duration (a wall-clock figure), so that two "
                        "runs of one scenario leave identical logs")
    p.set_defaults(func=negotiator)


def default_name(settings: SettingsLike) -> str:
    """negotiator@CONDOR_HOST, else negotiator@FULL_HOSTNAME."""
    return f"negotiator@{settings.get('CONDOR_HOST') or settings.get('FULL_HOSTNAME')}"


def open_lease(log: Log, settings: SettingsLike, name: str, topic: str) -> Lease:
    """The negotiator's lease: membership of a Kafka consumer group on `topic`, or a lease
    with a deadline in a file beside the embedded log."""
    if broker_url(settings):
        from streams.log.kafka import KafkaLog

        assert isinstance(log, KafkaLog)
        return log.lease(f"poolledger.negotiator.{name}", topic)
    # beside the log directory, not in it: `run` and `log verify` expect nothing else there
    return FileLease(home_dir(settings) / "leases" / lease_file_name(name),
                     timeout=float(settings.get("POOLLEDGER_LEASE_TIMEOUT")))


def negotiator(args: argparse.Namespace, settings: SettingsLike) -> int:
    from services.negotiator.daemon import NegotiatorDaemon

    if args.idle is not None and not args.idle > 0:
        print(f"poolledger negotiator: --idle must be a positive number of seconds, got "
              f"{args.idle}", file=sys.stderr)
        return 2
    name = args.name or default_name(settings)
    args.topic = args.topic or events_topic(settings)
    log = open_configured_log(settings)
    lease: Lease | None = None
    try:
        log.create_topic(TopicSpec(args.topic, 1))
        lease = open_lease(log, settings, name, args.topic)
        daemon = NegotiatorDaemon(log, settings, lease, name=name, topic=args.topic,
                                  record_durations=not args.reproducible,
                                  warn=lambda line: print(f"poolledger negotiator: warning: "
                                                          f"{line}", file=sys.stderr))
        stop: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: stop.append(signum))
        grown = [time.monotonic(), -1]

        def until() -> bool:
            if stop:
                return True
            if args.idle is None:
                return False
            if daemon.positions[0] != grown[1]:
                grown[:] = [time.monotonic(), daemon.positions[0]]
            return time.monotonic() - grown[0] > args.idle

        def say(line: str) -> None:
            print(f"{name}: {line}", flush=True)

        say(f"on {log_name(settings)} topic {args.topic}; standing by until it holds the lease")
        served = daemon.serve(until=until, say=say)
    finally:
        if lease is not None:
            lease.release()
        log.close()
    say(f"stopped after {served.cycles} cycles and {served.matches} matches")
    return 0
