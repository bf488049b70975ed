"""The faust worker with a fault injected, for the crash test only: at its Nth flush
(POOLLEDGER_FAUST_CRASH_AT) it writes only the submitter table's entries (or, with
POOLLEDGER_FAUST_CRASH_WRITES=all, every entry and record of the flush but its COMMIT), then
exits 75 — a crash midway through a flush's writes, after some entries landed and before
COMMIT did.

Run as `python -m tests.faust_crash_worker worker ...`, like `python -m streams.faust_app`."""
from __future__ import annotations

import os

from streams.faust_adapter import BatchWriter, Groups
from streams.faust_app import main
from streams.faust_tables import SUBMITTERS

CRASH_STATUS = 75


class CrashingWriter(BatchWriter):
    """Writes flushes as the worker does, except the Nth: only its submitter entries (or all
    but its COMMIT)."""

    flushes = 0

    async def flush(self, effects: Groups, commit: Groups) -> None:
        CrashingWriter.flushes += 1
        if CrashingWriter.flushes == int(os.environ["POOLLEDGER_FAUST_CRASH_AT"]):
            if os.environ.get("POOLLEDGER_FAUST_CRASH_WRITES") == "all":
                await self.write(effects)
            else:
                await self.write([g for g in effects if g[0].endswith(f"-{SUBMITTERS}-changelog")])
            os._exit(CRASH_STATUS)
        await super().flush(effects, commit)


if __name__ == "__main__":
    main(writer=CrashingWriter)
