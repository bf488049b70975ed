"""The pure core: every fold of the log, with no I/O, clock or service imports.

setup.py compiles these modules with mypyc; the extension modules then shadow the `.py`
files, so an edited source would silently not run. The build records each source's hash in
`_compiled.json`; importing the package refuses a build older than its sources.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import json
from pathlib import Path

from streams.core.errors import StaleBuildError


def check_build(here: Path = Path(__file__).parent) -> None:
    """Raise StaleBuildError when a compiled module in `here` is older than its source."""
    try:
        record: dict[str, str] = json.loads((here / "_compiled.json").read_text())
    except (OSError, ValueError):
        return  # not compiled (POOLLEDGER_COMPILE=0, or a plain checkout)
    stale = []
    for module, digest in record.items():
        compiled = any((here / f"{module}{suffix}").exists()
                       for suffix in importlib.machinery.EXTENSION_SUFFIXES)
        source = here / f"{module}.py"
        if compiled and source.exists() and hashlib.sha256(source.read_bytes()).hexdigest() != digest:
            stale.append(source.name)
    if stale:
        raise StaleBuildError(
            f"streams/core: {', '.join(stale)} changed since the core was compiled; rebuild with "
            "`make build` (pip install -e .), or reinstall with POOLLEDGER_COMPILE=0 to run the "
            "plain Python modules")


check_build()
