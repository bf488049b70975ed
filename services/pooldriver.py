"""The simulated pool alone, its negotiator a separate service on the log (`poolledger
negotiator`): the main loop with its negotiation cycles read from the log instead of run.

Why lockstep: the pool runs in virtual time, so it must not run ahead of a negotiator that
is down (a real pool would simply carry on with the wall clock). Each step appends the pool's
events up to time t in ONE append that ends with the collector's own ad at t: the log's event
time reaching t is what makes a negotiator's cycle at t due, and because the step is one
append no negotiator ever sees half of it. The pool then waits until the log holds its
negotiator's cycle at t, acts on that cycle's matches and takes the next step. So the log is
the same whichever negotiator process wrote a cycle, and a takeover costs wall-clock time only.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TextIO

from schemas.config import SettingsLike
from schemas.events import Envelope, Matched, NegotiationCycled
from services.mainloop import MainLoop
from services.pool import Scenario
from streams.log.port import Log
from streams.log.topics import DERIVED, EVENTS

__all__ = ["PoolDriver", "PoolDriverError", "NegotiatorSilentError"]


class PoolDriverError(Exception):
    """A pool that cannot be driven with its negotiator as a service (exit 2)."""


class NegotiatorSilentError(PoolDriverError):
    """No negotiator wrote the due cycle within the driver's patience."""


class PoolDriver(MainLoop):
    """`MainLoop` whose cycles come from the negotiator named `negotiator` on the log.

    `patience` is the wall-clock time to wait for one cycle (a takeover included) before
    giving up with NegotiatorSilentError.
    """

    def __init__(self, scenario: Scenario, *, seed: int, settings: SettingsLike, log: Log,
                 negotiator: str, topic: str = EVENTS, derived_topic: str | None = DERIVED,
                 patience: float = 120.0, progress: TextIO | None = None) -> None:
        super().__init__(scenario, seed=seed, settings=settings, log=log, topic=topic,
                         derived_topic=derived_topic, negotiator=negotiator, progress=progress)
        if self.named:
            raise PoolDriverError(f"{scenario.path}: named negotiators ({', '.join(n.name for n in self.named)}) "
                                  "run inside `poolledger run`; the negotiator service is "
                                  "the pool's one default negotiator")
        self.patience = patience
        self._pending: list[Envelope] = []
        self._read = dict(self.positions)  # where the watch for cycles has read to

    def publish(self, envelopes: Iterable[Envelope]) -> None:
        """Hold the pool's events until the step's one append (`_commit`)."""
        self._pending.extend(envelopes)

    def _commit(self) -> None:
        batch, self._pending = self._pending, []
        super().publish(batch)

    def cycle(self, t: float) -> None:
        """The step's events and the collector's ad at `t` in one append, then the
        negotiator's cycle at `t` from the log and the pool's reaction to its matches."""
        self._collector_due = None  # every step: the collector's ad marks the pool's time
        self._publish_collector_ad(t)
        self._commit()
        cycled, matches = self._await_cycle(t)
        self.result.cycles += 1
        self._act(t, [cycled], matches)
        self._commit()
        self.runner.checkpoint()
        self._sample(t)

    def _await_cycle(self, t: float) -> tuple[NegotiationCycled, list[Matched]]:
        """This negotiator's first cycle at or after `t` on the log, and its matches (in the
        same append, so read with it)."""
        deadline = time.monotonic() + self.patience
        found: NegotiationCycled | None = None
        matches: list[Matched] = []
        while True:
            super().publish([])  # fold what the negotiator appended
            for record, env in self.elog.read(self.topic, start_positions=self._read):
                self._read[record.partition] = record.offset + 1
                d = env.data
                if isinstance(d, NegotiationCycled) and d.negotiator == self.negotiator:
                    if found is None and d.now >= t:
                        found = d
                elif (isinstance(d, Matched) and d.negotiator == self.negotiator
                      and found is not None and d.cycle == found.cycle):
                    matches.append(d)
            if found is not None:
                super().publish([])  # the cycle's own append, folded before acting on it
                return found, matches
            if time.monotonic() > deadline:
                raise NegotiatorSilentError(
                    f"no cycle from {self.negotiator} at event time {t:.0f} on {self.topic} "
                    f"within {self.patience:g} s: is `poolledger negotiator` running?")
            time.sleep(0.02)
