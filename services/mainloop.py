"""The main job: a simulated pool, the ledger and the negotiator closing the loop on ONE log.

Why this shape: the log is the truth (DESIGN.md invariant 1). Every event the pool emits is
appended first and the ledger folds what it reads back, never what it was handed (through
`streams.runner.EmbeddedRunner`, the one fold driver, which also stores the snapshots that
`userprio` and the other queries start from); the
negotiator reads only the ledger (plus the job ads folded from the same log); its `match`
and `negotiation.cycle` events go onto the log too, and only then does the pool act on the
matches. Time is the pool's virtual clock, a negotiation cycle every NEGOTIATOR_INTERVAL of
event time (as the log's knobs say), so the same scenario and seed give the same log.

With a Kafka log, a faust worker (`streams.faust_app`, its own app id) folds the same topic
concurrently; `FaustCheck` waits until its changelog state has applied every event and
compares its changelog state with the loop's ledger.
"""
from __future__ import annotations

import dataclasses
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from schemas.config import SettingsLike, negotiator_interval
from schemas.events import Envelope, Matched, NegotiationCycled, Payload, make_event
from services.negotiator.service import DEFAULT_NEGOTIATOR, JobAds, negotiator_config, run_cycle
from services.negotiator.shard import (ShardFilter, negotiation_view, negotiator_name,
                                       shards_from_config, shards_from_settings)
from services.pool import MatchError, PoolSim, Scenario
from services.pool.collector import (COLLECTOR_UPDATE_INTERVAL, NegotiatorAd, accounting_ads,
                                     collector_ad, cycle_ad_counts)
from streams.progress import Progress
from streams.core.errors import EventRejectedError
from streams.core.ledger import Ledger
from streams.log.events import EventLog
from streams.log.files import open_private
from streams.log.port import Log, Record, TopicSpec
from streams.log.topics import DERIVED, EVENTS
from streams.runner import EmbeddedRunner

__all__ = ["Sample", "RunResult", "MainLoop", "Progress", "FaustCheck", "settings_config_text",
           "NamedNegotiator"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One cycle's view for the plots: per submitter RUP, EUP and share of the pool.

    `share` is the submitter's weighted running usage over the pool size, after the cycle's
    matches were folded; `demand` is what all queues asked for (HTCondor's `requested`:
    weighted running plus idle), so a plot shows an outage against the work waiting.
    """

    hours: float
    cycle: int
    pool_size: float
    rup: dict[str, float]
    eup: dict[str, float]
    share: dict[str, float]
    demand: float = 0.0


@dataclass
class RunResult:
    """What a run produced: the ledger, per-cycle samples and statistics."""

    ledger: Ledger
    start: float
    end: float
    events: int = 0
    cycles: int = 0
    matches: int = 0
    stale_matches: int = 0
    durations: list[float] = field(default_factory=list)
    rejections: Counter[str] = field(default_factory=Counter)
    samples: list[Sample] = field(default_factory=list)
    wall_seconds: float = 0.0
    positions: dict[int, int] = field(default_factory=dict)
    #: with named negotiators: each one's own ledger (its accounting), by daemon name
    negotiators: dict[str, Ledger] = field(default_factory=dict)


@dataclass
class NamedNegotiator:
    """One of several negotiators (sharding): the events of its shard fold into its own
    ledger (its own accountant, pool and quotas); its cycles use that ledger."""

    name: str  # daemon name, as its events carry it
    filter: ShardFilter
    ledger: Ledger
    cycles: int = 0


class MainLoop:
    """Drives `scenario` with `seed` on `log`: pool -> log -> ledger -> negotiator -> log -> pool.

    `derived_topic` receives the ledger's derived events (None: not written, e.g. on Kafka
    where the faust worker writes its own). `record_durations` False writes 0.0 as each
    cycle's duration so the whole log is byte-for-byte reproducible.
    """

    def __init__(self, scenario: Scenario, *, seed: int, settings: SettingsLike, log: Log,
                 topic: str = EVENTS, derived_topic: str | None = DERIVED,
                 negotiator: str | None = None, record_durations: bool = True,
                 progress: TextIO | None = None) -> None:
        # A collector forgets ads not refreshed within CLASSAD_LIFETIME: startds feeding one
        # must send their periodic UPDATE_INTERVAL updates, as real ones do.
        scenario = dataclasses.replace(scenario, periodic_slot_updates=True)
        self.scenario = scenario
        self.sim = PoolSim(scenario, random.Random(seed))
        self.job_ads = JobAds()
        self.log = log
        self.elog = EventLog(log)
        self.topic = topic
        self.derived_topic = derived_topic
        self.negotiator = negotiator or f"{DEFAULT_NEGOTIATOR}@{scenario.central_manager}"
        # Named negotiators (services.negotiator.shard): from the scenario's config, else
        # PoolLedger's; none means the one default negotiator on the pool-wide ledger.
        shards = shards_from_config(scenario.config) or shards_from_settings(settings)
        self.named = [NamedNegotiator(negotiator_name(s.name, scenario.central_manager),
                                      ShardFilter(s), Ledger(settings)) for s in shards]
        self.record_durations = record_durations
        self.progress = Progress(progress)
        for name in (topic, *((derived_topic,) if derived_topic else ())):
            log.create_topic(TopicSpec(name, 1))
        # fold only what this run appends: start at the topic's current end (a ledger that
        # covers the topic from its start keeps snapshots of itself)
        ends = log.end_offsets(topic)
        self.runner = EmbeddedRunner(self.elog, settings, topic=topic, derived_topic=derived_topic,
                                     start=ends if any(ends.values()) else None)
        self.ledger = self.runner.ledger
        self.positions = self.runner.positions
        self._seq = 0
        self.result = RunResult(self.ledger, scenario.start, scenario.end,
                                negotiators={n.name: n.ledger for n in self.named})
        # the central manager's own ads (Negotiator, Accounting, Collector), as a collector
        # holds them for condor_status and condor_gangliad
        self.negotiator_ads: dict[str, NegotiatorAd] = {}
        self.collector = f"collector@{scenario.central_manager}"
        self._collector_due: float | None = None
        self._collector_seq = 0

    # -- the log round trip ------------------------------------------------------------

    def publish(self, envelopes: Iterable[Envelope]) -> None:
        """Append to the log, then fold everything new read back from it."""
        batch = list(envelopes)
        if batch:
            self.elog.append(self.topic, batch)
            self.result.events += len(batch)
        # a rejected event is dead-lettered by the runner; the negotiator never sees it
        self.runner.fold(self._applied)

    def _applied(self, record: Record, env: Envelope) -> None:
        """After the runner folded `env`: the named negotiators' ledgers."""
        for neg in self.named:
            routed = neg.filter.route(env)
            if routed is not None:
                try:
                    neg.ledger.apply(routed)  # its derived events stay internal
                except EventRejectedError as exc:
                    self.elog.reject(self.topic, record, EventRejectedError(
                        exc.event_id, f"{neg.name}: {exc.reason}"))

    def _event(self, payload: Payload, ts: float, source: str | None = None) -> Envelope:
        self._seq += 1
        return make_event(payload, ts=ts, source=source or self.negotiator, seq=self._seq)

    # -- one cycle -----------------------------------------------------------------------

    def cycle(self, t: float) -> None:
        """A negotiation cycle at event time `t`; its events, then the pool's reaction.

        With named negotiators each runs its cycle in turn (in NEGOTIATOR_NAMES order), on
        its own ledger and slots, after the previous one's matches were acted on."""
        if not self.named:
            self.result.cycles += 1
            self._negotiate(t, self.ledger, None, self.negotiator, self.result.cycles)
        for neg in self.named:
            self.result.cycles += 1
            neg.cycles += 1
            view = negotiation_view(neg.ledger, self.ledger)
            cfg = negotiator_config(neg.ledger.settings)
            if neg.filter.constraint is not None:
                # the matchmaker applies the shard's constraint too (and the pool-wide one)
                both = f"({neg.filter.constraint})" if not cfg.negotiator_slot_constraint else \
                    f"({cfg.negotiator_slot_constraint}) && ({neg.filter.constraint})"
                cfg = dataclasses.replace(cfg, negotiator_slot_constraint=both)
            self._negotiate(t, view, cfg, neg.name, neg.cycles)
        self._publish_collector_ad(t)
        self._sample(t)

    def _negotiate(self, t: float, ledger: Ledger, cfg: Any, negotiator: str, number: int
                   ) -> None:
        where = {self.topic: {str(p): o for p, o in sorted(self.positions.items())}}
        payloads = run_cycle(ledger, cfg, t, number, where, job_ads=self.job_ads,
                             negotiator=negotiator,
                             clock=time.perf_counter if self.record_durations else None)
        # the cycle event first: it is when the accountant updates (HTCondor: cycle start)
        cycled = [p for p in payloads if isinstance(p, NegotiationCycled)]
        matches = [p for p in payloads if isinstance(p, Matched)]
        self.publish(self._event(p, t, negotiator) for p in [*cycled, *matches])
        self._act(t, cycled, matches)
        self._publish_negotiator_ads(t, ledger, negotiator, cycled)
        self.runner.checkpoint()

    def _act(self, t: float, cycled: list[NegotiationCycled], matches: list[Matched]) -> None:
        """Count a cycle's statistics, then let the pool act on its matches (on the log)."""
        res = self.result
        for c in cycled:
            res.durations.append(c.duration)
            for entry in c.rejections.values():
                if "reason" in entry:
                    for reason, n in entry["reasons"].items():
                        res.rejections[reason] += n
            for st in c.submitters.values():
                if st.get("not_considered"):
                    res.rejections[f"not considered: {st['stopped']}"] += st["not_considered"]
        res.matches += len(matches)
        reaction: list[Envelope] = []
        for m in matches:
            try:
                reaction += self.sim.apply_match(m, t)
            except MatchError:
                res.stale_matches += 1
        self.publish(reaction)

    def _publish_negotiator_ads(self, t: float, ledger: Ledger, negotiator: str,
                                cycled: list[NegotiationCycled]) -> None:
        """The Negotiator ad with this cycle's statistics and the Accounting ads, as
        condor_negotiator publishes them at the end of a cycle."""
        ads = self.negotiator_ads.get(negotiator)
        if ads is None:
            ads = self.negotiator_ads[negotiator] = NegotiatorAd(negotiator, self.scenario.start)
        slots, schedds = cycle_ad_counts(self.ledger)
        limits = {n: v["InUse"] for n, v in ledger.limits_view().items()}
        payloads: list[Payload] = []
        for c in cycled:
            payloads.append(ads.cycle(c, total_slots=slots, candidate_slots=slots,
                                      schedds=schedds, limits=limits))
        payloads += accounting_ads(ledger.priorities(t), ledger.group_quotas(), negotiator)
        self.publish(self._event(p, t, negotiator) for p in payloads)

    def _publish_collector_ad(self, t: float) -> None:
        """The collector's own ad every COLLECTOR_UPDATE_INTERVAL of event time."""
        if self._collector_due is not None and t < self._collector_due:
            return
        self._collector_due = t + COLLECTOR_UPDATE_INTERVAL
        held = self.ledger.held_ads()
        ad = collector_ad(self.collector, self.scenario.start, t, held, self.ledger.update_totals())
        self._collector_seq += 1  # its own source: its own gap-free sequence
        self.publish([make_event(ad, ts=t, source=self.collector, seq=self._collector_seq)])

    def _sample(self, t: float) -> None:
        led = self.ledger
        size = led.pool_size()
        rup: dict[str, float] = {}
        eup: dict[str, float] = {}
        share: dict[str, float] = {}
        for name, rec in led.priorities(t).items():
            if rec["IsAccountingGroup"]:
                continue
            rup[name] = float(rec["Priority"])
            eup[name] = float(rec["EffectivePriority"])
            share[name] = float(rec["WeightedResourcesUsed"]) / size if size > 0 else 0.0
        demand = led.requested()
        self.result.samples.append(Sample((t - self.scenario.start) / 3600.0, self.result.cycles,
                                          size, rup, eup, share, demand))

    # -- the run -------------------------------------------------------------------------

    def interval(self) -> float:
        """NEGOTIATOR_INTERVAL in force on the log (config.changed included)."""
        return negotiator_interval(self.ledger.settings)

    def run(self, hours: float | None = None) -> RunResult:
        """Run to the scenario's end (or `hours` of virtual time); returns the result."""
        wall = time.perf_counter()
        start = self.scenario.start
        end = start + hours * 3600.0 if hours is not None else self.scenario.end
        res = self.result
        res.end = end
        span = max(end - start, 1.0)
        t = start
        while True:
            self.publish(self.sim.advance_to(t))
            self.cycle(t)
            self.progress.update((t - start) / span, (t - start) / 3600.0, res.events)
            nxt = t + self.interval()
            if nxt > end:
                break
            t = nxt
        self.publish(self.sim.advance_to(end))
        self.runner.snapshot()
        self.progress.update(1.0, (end - start) / 3600.0, res.events, force=True)
        self.progress.close()
        res.positions = dict(self.positions)
        res.wall_seconds = time.perf_counter() - wall
        return res


# --- the faust cross-check -------------------------------------------------------------------

def settings_config_text(settings: Any) -> str:
    """Every knob set away from its default, as condor_config lines (for a worker process)."""
    lines = []
    for name in settings:
        if settings.is_set(name):
            text = str(settings.text(name)).replace("\n", " ")
            lines.append(f"{name} = {text}\n")
    return "".join(lines)


class FaustCheck:
    """A faust worker folding the run's topic as it grows, and the comparison of its state
    with the loop's at the end (a worker whose fold fails exits rather than go on)."""

    def __init__(self, bootstrap: str, app_id: str, topic: str, config: Path, workdir: Path) -> None:
        self.bootstrap, self.app_id, self.topic = bootstrap, app_id, topic
        workdir.mkdir(parents=True, exist_ok=True)
        # absolute paths: the worker runs in `workdir`, where a relative `out/faust.conf` is not
        env = dict(os.environ, POOLLEDGER_BROKER=f"kafka://{bootstrap}",
                   POOLLEDGER_FAUST_APP=app_id, POOLLEDGER_EVENTS_TOPIC=topic,
                   POOLLEDGER_CONFIG=str(config.resolve()), POOLLEDGER_HOME=str(workdir.resolve()))
        self.logfile = workdir / f"{app_id}.log"
        self._out = os.fdopen(open_private(self.logfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streams.faust_app", "worker", "-l", "warn"],
            env=env, stdout=self._out, stderr=subprocess.STDOUT, cwd=workdir)

    def wait(self, settings: SettingsLike, applied: int, timeout: float = 300.0) -> Ledger | None:
        """Poll the worker's changelog state until it has applied `applied` events (or the
        worker or its agent dies, or `timeout` passes); the last state read."""
        from streams.faust_adapter import read_state
        from streams.log.kafka import SaslLogin

        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = read_state(self.bootstrap, settings, self.app_id,
                               sasl=SaslLogin.from_settings(settings))
            if state is not None and state.applied >= applied or self.proc.poll() is not None:
                break
            if b"Crashed reason=" in self.logfile.read_bytes():
                break  # the agent died; the worker would wait forever
            time.sleep(1.0)
        return state

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()

    def last_words(self) -> str:
        """Why a worker that wrote nothing stopped: its log's last error line (a traceback's
        exception line), else its last line, terminal escapes removed."""
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", self.logfile.read_text(errors="replace"))
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln or "ERROR" in ln]
        return (errors or lines or ["its log is empty"])[-1]

    def compare(self, state: Ledger | None, ledger: Ledger) -> str | None:
        """None when the worker's changelog state, job ads included, equals `ledger`'s, else
        what differs."""
        if state is None:
            status = self.proc.poll()
            how = f"it exited with status {status}" if status is not None else "it is still running"
            return f"the faust worker wrote no state ({how}; its log ends: {self.last_words()})"
        if state.to_snapshot() == ledger.to_snapshot():
            return None
        mine, theirs = ledger.to_doc(), state.to_doc()
        diff = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
        diff = diff or ["job ads"]
        return (f"sections differ: {', '.join(diff)} (loop applied {ledger.applied}, "
                f"faust applied {state.applied})")
