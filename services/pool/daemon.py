"""What every simulated daemon shares: its `source` name and its own increasing `seq`."""
from __future__ import annotations

from schemas.events import Envelope, Payload, make_event
from services.pool.clock import VirtualClock


class Daemon:
    """Emits envelopes stamped with the virtual now, `source` and the next per-source seq."""

    def __init__(self, source: str, clock: VirtualClock, outbox: list[Envelope]) -> None:
        self.source = source
        self.clock = clock
        self.outbox = outbox
        self.seq = 0

    def emit(self, payload: Payload) -> Envelope:
        """Append one event to the pool's outbox (gap-free seq, like a collector update stream)."""
        self.seq += 1
        env = make_event(payload, ts=self.clock.now, source=self.source, seq=self.seq)
        self.outbox.append(env)
        return env
