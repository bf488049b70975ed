"""Services read the ledger through its read API (streams/core/ledger.py): no module outside
streams/core imports a fold module's private names or touches a ledger's fold fields, checked
on the source the way tests/test_purity.py checks the core's imports."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from schemas.settings import load_settings
from streams.core.ledger import Ledger
from streams.synthetic import mixed_config, mixed_events

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = ("services", "streams", "adstash", "ganglia", "bench", "compose")
#: the ledger's sections and section configs: the folds' own state
FOLD_FIELDS = frozenset({"accountant", "pool", "jobs", "quotas", "limits", "job_ads", "dedup",
                         "outcomes", "acct_cfg", "pool_cfg", "jobs_cfg", "quota_cfg", "limit_cfg",
                         "reconcile_cfg"})
#: how the code outside the core names a Ledger (`ledger`, `self.ledger`, `folded.ledger`,
#: `led`, a negotiator's `view`)
LEDGER_NAME = re.compile(r"(^|\.)(\w*ledger|led|view)$")


def _sources() -> list[Path]:
    out = []
    for top in OUTSIDE:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "core" not in path.relative_to(ROOT).parts[:2]:
                out.append(path)
    return out


def _violations(path: Path, base: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    core_modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(base)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("streams.core"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{where}: imports {node.module}.{alias.name}")
                if node.module == "streams.core":
                    core_modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Attribute):
            receiver = ast.unparse(node.value)
            if node.attr.startswith("_") and not node.attr.startswith("__") and (
                    receiver in core_modules or receiver.startswith("streams.core.")):
                found.append(f"{where}: {receiver}.{node.attr}")
            if node.attr in FOLD_FIELDS and LEDGER_NAME.search(receiver):
                found.append(f"{where}: {receiver}.{node.attr}")
    return found


def test_nothing_outside_the_core_touches_a_folds_fields() -> None:
    sources = _sources()
    assert any(p.name == "service.py" for p in sources)  # the negotiator service is checked
    problems = [v for p in sources for v in _violations(p)]
    assert problems == []


def test_the_check_finds_what_it_forbids(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from streams.core.accountant import _at\nfrom streams.core import quotas\n"
                   "def f(ledger, self):\n"
                   "    return ledger.acct_cfg, self.ledger.jobs.jobs, quotas._plan\n")
    found = _violations(bad, tmp_path)
    assert sorted(f.split(": ", 1)[1] for f in found) == [
        "imports streams.core.accountant._at", "ledger.acct_cfg", "quotas._plan",
        "self.ledger.jobs"], found


def test_read_api_answers_from_the_folds() -> None:
    settings = load_settings(config_path=[], env={}, overrides=mixed_config())
    ledger = Ledger(settings)
    for env in mixed_events(3000):
        try:
            ledger.apply(env)
        except Exception:  # noqa: BLE001 - the log's invalid admin edits
            pass
    now = ledger.now
    assert now is not None
    prios = ledger.priorities(now)
    name = next(n for n, r in prios.items() if not r["IsAccountingGroup"])
    assert ledger.submitter(name, now) == prios[name]
    assert ledger.priority_at(name, now) == prios[name]["Priority"]
    assert ledger.submitter("nobody@example.org") is None
    assert ledger.priority_at("nobody@example.org", now) is None
    new = ledger.new_submitter("group_physics.zed@example.org")
    assert new.group == "group_physics" and new.eup == 0.5 * new.factor
    cycle = ledger.cycle_groups(ledger.pool_size(), {}, now)
    assert cycle is not None
    assert {g.name for g in cycle.groups} >= {"group_physics", "group_chemistry"}
    assert sorted(cycle.order) == sorted(g.name for g in cycle.groups)
    records = dict(ledger.job_records())
    queued = [k for k, j in records.items() if ledger.job_ad(k) is not None]
    assert queued and all(ledger.job_ad(k)[0] == records[k]["schedd"] for k in queued)  # type: ignore[index]
    assert ledger.pool_size() > 0 and len(ledger.current_ads("Machine")) <= 40
    limits = ledger.limit_inputs()
    assert limits.max_for("xsw") == 3.0
    assert all(limits.usage.get(n, 0.0) == v["InUse"] for n, v in ledger.limits_view().items())
