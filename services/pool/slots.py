"""A machine's slot layout from condor_config, as the condor_startd builds it at start-up.

Seed 001: NUM_SLOTS static slots dividing everything evenly; SLOT_TYPE_<N> with a blanket
fraction/percentage or a per-resource list (fractions, percentages, absolute amounts, `auto`),
NUM_SLOTS_TYPE_<N> copies of each, SLOT_TYPE_<N>_PARTITIONABLE; custom resources declared by
MACHINE_RESOURCE_<name> (a count or a list of ids; GPUs are one such resource). With no slot
configuration at all a startd of HTCondor 23+ makes one partitionable slot of the whole machine.
`auto` shares divide whatever the explicit shares left; an impossible layout is refused, as
the startd refuses to start.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

from schemas.settings import DaemonConfig
from services.pool.errors import SlotConfigError

#: Standard resources: ClassAd attribute name -> first letters accepted in SLOT_TYPE lists.
STANDARD = {"Cpus": "c", "Memory": "rm", "Disk": "d", "Swap": "sv"}
_TYPE_KNOB = re.compile(r"SLOT_TYPE_(\d+)\Z", re.I)
_RESOURCE_KNOB = re.compile(r"MACHINE_RESOURCE_([A-Za-z_][A-Za-z0-9_]*)\Z", re.I)


@dataclass(frozen=True, slots=True)
class Share:
    """One resource's share in a slot type: 'auto', a fraction of the total, or an amount."""

    kind: str  # "auto" | "frac" | "abs"
    value: Fraction = Fraction(0)
    ids: tuple[str, ...] = ()  # resource ids a string-literal constraint asks for


@dataclass(frozen=True, slots=True)
class MachineResources:
    """What the startd detected: totals of every resource and the ids of custom resources."""

    totals: dict[str, int]
    ids: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def custom(self) -> list[str]:
        """Custom resource attribute names (GPUs, Cogs, ...)."""
        return [r for r in self.totals if r not in STANDARD]


@dataclass(frozen=True, slots=True)
class SlotSpec:
    """One configured slot: its SlotID, type, partitionability and resources by attribute name."""

    slot_id: int
    slot_type: int
    partitionable: bool
    resources: dict[str, int]
    assigned: dict[str, tuple[str, ...]] = field(default_factory=dict)


def resource_attr(name: str) -> str:
    """The ClassAd attribute of a custom resource: the knob's spelling, first letter upper."""
    return name[:1].upper() + name[1:]


def detect(config: DaemonConfig, *, cpus: int, memory: int, disk: int, swap: int | None = None,
           gpus: int | list[str] = 0) -> MachineResources:
    """The machine's resources: hardware given by the scenario, overridden by NUM_CPUS/MEMORY."""
    totals: dict[str, int] = {
        "Cpus": int(config.number("NUM_CPUS", cpus)),
        "Memory": int(config.number("MEMORY", memory)),
        "Disk": int(config.number("DISK", disk)),
        "Swap": int(swap if swap is not None else int(config.number("MEMORY", memory)) * 1024),
    }
    ids: dict[str, tuple[str, ...]] = {}
    declared: dict[str, str] = {}
    if (isinstance(gpus, list) and gpus) or (isinstance(gpus, int) and gpus > 0):
        declared["GPUs"] = ",".join(gpus) if isinstance(gpus, list) else str(gpus)
    for knob in config.names():
        m = _RESOURCE_KNOB.match(knob)
        if m and m.group(1).upper() != "NAMES":
            declared = {k: v for k, v in declared.items() if k.upper() != m.group(1).upper()}
            declared[m.group(1)] = config.get(knob) or ""
    enabled = config.get("MACHINE_RESOURCE_NAMES")
    allow = {n.strip().upper() for n in re.split(r"[,\s]+", enabled) if n.strip()} if enabled else None
    for name, value in declared.items():
        if allow is not None and name.upper() not in allow:
            continue
        attr = resource_attr(name)
        if attr in STANDARD:
            raise SlotConfigError(f"custom resource {name!r} collides with a standard resource",
                                  knob=f"MACHINE_RESOURCE_{name}")
        text = value.strip()
        if re.fullmatch(r"\d+", text):
            count = int(text)
            prefix = "GPU" if attr == "GPUs" else attr
            ids[attr] = tuple(f"{prefix}-{i}" for i in range(count))
        else:
            ids[attr] = tuple(t for t in re.split(r"[,\s]+", text) if t)
        totals[attr] = len(ids[attr])
    return MachineResources(totals, ids)


def _parse_value(text: str, knob: str) -> Share:
    t = text.strip()
    try:
        if t.lower() == "auto":
            return Share("auto")
        if t.endswith("%"):
            return Share("frac", Fraction(t[:-1].strip()) / 100)
        if "/" in t:
            num, den = t.split("/", 1)
            return Share("frac", Fraction(int(num), int(den)))
        return Share("abs", Fraction(t))
    except (ValueError, ZeroDivisionError):
        raise SlotConfigError(f"cannot read share {text!r} (want N, N%, a/b or auto)", knob=knob) from None


def _resource_for(name: str, custom: list[str], knob: str) -> str:
    for attr in custom:
        if attr.lower() == name.lower():
            return attr
    first = name[:1].lower()
    for attr, letters in STANDARD.items():
        if first and first in letters:
            return attr
    raise SlotConfigError(f"unknown resource {name!r} in slot type", knob=knob)


def parse_slot_type(text: str, machine: MachineResources, knob: str) -> dict[str, Share]:
    """The per-resource shares of one SLOT_TYPE_<N> value (every resource gets an entry)."""
    resources = list(machine.totals)
    blanket = Share("auto")
    shares: dict[str, Share] = {}
    for item in (i.strip() for i in re.split(r"[,\n]", text)):
        if not item:
            continue
        if "=" not in item:
            blanket = _parse_value(item, knob)
            continue
        name, rhs = (p.strip() for p in item.split("=", 1))
        ids: tuple[str, ...] = ()
        if ":" in rhs:
            rhs, constraint = (p.strip() for p in rhs.split(":", 1))
            literal = re.fullmatch(r'"([^"]*)"', constraint)
            if literal:
                ids = tuple(x.strip() for x in literal.group(1).split(",") if x.strip())
        attr = _resource_for(name, machine.custom, knob)
        share = _parse_value(rhs, knob)
        shares[attr] = Share(share.kind, share.value, ids)
    return {r: shares.get(r, blanket) for r in resources}


def _slot_types(config: DaemonConfig) -> dict[int, str]:
    types: dict[int, str] = {}
    for knob in config.names():
        m = _TYPE_KNOB.match(knob)
        if m:
            types[int(m.group(1))] = config.get(knob) or ""
    return dict(sorted(types.items()))


def layout(config: DaemonConfig, machine: MachineResources) -> list[SlotSpec]:
    """The slots a startd creates from `config` on `machine`, in SlotID order."""
    types = _slot_types(config)
    plan: list[tuple[int, bool, dict[str, Share]]] = []  # (type, partitionable, shares)
    if types:
        for n, text in types.items():
            count = int(config.number(f"NUM_SLOTS_TYPE_{n}", 0))
            if count < 0:
                raise SlotConfigError("must not be negative", knob=f"NUM_SLOTS_TYPE_{n}")
            shares = parse_slot_type(text, machine, f"SLOT_TYPE_{n}")
            part = config.boolean(f"SLOT_TYPE_{n}_PARTITIONABLE", False)
            plan.extend((n, part, shares) for _ in range(count))
        if not plan:
            raise SlotConfigError("slot types are defined but no NUM_SLOTS_TYPE_<N> asks for any slot",
                                  knob="NUM_SLOTS_TYPE_1")
    elif config.defined("NUM_SLOTS"):
        count = int(config.number("NUM_SLOTS", 1))
        if count < 1:
            raise SlotConfigError("must be at least 1", knob="NUM_SLOTS")
        if count > machine.totals["Cpus"]:
            raise SlotConfigError(f"{count} slots but only {machine.totals['Cpus']} cores (NUM_CPUS)",
                                  knob="NUM_SLOTS")
        auto = {r: Share("auto") for r in machine.totals}
        plan = [(0, False, auto) for _ in range(count)]
    else:
        whole = {r: Share("frac", Fraction(1)) for r in machine.totals}
        plan = [(1, True, whole)]
    amounts = _allocate(plan, machine)
    specs = []
    for i, ((n, part, shares), res) in enumerate(zip(plan, amounts), start=1):
        assigned = {r: ids for r, ids in res[1].items()}
        specs.append(SlotSpec(i, n, part, res[0], assigned))
    return specs


def _allocate(plan: list[tuple[int, bool, dict[str, Share]]],
              machine: MachineResources) -> list[tuple[dict[str, int], dict[str, tuple[str, ...]]]]:
    out: list[tuple[dict[str, int], dict[str, tuple[str, ...]]]] = [({}, {}) for _ in plan]
    for res, total in machine.totals.items():
        fixed = 0
        autos = []
        for i, (n, _, shares) in enumerate(plan):
            share = shares[res]
            if share.kind == "auto":
                autos.append(i)
                continue
            amount = share.value * total if share.kind == "frac" else share.value
            if amount < 0:
                raise SlotConfigError(f"negative {res}", knob=f"SLOT_TYPE_{n}")
            whole = math.floor(amount)
            if res == "Cpus" and 0 < amount < 1:
                whole = 1
            out[i][0][res] = whole
            fixed += whole
            if fixed > total:
                raise SlotConfigError(f"slots ask for {fixed} {res} but the machine has {total}",
                                      knob=f"SLOT_TYPE_{n}")
        left = total - fixed
        each = math.floor(left / len(autos)) if autos else 0
        for i in autos:
            out[i][0][res] = each
        if res == "Cpus":
            for i, (n, _, _) in enumerate(plan):
                if out[i][0][res] < 1:
                    raise SlotConfigError("a slot would get no Cpus",
                                          knob=f"SLOT_TYPE_{n}" if n else "NUM_SLOTS")
        if res in machine.ids:
            free = list(machine.ids[res])
            for i, (n, _, shares) in enumerate(plan):
                want = shares[res].ids
                if want:
                    missing = [x for x in want if x not in free]
                    if missing:
                        raise SlotConfigError(f"{res} id(s) {', '.join(missing)} not available",
                                              knob=f"SLOT_TYPE_{n}")
                    for x in want:
                        free.remove(x)
                    picked = list(want)
                else:
                    picked = []
                out[i][1][res] = tuple(picked)
            for i, (n, _, shares) in enumerate(plan):
                need = out[i][0][res] - len(out[i][1][res])
                if need > 0:
                    out[i][1][res] = out[i][1][res] + tuple(free[:need])
                    del free[:need]
    return out
