"""CLI subcommands; each module exposes `register(subparsers)`. Shared edge helpers live here."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterator

from schemas.config import SettingsLike
from schemas.events import Envelope
from services.commands.errors import CLIError, CLIUsageError

if TYPE_CHECKING:
    from services.negotiator.shard import ShardFilter
    from streams.log.kafka import SaslLogin
    from streams.log.port import Log
    from streams.replay import Folded, Until


# --- text from the data, printed to a terminal -------------------------------------------------

#: what a terminal obeys rather than shows: C0 controls (ESC starts CSI/OSC sequences, CR
#: rewrites a line, NUL, BEL, backspace), DEL, the C1 controls and the bidirectional
#: overrides and isolates (which reorder what is shown); each is printed as its escape
_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F),
             *range(0x2066, 0x206A)]
_ESCAPES = {c: ("\\n" if c == 0x0A else "\\t" if c == 0x09 else
                f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _CONTROLS}
#: the same for a whole stream of lines: its own line breaks and tabs stay
_STREAM_ESCAPES = {c: e for c, e in _ESCAPES.items() if c not in (0x09, 0x0A)}


def printable(text: str) -> str:
    """`text` (a name, a value from the log) with everything a terminal would obey escaped,
    newlines too, so data can neither forge a line nor move the cursor."""
    return text.translate(_ESCAPES)


class EscapedOutput:
    """A text stream writing to `inner` with the controls of `printable` escaped, except the
    line breaks and tabs of the layout: the stdout of the commands that print the log's data
    (userprio, replay, audit, why, status, history, ...), so that nothing printed from data is
    obeyed by the terminal, whichever line prints it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(text.translate(_STREAM_ESCAPES))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def home_dir(settings: SettingsLike, *, create: bool = True) -> Path:
    """The data directory (POOLLEDGER_HOME, default `./out` where `run` writes), created on
    first use unless `create` is False (a command that only reads must not leave one behind)."""
    path = Path(str(settings.get("POOLLEDGER_HOME") or "out")).expanduser()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def broker_url(settings: SettingsLike) -> str | None:
    """The configured Kafka URL, or None for the embedded log."""
    value = settings.get("POOLLEDGER_BROKER")
    return str(value) if value else None


def events_topic(settings: SettingsLike) -> str:
    """The events topic commands read (POOLLEDGER_EVENTS_TOPIC / `--topic`)."""
    from streams.log.topics import EVENTS

    return str(settings.get("POOLLEDGER_EVENTS_TOPIC") or EVENTS)


def kafka_login(settings: SettingsLike) -> SaslLogin | None:
    """The Kafka clients' SASL login from the POOLLEDGER_KAFKA_* knobs, None when unset
    (then kafka-python, 0.2 s to import, is not loaded for an embedded log)."""
    if not settings.get("POOLLEDGER_KAFKA_SASL_MECHANISM"):
        return None
    from streams.log.kafka import SaslLogin

    return SaslLogin.from_settings(settings)


def open_configured_log(settings: SettingsLike) -> Log:
    """The configured log (POOLLEDGER_BROKER, else the embedded log under POOLLEDGER_HOME),
    authenticated with the configured Kafka login."""
    from streams.log.events import open_log

    return open_log(broker_url(settings), home_dir(settings), kafka_login(settings))


def log_name(settings: SettingsLike) -> str:
    """The configured log as a user would name it: the broker URL or the embedded log's path."""
    return broker_url(settings) or str(home_dir(settings, create=False) / "log")


def open_log_to_read(settings: SettingsLike) -> Log:
    """The configured log for a command that only reads it: a missing embedded log or an
    empty events topic is a CLIError naming the log read (instead of an empty answer), and
    nothing is created on disk."""
    from streams.log.events import open_log
    topic = events_topic(settings)
    hint = "run `poolledger run`, or name a log with --home DIR, --broker or --log FILE.jsonl"
    broker = broker_url(settings)
    logdir = home_dir(settings, create=False) / "log"
    if not broker and not (logdir.is_dir() and any(logdir.iterdir())):
        raise CLIError(f"no log in {log_name(settings)}: {hint}")
    log = open_log(broker, home_dir(settings, create=False), kafka_login(settings))
    try:
        events = sum(log.end_offsets(topic).values()) if topic in log.topics() else 0
    except BaseException:
        log.close()
        raise
    if not events:
        log.close()
        where = "" if topic == "poolledger.events" else f" in topic {topic}"
        raise CLIError(f"the log {log_name(settings)} holds no events{where}: {hint}")
    return log


def add_log_source(parser: Any) -> None:
    """`--log FILE.jsonl`: read an exported log instead of the configured one."""
    parser.add_argument("--log", dest="log_file", metavar="FILE.jsonl", type=Path,
                        help="read this exported log instead of the configured log")


def check_jsonl_log(path: Path) -> None:
    """Refuse (CLIUsageError, exit 2) a `--log` file that is missing or is not an exported log:
    its first non-empty line must be a JSON object. Later undecodable lines of a real export
    are reported one by one instead; a PNG or a CSV is refused once, not skipped line by line."""
    import orjson

    try:
        with path.open("rb") as handle:
            for lineno, line in enumerate(handle, 1):
                if line.strip():
                    break
            else:
                raise CLIUsageError(f"--log {path}: empty; expected an exported log "
                                    "(`poolledger log export FILE.jsonl`)")
    except OSError as exc:
        raise CLIUsageError(f"--log {path}: {exc.strerror}") from None
    try:
        first = orjson.loads(line)
    except orjson.JSONDecodeError:
        first = None
    if not isinstance(first, dict):
        raise CLIUsageError(f"--log {path}: not an exported JSONL log (line {lineno} is not a "
                            "JSON object); `poolledger log export FILE.jsonl` writes one")


def load_events(args: Any, settings: SettingsLike) -> Iterator[Envelope]:
    """The events of `--log FILE.jsonl`, or of the configured log's events topic.

    Undecodable lines of a file are reported on stderr by file:line (the configured log sends
    them to its DLQ instead), so nothing is skipped silently.
    """
    from streams.log.events import EventLog, ensure_topics
    from streams.replay import jsonl_events, log_events

    if getattr(args, "log_file", None) is not None:
        check_jsonl_log(args.log_file)
        skipped: list[Any] = []
        yield from jsonl_events(args.log_file, skipped)
        for s in skipped:
            print(f"poolledger {args.command}: skipped {s.where}: {s.reason}", file=sys.stderr)
        return
    log = open_log_to_read(settings)
    try:
        ensure_topics(log)
        yield from log_events(EventLog(log), events_topic(settings))
    finally:
        log.close()


#: A fold of the configured log (a what-if replay folds it all) shows a progress line on a
#: terminal once it has taken this many seconds.
FOLD_PROGRESS_AFTER = 2.0


def fold_log(args: Any, settings: SettingsLike, until: Until | None = None,
             negotiator: str | None = None, needs: Collection[str] | None = (),
             on_conflict: Callable[[str], Any] | None = None
             ) -> tuple[Folded, ShardFilter | None]:
    """The ledger of `--log FILE.jsonl` or of the configured log at `until`, and the shard
    filter of `negotiator` (None: the whole log).

    The configured log's whole ledger starts from its newest usable snapshot and folds only
    the tail (`streams.replay.replay_log`; a missing, stale or corrupt snapshot costs a full
    fold and one warning line). Of the snapshot's large sections only those the command
    `needs` are read now (None: all), the others if ever used: at 200,000 slots reading them
    was most of userprio's time. A file or one negotiator's shard is folded from the start.
    """
    from services.negotiator.shard import select_negotiator
    from streams.progress import Progress
    from streams.log.events import EventLog, ensure_topics
    from streams.replay import Folded, LastTime, replay, replay_log

    if getattr(args, "log_file", None) is None and not negotiator:
        log = open_log_to_read(settings)
        bar = Progress(sys.stderr, after=FOLD_PROGRESS_AFTER)
        first: list[float] = []

        def progress(done: int, total: int, ts: float) -> None:
            first[:] = first or [ts]
            bar.update(done / max(total, 1), (ts - first[0]) / 3600, done)

        try:
            ensure_topics(log)
            return replay_log(EventLog(log), settings, until, whatif=bool(args.overrides),
                              topic=events_topic(settings),
                              warn=lambda line: print(f"poolledger {args.command}: warning: "
                                                      f"{line}", file=sys.stderr),
                              needs=needs, on_conflict=on_conflict,
                              progress=progress if bar.stream is not None else None), None
        finally:
            bar.close()
            log.close()
    times = LastTime(load_events(args, settings))  # the whole log's time, not a shard's
    evs, shard = select_negotiator(times, negotiator, settings)
    ledger = replay(evs, settings, until, on_conflict=on_conflict)
    return Folded(ledger, times.ts, False), shard
