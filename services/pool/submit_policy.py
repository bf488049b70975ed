"""The condor_schedd's submit-time policy: submit requirements and warnings (seed 001).

`SUBMIT_REQUIREMENT_NAMES` lists criteria evaluated in order with the Scheduler ad as MY and
the job ad as TARGET; the first that is not true rejects the whole cluster and is the only one
reported (its `_REASON` string, or a default naming it). A criterion whose `_IS_WARNING` is
true never rejects: the job is queued and the warning goes back to condor_submit.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.pool.classads import Expr, evaluate, expr, is_true
from services.pool.config import Config
from services.pool.errors import PoolConfigError, PoolError

#: condor_submit's lines around a rejection and a warning (seed 001, "Submit Requirements").
REJECTED = "ERROR: Failed to commit job submission into the queue."
WARNED = "WARNING: Committed job submission into the queue with the following warning:"


class SubmitRejectedError(PoolError):
    """A submit requirement rejected a cluster; `lines` are what condor_submit prints."""

    def __init__(self, requirement: str, reason: str) -> None:
        self.requirement = requirement
        self.reason = reason
        self.lines = ("Submitting job(s).", REJECTED, f"ERROR: {reason}")
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class SubmitRequirement:
    """One `SUBMIT_REQUIREMENT_<Name>` with its optional `_REASON` and `_IS_WARNING`."""

    name: str
    requirement: Expr
    reason: Expr | None
    is_warning: bool

    def message(self, schedd_ad: Mapping[str, Any], job_ad: Mapping[str, Any], now: float) -> str:
        """The `_REASON` string for this job; HTCondor's default names the requirement when
        `_REASON` is undefined or does not evaluate to a string."""
        if self.reason is not None:
            value = evaluate(self.reason, schedd_ad, job_ad, now)
            if isinstance(value, str):
                return value
        return f"Submit requirement {self.name} evaluated to non-true"


def submit_requirements(config: Config) -> list[SubmitRequirement]:
    """The configured requirements in `SUBMIT_REQUIREMENT_NAMES` order (a name without its
    `SUBMIT_REQUIREMENT_<Name>` is skipped, as the schedd does)."""
    names = [n for n in re.split(r"[\s,]+", config.get("SUBMIT_REQUIREMENT_NAMES", "") or "") if n]
    out: list[SubmitRequirement] = []
    for name in names:
        text = config.get(f"SUBMIT_REQUIREMENT_{name}")
        if text is None or not text.strip():
            continue
        knob = f"SUBMIT_REQUIREMENT_{name}"
        try:
            requirement = expr(text)
            reason_text = config.get(f"{knob}_REASON")
            reason = expr(reason_text) if reason_text and reason_text.strip() else None
        except PoolConfigError as exc:
            raise PoolConfigError(exc.reason, knob=knob) from None
        out.append(SubmitRequirement(name, requirement, reason,
                                     config.boolean(f"{knob}_IS_WARNING", False)))
    return out


def check_cluster(requirements: Sequence[SubmitRequirement], schedd_ad: Mapping[str, Any],
                  job_ads: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """The warnings for a cluster about to be committed (each distinct message once);
    raises SubmitRejectedError when any of its jobs fails a (non-warning) requirement."""
    warnings: list[str] = []
    for ad in job_ads:
        for req in requirements:
            if is_true(evaluate(req.requirement, schedd_ad, ad, now)):
                continue
            message = req.message(schedd_ad, ad, now)
            if not req.is_warning:
                raise SubmitRejectedError(req.name, message)
            if message not in warnings:
                warnings.append(message)
    return warnings


def condor_submit_output(cluster: int, count: int, warnings: Sequence[str]) -> list[str]:
    """What condor_submit prints for a committed cluster (seed 001's warning example)."""
    lines = ["Submitting job(s)."]
    if warnings:
        lines.append(WARNED)
        lines += [f"WARNING: {w}" for w in warnings]
        lines.append("")
    lines.append(f"{count} job(s) submitted to cluster {cluster}.")
    return lines
