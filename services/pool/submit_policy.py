"""The condor_schedd's submit-time policy (seed 001): job transforms, then submit
requirements and warnings.

`JOB_TRANSFORM_NAMES` lists transforms applied in order to every job ad of a cluster; each
`JOB_TRANSFORM_<name>` is written in the job router's transform language: REQUIREMENTS (the
whole transform is skipped unless it is true), then SET, DEFAULT, EVALSET, COPY, RENAME and
DELETE in the order written, `$(MY.<attr>)` standing for the job's attribute as written.
`userMap()` is HTCondor's own (from htcondor2) over the map files that
`SCHEDD_CLASSAD_USER_MAP_NAMES` names (`CLASSAD_USER_MAPFILE_<name>`).

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

from schemas.classads import Expr, evaluate_policy, expr, is_constant, is_true, plain
from schemas.errors import ClassAdError
from schemas.settings import DaemonConfig
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
            value = evaluate_policy(self.reason, schedd_ad, job_ad, now)
            if isinstance(value, str):
                return value
        return f"Submit requirement {self.name} evaluated to non-true"


def submit_requirements(config: DaemonConfig) -> list[SubmitRequirement]:
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
        except ClassAdError as exc:
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
            if is_true(evaluate_policy(req.requirement, schedd_ad, ad, now)):
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


_STATEMENT = re.compile(r"(?i)(REQUIREMENTS|SET|DEFAULT|EVALSET|COPY|RENAME|DELETE)\b\s*(.*)\Z")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=?\s*(.*)\Z", re.S)
_MY = re.compile(r"\$\(MY\.([A-Za-z_][A-Za-z0-9_]*)\)", re.I)


@dataclass(frozen=True, slots=True)
class JobTransform:
    """One `JOB_TRANSFORM_<name>`: its REQUIREMENTS and its statements, in order."""

    name: str
    requirements: Expr | None
    statements: tuple[tuple[str, str, str], ...]  # (OP, attribute, argument text)

    @classmethod
    def parse(cls, name: str, text: str) -> JobTransform:
        """Parse the rules; PoolConfigError names the knob and the bad line."""
        knob = f"JOB_TRANSFORM_{name}"
        requirements: Expr | None = None
        statements: list[tuple[str, str, str]] = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = _STATEMENT.match(line)
            if m is None:
                raise PoolConfigError(f"line {n}: {line!r} is not a transform statement "
                                      "(REQUIREMENTS, SET, DEFAULT, EVALSET, COPY, RENAME, DELETE)", knob=knob)
            op, rest = m.group(1).upper(), m.group(2).strip()
            if op == "REQUIREMENTS":
                requirements = _compile(rest, knob, n)
                continue
            a = _ASSIGN.match(rest)
            if a is None or (op != "DELETE" and not a.group(2).strip()):
                raise PoolConfigError(f"line {n}: {op} needs an attribute and "
                                      f"{'a new name' if op in ('COPY', 'RENAME') else 'an expression'}",
                                      knob=knob)
            attr, arg = a.group(1), a.group(2).strip()
            if op in ("SET", "DEFAULT", "EVALSET") and not _MY.search(arg):
                _compile(arg, knob, n)
            if op in ("COPY", "RENAME") and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", arg):
                raise PoolConfigError(f"line {n}: {op} {attr}: {arg!r} is not an attribute name", knob=knob)
            statements.append((op, attr, arg))
        return cls(name, requirements, tuple(statements))

    def apply(self, ad: dict[str, Any], now: float) -> bool:
        """Transform `ad` in place when REQUIREMENTS hold; True when it was transformed."""
        if self.requirements is not None and not is_true(evaluate_policy(self.requirements, ad, None, now)):
            return False
        lower = {k.lower(): k for k in ad}
        for op, attr, arg in self.statements:
            existing = lower.get(attr.lower())
            if op == "DELETE":
                if existing is not None:
                    del ad[existing]
                    del lower[attr.lower()]
                continue
            if op in ("COPY", "RENAME"):
                if existing is None:
                    continue
                value = ad[existing]
                if op == "RENAME":
                    del ad[existing]
                    del lower[attr.lower()]
                _put(ad, lower, arg, value)
                continue
            if op == "DEFAULT" and existing is not None:
                continue
            e = expr(_MY.sub(lambda m: _unparse(ad, lower, m.group(1)), arg))
            _put(ad, lower, attr, _literal(evaluate_policy(e, ad, None, now)) if op == "EVALSET" else
                 (_literal(plain(e).eval()) if is_constant(e) else e))
        return True


def _compile(text: str, knob: str, line: int) -> Expr:
    try:
        return expr(text)
    except ClassAdError as exc:
        raise PoolConfigError(f"line {line}: {exc.reason}", knob=knob) from None


def _literal(value: Any) -> Any:
    """A classad2 result as a job attribute (UNDEFINED/ERROR as expressions, like HTCondor)."""
    import classad2

    if isinstance(value, classad2.Value):
        return expr("undefined" if value == classad2.Value.Undefined else "error")
    return value


def _put(ad: dict[str, Any], lower: dict[str, str], attr: str, value: Any) -> None:
    old = lower.get(attr.lower())
    if old is not None and old != attr:
        del ad[old]  # ClassAd names are case-insensitive: one attribute, the new spelling
    ad[attr] = value
    lower[attr.lower()] = attr


def _unparse(ad: Mapping[str, Any], lower: Mapping[str, str], attr: str) -> str:
    """`$(MY.attr)`: the job's attribute as ClassAd text (`undefined` when it has none)."""
    import classad2

    key = lower.get(attr.lower())
    if key is None:
        return "undefined"
    value = ad[key]
    if isinstance(value, Expr):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return classad2.quote(value)
    return repr(value)


def job_transforms(config: DaemonConfig) -> list[JobTransform]:
    """The configured transforms in `JOB_TRANSFORM_NAMES` order (a name without rules is
    skipped), read unexpanded: their `$(MY.<attr>)` belong to the job; loads the `SCHEDD_CLASSAD_USER_MAP_NAMES` map files their userMap() reads."""
    names = [n for n in re.split(r"[\s,]+", config.get("JOB_TRANSFORM_NAMES", "") or "") if n]
    if not names:
        return []
    # before any parse: classad binds a function call when it parses it, and userMap() and
    # HTCondor's other functions exist once htcondor2 has registered them
    import htcondor2  # noqa: F401

    out = [JobTransform.parse(n, text) for n in names
           if (text := config.raw(f"JOB_TRANSFORM_{n}")) is not None and text.strip()]
    if out:
        load_user_maps(config)
    return out


def load_user_maps(config: DaemonConfig) -> None:
    """Give HTCondor's userMap() the schedd's map files (CLASSAD_USER_MAPFILE_<name>).

    The maps live in the htcondor2 library, one set per process, so they are (re)loaded
    before each use: several simulated schedds may name different files."""
    import htcondor2

    for name in re.split(r"[\s,]+", config.get("SCHEDD_CLASSAD_USER_MAP_NAMES", "") or ""):
        if not name:
            continue
        knob = f"CLASSAD_USER_MAPFILE_{name}"
        path = config.get(knob)
        if not path:
            raise PoolConfigError(f"SCHEDD_CLASSAD_USER_MAP_NAMES names {name} but {knob} is not set",
                                  knob="SCHEDD_CLASSAD_USER_MAP_NAMES")
        try:
            with open(path, encoding="utf-8"):
                pass
        except OSError as exc:
            raise PoolConfigError(f"cannot read map file {path!r}: {exc.strerror}", knob=knob) from None
        htcondor2.load_a_config_usermap_file(name, path)


def transform_cluster(transforms: Sequence[JobTransform], job_ads: Sequence[dict[str, Any]],
                      now: float) -> None:
    """Apply every transform, in order, to each job ad (all matching transforms apply)."""
    for ad in job_ads:
        for t in transforms:
            t.apply(ad, now)
