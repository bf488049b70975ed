"""PoolSim: a scenario's daemons on one virtual clock, emitting what a real pool would.

The boundary to the rest of PoolLedger is deliberately narrow: `advance_to(t)` runs the pool
up to event time `t` and returns the envelopes it produced, in time order; `idle_jobs()` and
`slot_ads()` are what a negotiator reads; `apply_match(match, now)` is the schedd and startd
acting on a negotiator's `match` event. The simulation never negotiates by itself.
"""
from __future__ import annotations

import fnmatch
import os
import random
from collections.abc import Callable, Mapping
from typing import Any

from schemas.config import resolve_env
from schemas.events import AdminCommanded, ConfigChanged, Envelope, Matched, payload_from_dict
from schemas.settings import DaemonConfig, knob_text
from services.pool.clock import VirtualClock
from services.pool.daemon import Daemon
from services.pool.defrag import Defrag
from services.pool.defrag import enabled as defrag_enabled
from services.pool.errors import ClockError, MatchError
from services.pool.scenario import Action, JobSpec, Scenario, SubmitterSpec
from services.pool.schedd import JobDescription, JobView, Schedd
from services.pool.startd import Hardware, Startd
from services.pool.submit_policy import SubmitRejectedError


def issued_text(value: Any) -> str:
    """A knob value as a `config.changed` carries it: `$ENV()` resolved now, by the issuer,
    so no fold reads its own environment (DESIGN invariant 1)."""
    return resolve_env(knob_text(value), os.environ)


class PoolSim:
    """Every startd and schedd of `scenario`, driven by a virtual clock and a seeded `rng`."""

    def __init__(self, scenario: Scenario, rng: random.Random) -> None:
        self.scenario = scenario
        self.clock = VirtualClock(scenario.start)
        self.outbox: list[Envelope] = []
        pool = {"UID_DOMAIN": scenario.uid_domain, "FILESYSTEM_DOMAIN": scenario.uid_domain,
                "COLLECTOR_HOST": scenario.central_manager, **scenario.config}
        self.config = DaemonConfig(pool)
        self.admin = Daemon(f"admin@{scenario.central_manager}", self.clock, self.outbox)
        self._admins: dict[str, Daemon] = {}
        self.startds: dict[str, Startd] = {}
        for m in scenario.machines:
            for host in m.hosts():
                self.startds[host] = Startd(
                    host, self.config.child({"FULL_HOSTNAME": host}, m.config),
                    Hardware(cpus=m.cpus, memory=m.memory, disk=m.disk, swap=m.swap, gpus=m.gpus),
                    self.clock, self.outbox, attrs=m.attrs,
                    periodic_updates=scenario.periodic_slot_updates)
        self.schedds: dict[str, Schedd] = {
            host: Schedd(host, self.config.child({"FULL_HOSTNAME": host}), self.clock, self.outbox, self,
                         claim_delay=scenario.claim_delay)
            for host in scenario.schedds}
        #: condor_defrag, when DAEMON_LIST names DEFRAG (on the central manager)
        self.defrag = Defrag(scenario.central_manager, self.config, self.clock, self.outbox, self) \
            if defrag_enabled(self.config) else None
        start = scenario.start
        self.clock.schedule(start, self._boot)
        for sub in scenario.submitters:
            for spec in sub.jobs:
                stream = random.Random(rng.getrandbits(64))
                self._schedule_arrivals(sub, spec, stream)
        for action in scenario.actions:
            self.clock.schedule(start + action.at, self._action(action))

    # ---- the boundary ---------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The virtual now (epoch seconds)."""
        return self.clock.now

    @property
    def end(self) -> float:
        """When the scenario ends (epoch seconds)."""
        return self.scenario.end

    def advance_to(self, t: float) -> list[Envelope]:
        """Run every daemon up to event time `t`; the events produced, in time order."""
        if t < self.clock.now:
            raise ClockError(f"cannot advance to {t}: the pool is already at {self.clock.now}")
        self.clock.run_until(t)
        return self._take()

    def apply_match(self, match: Matched | Mapping[str, Any], now: float) -> list[Envelope]:
        """A negotiator's match at `now`: the startd hears of it (Matched), the schedd claims
        the slot and starts the job (or waits for the preemption it asked for). Returns the
        events up to and including `now` (anything else due before `now` comes first)."""
        m = match if isinstance(match, Matched) else payload_from_dict("match", dict(match))
        assert isinstance(m, Matched)
        if now < self.clock.now:
            raise ClockError(f"match at {now} but the pool is already at {self.clock.now}")
        self.clock.run_until(now)
        startd = self.startd_for(m.slot)
        if startd is None:
            raise MatchError(f"no machine publishes slot {m.slot!r}")
        schedd = self.schedd_named(m.schedd)
        if schedd is None:
            raise MatchError(f"no schedd {m.schedd!r}")
        if startd.up:
            startd.match(m.slot, m)
            schedd.on_match(m, startd)
        self.clock.run_until(now)
        return self._take()

    def idle_jobs(self) -> list[JobView]:
        """Idle jobs of every running schedd (what the negotiator asks each schedd for)."""
        out: list[JobView] = []
        for host in sorted(self.schedds):
            out.extend(self.schedds[host].idle_jobs())
        return out

    def slot_ads(self) -> list[dict[str, Any]]:
        """The last published ad of every live slot (the collector's view), in host order."""
        out: list[dict[str, Any]] = []
        for host in sorted(self.startds):
            startd = self.startds[host]
            out.extend(dict(startd.published[s.name]) for s in startd.all_slots()
                       if s.name in startd.published)
        return out

    # ---- lookups ----------------------------------------------------------------------------

    def startd_for(self, slot: str) -> Startd | None:
        """The startd of `slot` ("slot1_2@host" -> the startd on host)."""
        return self.startds.get(slot.split("@", 1)[1]) if "@" in slot else None

    def schedd_named(self, name: str) -> Schedd | None:
        """A schedd by daemon name (schedd@host) or by host."""
        return self.schedds.get(name.split("@", 1)[1] if name.startswith("schedd@") else name)

    def _take(self) -> list[Envelope]:
        out, self.outbox[:] = list(self.outbox), []
        return out

    # ---- scheduled work ---------------------------------------------------------------------

    def _boot(self) -> None:
        if self.scenario.emit_config:
            for knob, value in self.scenario.config.items():
                self.admin.emit(ConfigChanged(knob=knob, value=issued_text(value), by="scenario"))
        for host in self.startds:
            self.startds[host].boot()
        for host in self.schedds:
            self.schedds[host].boot()
        if self.defrag is not None:
            self.defrag.boot()

    def _schedule_arrivals(self, sub: SubmitterSpec, spec: JobSpec, rng: random.Random) -> None:
        arrival = spec.arrival
        start = self.scenario.start
        desc = JobDescription(
            owner=sub.user, accounting_group=sub.group, accounting_group_user=sub.group_user,
            nice_user=sub.nice_user, request_cpus=spec.request_cpus,
            request_memory=spec.request_memory, request_disk=spec.request_disk,
            request=dict(spec.request), requirements=spec.requirements, rank=spec.rank,
            priority=spec.priority, concurrency_limits=spec.concurrency_limits,
            max_retirement_time=spec.max_retirement_time,
            job_max_vacate_time=spec.job_max_vacate_time,
            job_lease_duration=spec.job_lease_duration, kill_sig=spec.kill_sig, cmd=spec.cmd,
            args=spec.args, attrs=dict(spec.attrs), vacate_time=spec.vacate_time,
            exit_code=spec.exit_code, on_exit_remove=spec.on_exit_remove, cron=dict(spec.cron),
            deferral_time=spec.deferral_time, deferral_window=spec.deferral_window,
            deferral_prep_time=spec.deferral_prep_time, cpu_efficiency=spec.cpu_efficiency)
        schedd = self.schedds[sub.schedd]

        def submit() -> None:
            if schedd.up:
                try:
                    schedd.submit(desc, [spec.duration.sample(rng) for _ in range(arrival.size)])
                except SubmitRejectedError:
                    pass  # condor_submit told the user; the schedd keeps it in `rejections`

        if arrival.kind == "batch":
            self.clock.schedule(start + arrival.at, submit)
            return
        stop = start + arrival.stop if arrival.stop is not None else self.scenario.end

        def gap() -> float:
            return rng.expovariate(arrival.rate / 3600.0) if arrival.kind == "poisson" else arrival.every

        def arrive(n: int) -> None:
            submit()
            if arrival.count is not None and n + 1 >= arrival.count:
                return
            nxt = self.clock.now + gap()
            if nxt <= stop:
                self.clock.schedule(nxt, lambda: arrive(n + 1))

        first = start + arrival.start + (gap() if arrival.kind == "poisson" else 0.0)
        if first <= stop:
            self.clock.schedule(first, lambda: arrive(0))

    def _action(self, action: Action) -> Callable[[], None]:
        return lambda: self._act(action)

    def _machines(self, pattern: str) -> list[Startd]:
        return [s for host, s in self.startds.items() if fnmatch.fnmatchcase(host, pattern)]

    def _act(self, action: Action) -> None:
        p = action.params
        kind = action.kind
        handlers: dict[str, Callable[[], None]] = {
            "userprio": lambda: self._userprio(p),
            "config": lambda: self._config(p),
            "schedd_down": lambda: self.schedds[p["schedd"]].go_down(),
            "schedd_up": lambda: self.schedds[p["schedd"]].come_up(),
        }
        if kind in handlers:
            handlers[kind]()
            return
        if kind in ("remove", "hold", "release", "prio"):
            schedd = self.schedds[p["schedd"]]
            if not schedd.up:
                return  # the command cannot reach a schedd that is down
            if kind == "prio":
                schedd.set_prio(p["user"], p["value"], p.get("count"))
            else:
                op = {"remove": schedd.remove, "hold": schedd.hold, "release": schedd.release_jobs}[kind]
                op(p["user"], p.get("count"), p.get("by", ""))
            return
        for startd in self._machines(p["machines"]):
            if kind == "startd_on":
                if not startd.up:
                    startd.boot()
                continue
            if not startd.up:
                continue
            if kind == "machine_attrs":
                startd.set_attrs(p["attrs"])
            elif kind == "owner_active":
                startd.owner_active(self.clock.now + p["for"])
            elif kind == "vacate":
                startd.vacate()
            elif kind == "drain":
                startd.drain(p["graceful"], schedule=p.get("schedule"),
                             resume_on_completion=p.get("resume_on_completion", False),
                             reason=p.get("reason", ""))
            elif kind == "cancel_drain":
                startd.cancel_drain()
            elif kind == "startd_off":
                startd.shutdown(p["fast"])

    def _userprio(self, p: Mapping[str, Any]) -> None:
        admin = self.admin
        if p.get("negotiator"):
            # condor_userprio -name NEG: the negotiator is named in the source (see
            # services.negotiator.shard.admin_source); its own seq stream
            source = f"{self.admin.source}/{p['negotiator']}"
            admin = self._admins.get(source) or self._admins.setdefault(
                source, Daemon(source, self.clock, self.outbox))
        admin.emit(AdminCommanded(op=p["op"], target=p["target"], value=p.get("value"),
                                       by=p.get("by", "admin"), reason=p.get("reason", ""),
                                       duration=p.get("duration")))

    def _config(self, p: Mapping[str, Any]) -> None:
        value = issued_text(p["value"])
        self.admin.emit(ConfigChanged(knob=p["knob"], value=value, by=p.get("by", "admin")))
        self.config.set(p["knob"], value)
        for startd in self.startds.values():
            startd.reconfig(p["knob"], value)
        for schedd in self.schedds.values():
            schedd.config.set(p["knob"], value)

