"""Build hook: compile the pure core (`streams/core`) with mypyc, from the same typed source.

The fold is the throughput-critical path (issue: replay at >= 100,000 events/s); mypyc turns
the typed modules into C extensions with the same behaviour. Set POOLLEDGER_COMPILE=0 to
install the plain Python modules (tests pass on both). A failed C build falls back to them too
(`optional`), so a machine without a compiler still installs. The sources' hashes go to
`streams/core/_compiled.json`, which the package checks on import (`streams/core/__init__.py`)
so an edited source is never shadowed by a stale extension.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
#: the modules compiled; errors.py stays interpreted (its exceptions subclass builtins, which
#: mypyc's native classes cannot), as does `__init__.py` (it checks the build is current)
CORE = ["accountant", "collector", "groups", "jobads", "jobs", "ledger", "limits", "outcomes",
        "overrides", "quotas", "reconcile", "userprio_ops"]
RECORD = HERE / "streams" / "core" / "_compiled.json"


def _remove_compiled() -> None:
    """Delete extensions of an earlier in-place build: they would shadow the sources."""
    RECORD.unlink(missing_ok=True)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for path in [*(HERE / "streams" / "core").glob(f"*{suffix}"),
                     *HERE.glob(f"poolledger_core__mypyc{suffix}")]:
            path.unlink()


def _extensions() -> list:
    if os.environ.get("POOLLEDGER_COMPILE", "1").strip().lower() in ("0", "false", "no"):
        _remove_compiled()
        return []
    from mypyc.build import mypycify

    sources = [f"streams/core/{m}.py" for m in CORE]
    exts = mypycify(sources, opt_level="3", group_name="poolledger_core")
    for ext in exts:
        ext.optional = True
    RECORD.write_text(json.dumps({m: hashlib.sha256((HERE / s).read_bytes()).hexdigest()
                                  for m, s in zip(CORE, sources)}, indent=1, sort_keys=True))
    return exts


setup(ext_modules=_extensions())
