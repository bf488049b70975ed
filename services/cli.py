"""The `poolledger` command: one parser, subcommands contributed by `services.commands.*`.

Each command module exposes `register(subparsers)` and sets `func(args, settings) -> int`.
Global options load the one typed settings object (defaults < config files < POOLLEDGER_*
environment < command line); a bad knob exits 2 naming the knob and where it was set.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Sequence

from schemas.errors import SchemasError
from services.commands import EscapedOutput
from services.commands.errors import CLIError
from streams.log.port import LogError

COMMAND_MODULES = (
    "services.commands.config",
    "services.commands.schema",
    "services.commands.log",
    "services.commands.services",
    "services.commands.run",
    "services.commands.userprio",
    "services.commands.replay",
    "services.commands.audit",
    "services.commands.reconcile",
    "services.commands.why",
    "services.commands.gangliad",
    "services.commands.history",
    "services.commands.adstash",
    "services.commands.negotiator",
    "services.commands.collector",
    "services.commands.status",
    "services.commands.q",
    "services.commands.faust_status",
    "services.commands.follow",
)

#: commands whose stdout prints the log's data for a person (names, ads, reasons): written
#: through `EscapedOutput`, so nothing from the data is obeyed by the terminal. `sql` too on
#: a terminal (its CSV into a file or pipe stays byte for byte); exports are files, not here.
DATA_COMMANDS = frozenset({"userprio", "replay", "audit", "why", "status", "updates-stats",
                           "history", "stats"})


class VoiceFormatter(logging.Formatter):
    """Log records in the CLI's one-line voice, `poolledger <command>: warning: <message>`
    (with -v the logger's name follows, for whoever debugs)."""

    def __init__(self, command: str, verbose: bool) -> None:
        super().__init__()
        self.command, self.verbose = command, verbose

    def format(self, record: logging.LogRecord) -> str:
        where = f" [{record.name}]" if self.verbose else ""
        text = f"poolledger {self.command}: {record.levelname.lower()}: {record.getMessage()}{where}"
        if record.exc_info and self.verbose:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _env_help(var: str, default: str) -> str:
    value = os.environ.get(var)
    return f"[env {var}{'=' + value if value else ''}; default {default}]"


def build_parser() -> argparse.ArgumentParser:
    """The full parser; commands register themselves from their own modules."""
    parser = argparse.ArgumentParser(
        prog="poolledger",
        description="PoolLedger: an HTCondor-style central manager as an event-sourced pipeline.")
    parser.add_argument("--config", metavar="PATH",
                        help="condor_config file or directory " + _env_help("POOLLEDGER_CONFIG", "none"))
    parser.add_argument("--home", metavar="DIR",
                        help="data directory (embedded log, state) " + _env_help("POOLLEDGER_HOME", "./out, where `run` writes"))
    parser.add_argument("--broker", metavar="kafka://HOST:PORT",
                        help="use Kafka instead of the embedded log " + _env_help("POOLLEDGER_BROKER", "embedded"))
    parser.add_argument("--topic", dest="events_topic", metavar="TOPIC",
                        help="the events topic to read (a `--broker ... run` prints its own) "
                        + _env_help("POOLLEDGER_EVENTS_TOPIC", "poolledger.events"))
    parser.add_argument("--set", dest="overrides", metavar="KNOB=VALUE", action="append", default=[],
                        help="override a configuration knob (repeatable; highest precedence)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """`KNOB=VALUE` strings from --set into a dict; a malformed one is a CLIError."""
    out: dict[str, str] = {}
    for pair in pairs:
        knob, sep, value = pair.partition("=")
        if not sep or not knob.strip():
            raise CLIError(f"--set {pair!r}: expected KNOB=VALUE")
        out[knob.strip().upper()] = value.strip()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    from schemas.knobs import find_knob, unknown_knob_message
    from schemas.settings import load_settings

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(VoiceFormatter(str(args.command), args.verbose))
    if not args.verbose:
        # kafka-python logs every refused connection; the command says it once, in its own words
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        overrides = parse_overrides(args.overrides)
        for knob in overrides:
            if find_knob(knob) is None:
                raise CLIError(f"--set {knob}: {unknown_knob_message(knob)}")
        if args.home:
            overrides["POOLLEDGER_HOME"] = args.home
        if args.broker:
            overrides["POOLLEDGER_BROKER"] = args.broker
        if args.events_topic:
            overrides["POOLLEDGER_EVENTS_TOPIC"] = args.events_topic
        settings = load_settings(config_path=args.config, overrides=overrides)
    except (SchemasError, CLIError) as exc:
        print(f"poolledger {args.command}: configuration error: {exc}", file=sys.stderr)
        return 2
    for entry in settings.unknown_in_files():
        print(f"poolledger {args.command}: warning: {entry.source}: {unknown_knob_message(entry.name)}; "
              "ignored", file=sys.stderr)
    prefix = f"poolledger {args.command}"
    stdout = sys.stdout
    if args.command in DATA_COMMANDS or (args.command == "sql" and stdout.isatty()):
        sys.stdout = EscapedOutput(stdout)  # type: ignore[assignment]
    try:
        return int(args.func(args, settings))
    except CLIError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return exc.status
    except SchemasError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except LogError as exc:  # a damaged log, an events topic with several partitions, ...
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`log export - | head -1`): quiet, and no second error when
        # Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        print(f"poolledger: {exc.filename or 'I/O'}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


if __name__ == "__main__":
    sys.exit(main())
