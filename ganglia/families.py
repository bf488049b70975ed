"""Prometheus families of gangliad metrics, named by Prometheus's conventions
(https://prometheus.io/docs/practices/naming/): `htcondor_` + snake_case, the base unit in the
name (`_bytes`, `_seconds`, `_ratio`), `_total` on counters, one HELP per family.

Why a family apart from the Ganglia metric: gangliad's names ("Memory in Pool",
"alice@example.org-RunningJobs") are what Ganglia and Graphite show and stay as condor_gangliad
writes them; a Prometheus family is one name for every daemon, submitter or limit, told apart by
labels. The metric language carries it in PoolLedger's attributes PrometheusName, PrometheusType,
PrometheusHelp and PrometheusLabel_<label> (ganglia/metrics.py); without PrometheusName the
family is derived from the Name and Units here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from prometheus_client.validation import METRIC_NAME_RE

__all__ = ["Family", "PREFIX", "KINDS", "make_family", "snake_case", "derived_body", "base_unit",
           "SNAKE_CASE"]

PREFIX: Final = "htcondor_"
KINDS: Final = ("gauge", "counter")
#: what Prometheus's naming rules (and `promtool check metrics`) accept as a name or label name
SNAKE_CASE: Final = re.compile(r"[a-z_][a-z0-9_]*\Z")
#: gangliad Units -> (Prometheus base unit, factor from the Ganglia value to that unit)
_BASE_UNITS: Final = {"bytes": ("bytes", 1.0), "byte": ("bytes", 1.0), "b": ("bytes", 1.0),
                      "seconds": ("seconds", 1.0), "second": ("seconds", 1.0), "s": ("seconds", 1.0),
                      "%": ("ratio", 0.01), "percent": ("ratio", 0.01), "ratio": ("ratio", 1.0)}


@dataclass(frozen=True, slots=True)
class Family:
    """One Prometheus family: full name (counters end in `_total`), type, HELP, base unit
    ('' for counts of things) and the factor turning a Ganglia value into that unit."""

    name: str
    kind: str
    help: str
    unit: str = ""
    factor: float = 1.0


def snake_case(text: str) -> str:
    """`TotalRunningJobs` -> total_running_jobs, `Jobs in Pool` -> jobs_in_pool,
    `LastNegotiationCycleMatches0` -> last_negotiation_cycle_matches0."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", text)
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unnamed"


def derived_body(name: str, kind: str) -> str:
    """The family body of a metric without PrometheusName: its Name in snake_case, a gauge's
    trailing "total" moved to the front (HostsTotal -> total_hosts: `_total` is a counter's)."""
    body = snake_case(name)
    if kind != "counter" and (body == "total" or body.endswith("_total")):
        body = "total_" + body[:-len("_total")] if body != "total" else "total_value"
    return body


def base_unit(units: str) -> tuple[str, float]:
    """The Prometheus base unit of gangliad Units and the factor to it ('', 1.0: a count)."""
    return _BASE_UNITS.get(units.strip().lower(), ("", 1.0))


def make_family(body: str, kind: str, help_text: str, units: str) -> Family:
    """The family of a PrometheusName (or a Name made snake_case): prefixed, its base unit
    and `_total` appended when missing. ValueError when the result breaks the rules."""
    unit, factor = base_unit(units)
    if body in ("", PREFIX):
        raise ValueError("an empty name")
    name = body if body.startswith(PREFIX) else PREFIX + body
    if kind == "counter" and name.endswith("_total"):
        name = name[:-len("_total")]
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    if kind == "counter":
        name += "_total"
    elif name.endswith("_total"):
        raise ValueError(f"{name!r} ends in _total, which only a counter's name does "
                         "(PrometheusType = \"counter\" if it only grows)")
    if not SNAKE_CASE.match(name) or not METRIC_NAME_RE.match(name) or "__" in name:
        raise ValueError(f"{name!r} is not a snake_case Prometheus name")
    return Family(name=name, kind=kind, help=" ".join(help_text.split()), unit=unit, factor=factor)
