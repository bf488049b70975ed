"""`poolledger services start|stop|status kafka|gmond|prometheus|graphite|elasticsearch|opensearch`:
the real services for development (Kafka; gmond, Prometheus and carbon-cache for `gangliad`;
Elasticsearch and OpenSearch for `adstash`)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from schemas.config import SettingsLike
from services.commands import home_dir
from streams.log.files import check_parents

SERVICES = ("kafka", "gmond", "prometheus", "graphite", "elasticsearch", "opensearch")


def register(sub: Any) -> None:
    p = sub.add_parser("services", help="start and stop local real services (Kafka, gmond, "
                       "Prometheus, carbon, Elasticsearch, OpenSearch)")
    ssub = p.add_subparsers(dest="services_command", metavar="ACTION", required=True)
    for action, helptext in (("start", "start a service in the background"),
                             ("stop", "stop a service started with 'start'"),
                             ("status", "is the service running, and where")):
        a = ssub.add_parser(action, help=helptext)
        a.add_argument("service", choices=SERVICES, help="; ".join(SERVICES))
        if action == "status":
            a.add_argument("--json", action="store_true", help="the recorded state as JSON")
        a.set_defaults(func=run, action=action, json=False)


def run(args: argparse.Namespace, settings: SettingsLike) -> int:
    from compose import kafka

    # absolute: the launchers start each daemon in <home>/services/<svc> and hand it paths
    home = home_dir(settings, create=args.action == "start").absolute()  # stop/status only read
    if args.action == "start":  # the launchers write configuration and state under it
        check_parents(home / "services" / "x")
    if args.service != "kafka":
        if args.service in ("elasticsearch", "opensearch"):
            return _search(args, home)
        return _monitoring(args, settings, home)
    try:
        if args.action == "start":
            bootstrap = kafka.start_service(home)
            print(f"kafka running: --broker kafka://{bootstrap}")
            return 0
        if args.action == "stop":
            kafka.stop_service(home)
            print("kafka stopped")
            return 0
    except kafka.KafkaLauncherError as exc:
        return _failed("kafka", exc)
    status = kafka.service_status(home)
    _print_status(args, "kafka", status)
    return 0 if status else 1


def _monitoring(args: argparse.Namespace, settings: SettingsLike, home: Any) -> int:
    """gmond, Prometheus (scraping POOLLEDGER_PROMETHEUS_LISTEN) or carbon-cache on loopback."""
    from compose import monitoring

    kind = args.service
    try:
        if args.action == "start":
            scrape = [str(settings.get("POOLLEDGER_PROMETHEUS_LISTEN"))] if kind == "prometheus" else None
            info = monitoring.start_service(home, kind, scrape=scrape)
            hint = {"gmond": f"--set GANGLIA_CONFIG={info.get('config')} (XML on 127.0.0.1:{info.get('xml_port')})",
                    "prometheus": f"{info.get('url')} scraping {', '.join(info.get('scrape', []))}",
                    "graphite": f"--set POOLLEDGER_GRAPHITE=127.0.0.1:{info.get('port')} "
                                f"(whisper files in {info.get('whisper_dir')})"}[kind]
            print(f"{kind} running: {hint}")
            return 0
        if args.action == "stop":
            print(f"{kind} stopped" if monitoring.stop_service(home, kind) else f"{kind} was not running")
            return 0
    except monitoring.MonitoringLauncherError as exc:
        return _failed(kind, exc)
    status = monitoring.service_status(home, kind)
    _print_status(args, kind, status)
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
        return _failed(kind, exc)
    status = search.service_status(kind, home)
    _print_status(args, kind, status)
    return 0 if status else 1


def _failed(kind: str, exc: Exception) -> int:
    """One line for a service that would not start or stop: the launcher's first line names
    the cause and the daemon's log (the log's tail follows it only in the exception)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"poolledger services: {kind}: {first}", file=sys.stderr)
    return 1


def _print_status(args: argparse.Namespace, kind: str, status: dict[str, Any] | None) -> None:
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
    else:
        print(status_table(kind, status) if status else f"{kind} is not running")


def status_table(kind: str, status: dict[str, Any]) -> str:
    """A running service's recorded state as `name  value` lines under its name, the way
    `condor_status -long` lists attributes (lists joined by commas, nested values as JSON)."""
    width = max(len(k) for k in status)
    lines = [f"{kind} running"]
    for key in sorted(status):
        value = status[key]
        if isinstance(value, (list, tuple)):
            text = ", ".join(str(v) for v in value)
        elif isinstance(value, dict):
            text = json.dumps(value, sort_keys=True)
        else:
            text = str(value)
        lines.append(f"  {key:<{width}}  {text}")
    return "\n".join(lines)
