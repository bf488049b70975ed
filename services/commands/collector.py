"""`poolledger collector`: a collector endpoint a real HTCondor pool talks to over CEDAR.

A central manager forwards its ads here (CONDOR_VIEW_HOST = host:port), daemons and tools may
advertise and query directly: each update or invalidation becomes an event on the configured
log (embedded, or Kafka with --broker), queries and GET_PRIORITY are answered from the ledger
folded from that log (services.collector.backend behind services.collector.server). It runs
until SIGTERM or Ctrl-C; then it logs the heartbeats it had not logged yet and stores a
snapshot, so the log holds the collector's exact state and a restart resumes from it.
"""
from __future__ import annotations

import argparse
import errno
import logging
import signal
import socket
import sys
from typing import Any

from schemas.config import SettingsLike
from services.commands import log_name, open_configured_log
from streams.log.port import TopicSpec
from streams.log.topics import EVENTS


def register(sub: Any) -> None:
    p = sub.add_parser(
        "collector", help="a CEDAR collector endpoint: a real pool's ads onto the log",
        description="Listen as an HTCondor collector (TCP and UDP): updates and invalidations "
                    "become ad.updated / ad.invalidated events on the log, queries and "
                    "GET_PRIORITY (condor_userprio) are answered from the folded log. Bind "
                    "address: POOLLEDGER_COLLECTOR_ADDRESS (loopback by default); security: "
                    "HTCondor's SEC_* and ALLOW_*/DENY_* knobs in condor_config.")
    p.add_argument("--port", type=int, metavar="N",
                   help="TCP and UDP port (default POOLLEDGER_COLLECTOR_PORT, HTCondor's 9618; "
                        "0: any free port, printed)")
    p.add_argument("--name", metavar="NAME",
                   help="this collector's name, the source of its own events (default "
                        "collector@FULL_HOSTNAME)")
    p.add_argument("--topic", default=EVENTS, help=f"events topic (default {EVENTS})")
    p.set_defaults(func=collector)


def _bind_error(exc: OSError, host: str, port: int) -> tuple[str, int]:
    """One line (and exit status) for a socket that cannot be bound."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"{where} is already in use (another collector on this port? --port N)", 1
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need root)", 1
    if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
        return (f"{where}: cannot bind: {exc.strerror or exc} (POOLLEDGER_COLLECTOR_ADDRESS must "
                "be an address of this host)"), 2
    return f"{where}: cannot bind: {exc.strerror or exc}", 1


def collector(args: argparse.Namespace, settings: SettingsLike) -> int:
    from services.collector.backend import LedgerCollector
    from services.collector.server import CollectorServer

    if args.port is not None and not 0 <= args.port <= 65535:
        print(f"poolledger collector: --port must be between 0 and 65535, got {args.port}",
              file=sys.stderr)
        return 2
    host = str(settings.get("POOLLEDGER_COLLECTOR_ADDRESS"))
    port = args.port if args.port is not None else int(settings.get("POOLLEDGER_COLLECTOR_PORT"))
    name = args.name or f"collector@{settings.get('FULL_HOSTNAME')}"
    logger = logging.getLogger("poolledger.collector")
    if not logger.handlers:  # refusals and the like: one line each on stderr
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    import asyncio  # only here: 0.1 s that every other command's start-up would pay

    log = open_configured_log(settings)
    backend: LedgerCollector | None = None
    loop = asyncio.new_event_loop()
    try:
        log.create_topic(TopicSpec(args.topic, 1))
        backend = LedgerCollector(log, settings, name=name, topic=args.topic)
        server = CollectorServer(settings, backend, host=host, port=port)
        try:
            loop.run_until_complete(server.start())
        except OSError as exc:
            line, status = _bind_error(exc, host, port)
            print(f"poolledger collector: {line}", file=sys.stderr)
            return status
        print(f"{name}: listening on {host}:{server.port} (TCP and UDP), appending to "
              f"{log_name(settings)} topic {args.topic}", flush=True)
        backend.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, loop.stop)
        loop.run_forever()
        loop.run_until_complete(server.close())
    finally:
        if backend is not None:
            backend.close()
        loop.close()
        log.close()
    print(f"{name}: stopped after {backend.commands} commands, {backend.appended} events "
          "appended", flush=True)
    return 0
