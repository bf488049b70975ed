"""`poolledger services start|stop|status kafka`: the real services for development."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from services.commands import home_dir

SERVICES = ("kafka", "elasticsearch", "opensearch")


def register(sub: Any) -> None:
    p = sub.add_parser("services", help="start and stop local real services (Kafka, Elasticsearch, OpenSearch)")
    ssub = p.add_subparsers(dest="services_command", metavar="ACTION", required=True)
    for action, helptext in (("start", "start a service in the background"),
                             ("stop", "stop a service started with 'start'"),
                             ("status", "is the service running, and where")):
        a = ssub.add_parser(action, help=helptext)
        a.add_argument("service", choices=SERVICES)
        a.set_defaults(func=run, action=action)


def run(args: argparse.Namespace, settings: Any) -> int:
    from compose import kafka

    home = home_dir(settings)
    if args.service != "kafka":
        return _search(args, home)
    if args.action == "start":
        bootstrap = kafka.start_service(home)
        print(f"kafka running: --broker kafka://{bootstrap}")
        return 0
    if args.action == "stop":
        kafka.stop_service(home)
        print("kafka stopped")
        return 0
    status = kafka.service_status(home)
    print(status or "kafka is not running")
    return 0 if status else 1


def _search(args: argparse.Namespace, home: Any) -> int:
    """Elasticsearch / OpenSearch (compose/search.py)."""
    from compose import search

    kind = args.service
    try:
        if args.action == "start":
            url = search.start_service(kind, home)
            print(f"{kind} running: poolledger adstash --interface {kind} --se_host {url}")
            return 0
        if args.action == "stop":
            search.stop_service(kind, home)
            print(f"{kind} stopped")
            return 0
    except search.SearchLauncherError as exc:
        print(f"poolledger services: {exc}", file=sys.stderr)
        return 1
    status = search.service_status(kind, home)
    print(status or f"{kind} is not running")
    return 0 if status else 1
