"""condor_config knobs for simulated daemons: case-insensitive, layered, `$(MACRO)` expansion.

Layers mirror HTCondor's config files read in order (built-in defaults, pool-wide config,
machine-local config, then runtime `config.changed` overrides). A knob that names itself, as in
seed 001's `START = ($(START)) || Owner == "coltrane"`, expands to the value of the layers
below, which is what re-defining a macro in a later config file does.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from services.pool.errors import PoolConfigError

#: Defaults of the knobs the simulated startd and schedd read (seed 001's default policy).
DEFAULTS: dict[str, str] = {
    # helper macros from seed 001's "Default Policy" (MachineBusy's missing paren fixed)
    "MINUTE": "60",
    "HOUR": "(60 * $(MINUTE))",
    "StateTimer": "(time() - EnteredCurrentState)",
    "ActivityTimer": "(time() - EnteredCurrentActivity)",
    "ActivationTimer": "(time() - JobStart)",
    "NonCondorLoadAvg": "(LoadAvg - CondorLoadAvg)",
    "BackgroundLoad": "0.3",
    "HighLoad": "0.5",
    "StartIdleTime": "15 * $(MINUTE)",
    "ContinueIdleTime": "5 * $(MINUTE)",
    "MaxSuspendTime": "10 * $(MINUTE)",
    "KeyboardBusy": "KeyboardIdle < $(MINUTE)",
    "ConsoleBusy": "(ConsoleIdle  < $(MINUTE))",
    "CPUIdle": "$(NonCondorLoadAvg) <= $(BackgroundLoad)",
    "CPUBusy": "$(NonCondorLoadAvg) >= $(HighLoad)",
    "KeyboardNotBusy": "($(KeyboardBusy) == False)",
    "MachineBusy": "($(CPUBusy) || $(KeyboardBusy))",
    # the default policy: preemption disabled, always start
    "START": "True",
    "IS_OWNER": "False",
    "RANK": "0",
    "WANT_SUSPEND": "False",
    "WANT_VACATE": "False",
    "SUSPEND": "False",
    "CONTINUE": "True",
    "PREEMPT": "False",
    "KILL": "False",
    "MachineMaxVacateTime": "10 * $(MINUTE)",
    "MAXJOBRETIREMENTTIME": "0",
    # timers (seconds)
    "MATCH_TIMEOUT": "120",
    "KILLING_TIMEOUT": "30",
    "CLAIM_WORKLIFE": "1200",
    "UPDATE_INTERVAL": "300",
    "POLLING_INTERVAL": "5",
    "ALIVE_INTERVAL": "300",
    "MAX_CLAIM_ALIVES_MISSED": "6",
    "SCHEDD_INTERVAL": "300",
    "NEGOTIATOR_INTERVAL": "60",
    "DISCONNECTED_KEYBOARD_IDLE_BOOST": "1200",
    # accounting and partitionable slots
    "SLOT_WEIGHT": "Cpus",
    "UID_DOMAIN": "example.org",
    "MODIFY_REQUEST_EXPR_REQUESTCPUS": "quantize(RequestCpus, {1})",
    "MODIFY_REQUEST_EXPR_REQUESTMEMORY": "quantize(RequestMemory, {128})",
    "MODIFY_REQUEST_EXPR_REQUESTDISK": "quantize(RequestDisk, {1024})",
    "OPSYS": "LINUX",
    "ARCH": "X86_64",
    # backfill (seed 001, "Backfill State"): off unless configured
    "ENABLE_BACKFILL": "False",
    "START_BACKFILL": "False",
    "EVICT_BACKFILL": "False",
    # condor_defrag (REFERENCE.md; services.pool.defrag)
    "DEFRAG_INTERVAL": "600",
    "DEFRAG_UPDATE_INTERVAL": "300",
    "DEFRAG_DRAINING_MACHINES_PER_HOUR": "0",
    "DEFRAG_MAX_CONCURRENT_DRAINING": "-1",
    "DEFRAG_MAX_WHOLE_MACHINES": "-1",
    "DEFRAG_WHOLE_MACHINE_EXPR": "Cpus == TotalSlotCpus",
    "DEFRAG_RANK": "-ExpectedMachineGracefulDrainingBadput",
    "DEFRAG_DRAINING_SCHEDULE": "graceful",
    "DEFRAG_CANCEL_REQUIREMENTS": "$(DEFRAG_WHOLE_MACHINE_EXPR)",
}

_MACRO = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.]*)(?::([^)]*))?\)")


class Config:
    """A stack of knob layers (lowest first); lookups are case-insensitive like condor_config."""

    def __init__(self, *layers: Mapping[str, object]) -> None:
        self._layers: list[dict[str, tuple[str, str]]] = []
        self.push(DEFAULTS)
        for layer in layers:
            self.push(layer)

    def push(self, layer: Mapping[str, object]) -> None:
        """Add a layer of knobs above the existing ones (a later config file)."""
        self._layers.append({k.upper(): (k, _as_text(k, v)) for k, v in layer.items()})

    def set(self, knob: str, value: object) -> None:
        """A runtime override (`config.changed`); `$(KNOB)` in it means the previous value."""
        self.push({knob: value})

    def child(self, *layers: Mapping[str, object]) -> Config:
        """A config that reads this one's layers and then `layers` (e.g. one machine's)."""
        c = Config.__new__(Config)
        c._layers = list(self._layers)
        for layer in layers:
            c.push(layer)
        return c

    def raw(self, knob: str) -> str | None:
        """The unexpanded value of the topmost layer defining `knob`."""
        return self._lookup(knob.upper(), len(self._layers))[0]

    def defined(self, knob: str) -> bool:
        """True when some layer defines `knob`."""
        return self.raw(knob) is not None

    def names(self) -> list[str]:
        """Every defined knob name (as first spelled), for prefix scans like SLOT_TYPE_<N>."""
        seen: dict[str, str] = {}
        for layer in self._layers:
            for upper, (name, _) in layer.items():
                seen.setdefault(upper, name)
        return sorted(seen.values())

    def get(self, knob: str, default: str | None = None) -> str | None:
        """The macro-expanded value of `knob`, or `default` when no layer defines it."""
        value, level = self._lookup(knob.upper(), len(self._layers))
        if value is None:
            return default
        return self._expand(value, knob.upper(), level, ((knob.upper(), level),))

    def number(self, knob: str, default: float) -> float:
        """A knob holding a plain number (timers, counts); expressions are not allowed here."""
        text = self.get(knob)
        if text is None or not text.strip():
            return default
        try:
            return float(eval_constant(text))
        except (TypeError, ValueError):
            raise PoolConfigError(f"expected a number, got {text!r}", knob=knob) from None

    def boolean(self, knob: str, default: bool) -> bool:
        """A knob holding True/False."""
        text = self.get(knob)
        if text is None or not text.strip():
            return default
        t = text.strip().lower()
        if t in ("true", "1", "yes", "t"):
            return True
        if t in ("false", "0", "no", "f"):
            return False
        raise PoolConfigError(f"expected True or False, got {text!r}", knob=knob)

    def _lookup(self, upper: str, below: int) -> tuple[str | None, int]:
        for level in range(below - 1, -1, -1):
            hit = self._layers[level].get(upper)
            if hit is not None:
                return hit[1], level
        return None, -1

    def _expand(self, text: str, name: str, level: int, stack: tuple[tuple[str, int], ...]) -> str:
        if len(stack) > 64:
            raise PoolConfigError("macro expansion too deep", knob=name)

        def repl(m: re.Match[str]) -> str:
            ref = m.group(1).upper()
            below = level if ref == name else len(self._layers)
            value, at = self._lookup(ref, below)
            if value is None:
                return m.group(2) if m.group(2) is not None else ""
            if (ref, at) in stack:
                raise PoolConfigError(f"macro $({m.group(1)}) refers to itself", knob=name)
            return self._expand(value, ref, at, stack + ((ref, at),))

        return _MACRO.sub(repl, text)


def _as_text(knob: str, value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise PoolConfigError(f"a knob value must be a string, number or boolean, not {type(value).__name__}",
                          knob=knob)


def eval_constant(text: str) -> float:
    """Evaluate a constant numeric expression (`10 * 60`) with classad2."""
    import classad2

    try:
        value = classad2.ExprTree(text).eval()
    except Exception:
        raise ValueError(text) from None
    if isinstance(value, (bool, classad2.Value)) or not isinstance(value, (int, float)):
        raise ValueError(text)  # classad2.Value (UNDEFINED/ERROR) is an int enum
    return float(value)
