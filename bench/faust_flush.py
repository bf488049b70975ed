"""faust table flushes with the job-ad fold: what each flush of the worker costs and writes.

    python bench/faust_flush.py [--events 200000] [--batch 5000]

Folds bench/accounting.py's job-heavy log (2,000 slots, about 90% job events; the job-ad fold
holds the queued jobs' ads) in batches of `--batch` events, as the faust worker does, and after
each batch times `TableMirror.changes`: the submitter and pool entries whose bytes changed, job
ads included, each packed with the value it replaces (`streams.faust_tables`). Baseline, in the
same run over the same ledgers: the flushes of the ledger without its job ads (entries of
`flatten(ledger.to_doc())`, diffed the same way), i.e. what the tables carried before they held
the job-ad fold. Sizes: the job-ad entries and the largest entry's value at the end. The last
line is one line of key=value pairs for scripts.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.accounting import job_heavy_events, progress  # noqa: E402
from schemas.settings import load_settings  # noqa: E402
from streams.core.errors import EventRejectedError  # noqa: E402
from streams.core.ledger import Ledger  # noqa: E402
from streams.faust_tables import JOB_ADS, TableMirror, bucket_counts, flatten  # noqa: E402
from streams.synthetic import mixed_config  # noqa: E402

_PACK_HEADER = 12  # faust_tables.pack: tag and previous length


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=5000)
    args = ap.parse_args()
    progress(f"generating a job-heavy log of {args.events:,} events ...")
    envs = list(job_heavy_events(args.events))
    ledger, mirror = Ledger(load_settings(env={}, overrides=mixed_config())), TableMirror()
    base: dict[str, bytes] = {}
    spent = base_spent = 0.0
    records = base_records = written = base_written = flushes = 0
    for start in range(0, len(envs), args.batch):
        for env in envs[start:start + args.batch]:
            try:
                ledger.apply(env)
            except EventRejectedError:
                pass  # the log's invalid admin edits: dead-lettered by the worker
        t = time.perf_counter()
        waves = mirror.changes(ledger)
        spent += time.perf_counter() - t
        t = time.perf_counter()
        subs, pool = flatten(ledger.to_doc(), bucket_counts(base))
        new = {**{f"s:{k}": v for k, v in subs.items()}, **pool}
        changed = [(base.get(k, b""), v) for k, v in new.items() if base.get(k) != v]
        changed += [(v, b"") for k, v in base.items() if k not in new]
        base_spent += time.perf_counter() - t
        base = new
        flushes += 1
        records += sum(len(w) for _, w in waves)
        written += sum(len(v) for _, w in waves for _, v in w)
        base_records += len(changed) + 1  # and its COMMIT
        base_written += sum(_PACK_HEADER + len(a) + len(b) for a, b in changed)
    ads = {k: v for k, v in mirror.pool.items() if k.startswith(JOB_ADS)}
    largest = max(len(v) for v in (*mirror.pool.values(), *mirror.subs.values()))
    ms, base_ms = spent / flushes * 1000, base_spent / flushes * 1000
    progress(f"{flushes} flushes of {args.batch:,} events: {ms:.1f} ms each with the job ads, "
             f"{base_ms:.1f} ms without ({ms / base_ms:.2f}x); {records / flushes:,.0f} records "
             f"({written / flushes / 1e6:.2f} MB) each vs {base_records / flushes:,.0f} "
             f"({base_written / flushes / 1e6:.2f} MB)")
    progress(f"job ads: {len(ads)} entries, mean {sum(map(len, ads.values())) // max(len(ads), 1):,} "
             f"bytes, largest {max(map(len, ads.values()), default=0):,}; largest entry {largest:,}")
    print(f"events={len(envs)} batch={args.batch} flushes={flushes} flush_ms={ms:.1f} "
          f"base_flush_ms={base_ms:.1f} flush_ratio={ms / base_ms:.3f} "
          f"records_per_flush={records / flushes:.0f} base_records_per_flush={base_records / flushes:.0f} "
          f"bytes_per_flush={written / flushes:.0f} base_bytes_per_flush={base_written / flushes:.0f} "
          f"job_ad_entries={len(ads)} job_ad_entry_max={max(map(len, ads.values()), default=0)} "
          f"largest_entry={largest}")


if __name__ == "__main__":
    main()
