"""A schedd's history file (or a startd's startd_history) followed into `job.history` events.

The file is read with the importer's own parser and event builder (`log import-history`:
schemas.classads.parse_history, old ClassAd syntax; adstash.sources.history_event), so a
followed ad gets the same id as an imported one (`history:<GlobalJobId>#<RecordTime>`) and
following a file that was imported before adds nothing. An ad is consumed only once its
`*** ` banner line is written (the schedd writes the ad, then the banner); a malformed ad is
dead-lettered with file:line and byte offset, the rest goes on. A history file rotated to
`history.<time>` (MAX_HISTORY_LOG) is finished under its new name, then the new one is read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from adstash.sources import history_event
from schemas.classads import ad_to_json, parse_history
from schemas.errors import ClassAdError
from services.follow.base import Chunk, Follower, Position

__all__ = ["HistoryFollower"]

#: bytes read per stretch (an ad is a few kB; a stretch without a banner is read further)
_STRETCH: Final = 8 << 20


def _last_banner_end(data: bytes) -> int:
    """The offset after the last complete `***` banner line of `data` (0: none)."""
    i = data.rfind(b"***")
    while i >= 0:
        if i == 0 or data[i - 1] == 0x0A:
            nl = data.find(b"\n", i)
            if nl >= 0:
                return nl + 1
        i = data.rfind(b"***", 0, i)
    return 0


class HistoryFollower(Follower):
    """Follows a history or startd_history file (see the module doc)."""

    kind = "history"

    def new_file(self, carry: dict[str, Any]) -> None:
        carry["line"] = 0

    def read(self, path: Path, pos: Position, final: bool) -> Chunk:
        stretch = _STRETCH
        with open(path, "rb") as f:
            while True:
                f.seek(pos.offset)
                data = f.read(stretch)
                cut = len(data) if final else _last_banner_end(data)
                if cut or len(data) < stretch:
                    break
                stretch *= 2  # one ad larger than the stretch: read further
        if not cut:
            return Chunk([], [], pos.offset)
        data = data[:cut]
        first_line = int(pos.carry.get("line", 0)) + 1
        starts = [0]
        at = data.find(b"\n")
        while at >= 0:
            starts.append(at + 1)
            at = data.find(b"\n", at + 1)
        dead = []

        def on_error(exc: ClassAdError, raw: str) -> None:
            line = exc.line if exc.line is not None else first_line
            k = min(max(line - first_line, 0), len(starts) - 1)
            dead.append(self.dead_letter(path, pos.offset + starts[k], exc.reason,
                                         raw.encode(errors="surrogateescape"), line))

        events = []
        text = data.decode("utf-8", errors="surrogateescape")
        for ad in parse_history(text, path=str(path), on_error=on_error, first_line=first_line):
            pos.seq += 1
            events.append(history_event(ad_to_json(ad), pos.seq))
        pos.carry["line"] = first_line - 1 + data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
        return Chunk(events, dead, pos.offset + cut)
