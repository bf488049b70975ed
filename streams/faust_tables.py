"""The ledger as faust table entries, and the flush protocol that makes a crash harmless.

Per-submitter accountant records are `submitters` table entries keyed by submitter (or group)
name; the pool-wide rest of the ledger (ads, jobs, quotas, limits, dedup marks, knob overrides,
and the job-ad fold's queued job ads, `job_ads`) is `pool` global table entries (large sections
in hash buckets, a value too big for an entry in chunks). A flush writes the entries
whose bytes changed, each tagged with the flush and keeping the value it replaces, then the
COMMIT entry alone: readers (`resolve`) see only flushes whose COMMIT landed, so a worker killed
midway through a flush's writes restarts from the flush before. Pure: no faust, no Kafka.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Any

import orjson

from schemas.config import SettingsLike
from streams.core.ledger import Ledger

SUBMITTERS = "submitters"
POOL = "pool"

SEP = "\x1f"
#: Starts the last part of a bucket entry's key: its value holds several siblings at once.
BUCKET = "\x1e"
#: Starts the last part of a chunk entry's key: its value is one slice of its parent's JSON.
CHUNK = "\x1d"
#: Starts a key part that is a child's key in hex (`_part`): one that could read as the above.
ESC = "\x1c"
#: The pool section holding the job-ad fold (`Ledger.to_snapshot`'s `job_ads`), which the
#: ledger's canonical document (`to_doc`, the golden digests) leaves out.
JOB_ADS = "job_ads"
OUTCOMES = "outcomes"
RECONCILE = "reconcile"
# Entries larger than this are split, so no changelog message nears Kafka's 1 MB limit and a
# change rewrites only a small part of the state.
SPLIT_BYTES = 16_384
#: sections written whole while small, else in buckets, never an entry per child: the job
#: ads (keyed by job) and the slots' last claim events (`Ledger._evidence_doc`: every job
#: start or stop changes one)
_WHOLE = frozenset({JOB_ADS, "claims"})


def _part(key: str) -> str:
    """A child's key as a part of an entry's key; escaped when it is empty or could read as
    a separator, bucket, chunk or escape (an ad's attribute name is any string on the wire)."""
    if key and SEP not in key and key[0] not in (BUCKET, CHUNK, ESC):
        return key
    return ESC + key.encode().hex()


def _key(part: str) -> str:
    """The child's key `_part` made `part` of."""
    return bytes.fromhex(part[1:]).decode() if part.startswith(ESC) else part


def _leaf(path: str, raw: bytes, out: dict[str, bytes]) -> None:
    """One value as an entry, or in SPLIT_BYTES chunks when a bucket could not hold it (a
    job ad's huge attribute: an entry keeps the value it replaces too, so a value near
    Kafka's 1 MB message limit would make an entry the broker refuses, and the worker stop)."""
    if len(raw) <= 2 * SPLIT_BYTES:
        out[path] = raw
        return
    for i in range(0, len(raw), SPLIT_BYTES):
        out[f"{path}{SEP}{CHUNK}{i // SPLIT_BYTES}"] = raw[i:i + SPLIT_BYTES]


def _split(path: str, value: Any, out: dict[str, bytes], depth: int,
           counts: dict[str, int]) -> None:
    if not isinstance(value, dict):
        _leaf(path, orjson.dumps(value, option=orjson.OPT_SORT_KEYS), out)
        return
    # a node above depth 2 is always split: no need to serialize it just to measure it
    raw = None if depth < 2 else orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if raw is not None and len(raw) <= SPLIT_BYTES:
        out[path] = raw
        return
    out[path + SEP] = b"{}"  # marks a dict node, so empty dicts survive the round trip
    if raw is None:
        for key, sub in value.items():
            _split(f"{path}{SEP}{_part(key)}", sub, out, depth + 1, counts)
        return
    _bucket(path, value, len(raw), out, depth, counts)


def _bucket(path: str, value: dict[str, Any], size: int, out: dict[str, bytes], depth: int,
            counts: dict[str, int]) -> None:
    """Write a large section's children as a few hash buckets of about SPLIT_BYTES / 2.

    One entry per child (a job, an ad) made a 5,000-event batch write ~5,000 changelog
    messages, each of which the global table then reads back one at a time; a bucket carries
    tens of children in one message. A child too large for a bucket is split on its own.
    The section keeps its bucket count (`counts`, from the last flush) while its buckets
    average SPLIT_BYTES / 8 to SPLIT_BYTES: a new count rehashes every child, and a queue
    whose size hovers at a power of two rewrote all its buckets at every other flush.
    """
    count = counts.get(path, 0)
    if not SPLIT_BYTES // 8 <= size / max(count, 1) <= SPLIT_BYTES:
        count = 1
        while count * SPLIT_BYTES < 2 * size:
            count *= 2
    buckets: list[dict[str, Any]] = [{} for _ in range(count)]
    for key, sub in value.items():
        buckets[_hash(key) & (count - 1)][key] = sub
    for i, bucket in enumerate(buckets):
        raw = orjson.dumps(bucket, option=orjson.OPT_SORT_KEYS)
        if len(raw) <= 2 * SPLIT_BYTES:
            if bucket:
                out[f"{path}{SEP}{BUCKET}{i}"] = raw
            continue
        for key, sub in bucket.items():  # skewed or holding a giant: one entry per child
            _split(f"{path}{SEP}{_part(key)}", sub, out, depth + 1, counts)


def _hash(key: str) -> int:
    """A child's bucket hash: BLAKE2b, not CRC-32, which is linear, so keys that differ only
    in digits (`schedd@ap1#1234.0`) filled half the buckets of some counts."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little")


def bucket_counts(pool: dict[str, bytes]) -> dict[str, int]:
    """Per bucketed section, the bucket count its entries in `pool` were written with (the
    power of two above their highest bucket), for `flatten` to keep."""
    top: dict[str, int] = {}
    for key in pool:
        path, _, last = key.rpartition(SEP)
        if last.startswith(BUCKET):
            top[path] = max(top.get(path, 0), int(last[1:]) + 1)
    return {path: 1 << (n - 1).bit_length() for path, n in top.items()}


def flatten(doc: dict[str, Any], counts: dict[str, int] | None = None
            ) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Split a ledger document (`to_doc`, or `snapshot_doc` with the job ads) into
    submitter-table and pool-table entries (JSON bytes).

    Customer records go to the submitter table by name; every other section is split by key
    two levels down, and large sections below that into hash buckets (see `_bucket`); the job
    ads, keyed by job one level down, go into buckets right away (not an entry per job).
    `counts`: the bucket counts of the entries the tables hold (`bucket_counts`), kept if
    they still fit.
    """
    subs = {name: orjson.dumps(rec, option=orjson.OPT_SORT_KEYS)
            for name, rec in doc["accountant"]["Customers"].items()}
    rest = dict(doc)
    rest["accountant"] = {k: v for k, v in doc["accountant"].items() if k != "Customers"}
    pool: dict[str, bytes] = {}
    for section, value in rest.items():
        _split(section, value, pool, 2 if section in _WHOLE else 1, counts or {})
    return subs, pool


def snapshot_doc(ledger: Ledger) -> dict[str, Any]:
    """The ledger's document with the job-ad, job-outcome and reconciliation folds as its
    `job_ads`, `outcomes` and `reconcile` sections: what the tables hold (`Ledger.to_snapshot`,
    the durable snapshot's content)."""
    snap = orjson.loads(ledger.to_snapshot())
    return {**snap["ledger"], JOB_ADS: snap["job_ads"], OUTCOMES: snap["outcomes"],
            RECONCILE: snap["reconcile"]}


def from_snapshot_doc(settings: SettingsLike, doc: dict[str, Any]) -> Ledger:
    """The ledger (job ads, outcomes and reconciliation rows included) from `snapshot_doc`'s
    data; tables written before they held them restore with none."""
    ledger = {k: v for k, v in doc.items() if k not in (JOB_ADS, OUTCOMES, RECONCILE)}
    extra = {k: doc[k] for k in (OUTCOMES, RECONCILE) if k in doc}
    return Ledger.from_snapshot(settings, orjson.dumps({"ledger": ledger,
                                                        "job_ads": doc.get(JOB_ADS, {}),
                                                        **extra}))


def _joined(pool: dict[str, bytes]) -> dict[str, bytes]:
    """`pool` with each chunked value (`_leaf`) back as one entry under its own key."""
    chunks: dict[str, dict[int, bytes]] = {}
    plain: dict[str, bytes] = {}
    for key, raw in pool.items():
        parent, _, last = key.rpartition(SEP)
        if parent and last.startswith(CHUNK):
            chunks.setdefault(parent, {})[int(last[1:])] = raw
        else:
            plain[key] = raw
    for parent, parts in chunks.items():
        plain[parent] = b"".join(parts[i] for i in sorted(parts))
    return plain


def unflatten(subs: dict[str, bytes], pool: dict[str, bytes]) -> dict[str, Any] | None:
    """The ledger document back from table entries; None when the tables are empty."""
    if not pool:
        return None
    doc: dict[str, Any] = {}
    pool = _joined(pool)
    for key in sorted(pool, key=lambda k: k.count(SEP)):  # parents before children
        parts = key.split(SEP)
        node = doc
        for part in parts[:-1]:
            node = node.setdefault(_key(part), {})
        last = parts[-1]
        if last.startswith(BUCKET):
            node.update(orjson.loads(pool[key]))
        elif last:
            node[_key(last)] = orjson.loads(pool[key])
    doc.setdefault("accountant", {})["Customers"] = {n: orjson.loads(r) for n, r in subs.items()}
    return doc


#: The pool entry holding the tag of the last flush whose writes all landed. Written alone,
#: after them: a crash in between leaves it at the previous flush.
COMMIT = "commit"
#: An entry's value: the tag of the flush that wrote it, the previous value, the new value.
_PACKED = struct.Struct("<qI")
#: An empty value is no entry (a deletion is an ordinary write: a global table's local copy
#: may not hold the key any more when we delete it).
GONE = b""


def pack(tag: int, previous: bytes, value: bytes) -> bytes:
    """A table entry written by flush `tag`, keeping the value it replaces."""
    return _PACKED.pack(tag, len(previous)) + previous + value


def committed(pool: dict[str, bytes]) -> int:
    """The tag of the last flush that committed, from the pool table's raw entries (-1: none)."""
    raw = pool.get(COMMIT)
    return int(raw.split()[0]) if raw else -1


def committed_offset(pool: dict[str, bytes]) -> int | None:
    """The events offset after the last flush that committed: where folding resumes (None: no
    flush yet, or a COMMIT written before COMMIT carried the offset, which holds the tag alone)."""
    parts = (pool.get(COMMIT) or b"").split()
    return int(parts[1]) if len(parts) > 1 else None


def in_order(offsets: list[int], expected: int | None) -> tuple[list[int], int | None, bool]:
    """Which of a batch's records (by their events offsets, as delivered) to fold: the run that
    continues at `expected`, the offset after it, and whether a record above it (a gap) cut the
    run short. Records below `expected` were folded already. The ledger folds one total order:
    after a restart faust may deliver records its fetcher buffered before the seek to where
    folding resumes, and a state-dependent rejection (a ceiling lease that expired meanwhile)
    must not see them early. `expected` None (unknown): the first record starts the run."""
    take: list[int] = []
    for i, offset in enumerate(offsets):
        if expected is not None and offset != expected:
            if offset < expected:
                continue
            return take, expected, True
        take.append(i)
        expected = offset + 1
    return take, expected, False


def resolve(entries: dict[str, bytes], commit: int) -> tuple[dict[str, bytes], set[str]]:
    """The plain entries as of the flush `commit`, and the keys a later flush wrote.

    A flush tags every entry it writes with the ledger's `applied` count after it, then writes
    COMMIT. An entry tagged above COMMIT belongs to a flush that died before committing: it
    reads as the value it replaced. Flushes run one after another, so one level of undo is
    enough, provided the next flush rewrites those keys (TableMirror.load) before it commits.
    """
    plain: dict[str, bytes] = {}
    undone: set[str] = set()
    for key, packed in entries.items():
        if key == COMMIT:
            continue
        tag, size = _PACKED.unpack_from(packed)
        if tag <= commit:
            value = packed[_PACKED.size + size:]
        else:
            value = packed[_PACKED.size:_PACKED.size + size]
            undone.add(key)
        if value:
            plain[key] = value
    return plain, undone


class TableMirror:
    """Writes only the entries whose bytes changed since the last flush into the tables."""

    def __init__(self) -> None:
        self.subs: dict[str, bytes] = {}
        self.pool: dict[str, bytes] = {}
        self.undone: tuple[set[str], set[str]] = (set(), set())
        #: the events offset the last committed flush folded up to (`committed_offset`)
        self.next_offset: int | None = None

    def load(self, subs: dict[str, bytes], pool: dict[str, bytes],
             undone: tuple[set[str], set[str]] = (set(), set())) -> None:
        """Start from resolved tables; the `undone` keys (submitters, pool) are rewritten by
        the next flush whether they changed or not, so no uncommitted tag outlives it."""
        self.subs, self.pool = dict(subs), dict(pool)
        self.undone = (set(undone[0]), set(undone[1]))

    def changes(self, ledger: Ledger,
                next_offset: int | None = None) -> list[tuple[str, list[tuple[str, bytes]]]]:
        """The writes of one flush: submitter entries and pool entries (tagged with the
        ledger's `applied + rejected`), then the COMMIT entry alone, which also carries the
        events offset folding resumes at (`next_offset`, when known).

        The runner has the first two acknowledged before it writes the last; until it lands,
        readers (`resolve`) see the previous flush's state, dedup marks included.
        """
        tag = ledger.applied + ledger.rejected  # grows with every event folded or rejected
        subs, pool = flatten(snapshot_doc(ledger), bucket_counts(self.pool))

        def diff(mine: dict[str, bytes], new: dict[str, bytes],
                 undone: set[str]) -> list[tuple[str, bytes]]:
            out = [(k, pack(tag, v, GONE)) for k, v in mine.items() if k not in new]
            out += [(k, pack(tag, mine.get(k, GONE), v)) for k, v in new.items()
                    if k in undone or mine.get(k) != v]
            out += [(k, pack(tag, GONE, GONE)) for k in undone if k not in new and k not in mine]
            return out

        sub_writes, pool_writes = diff(self.subs, subs, self.undone[0]), diff(self.pool, pool,
                                                                               self.undone[1])
        self.subs, self.pool, self.undone = subs, pool, (set(), set())
        value = str(tag) if next_offset is None else f"{tag} {next_offset}"
        commit = [(COMMIT, value.encode())] if sub_writes or pool_writes else []
        return [(SUBMITTERS, sub_writes), (POOL, pool_writes), (POOL, commit)]


def restore(subs_raw: dict[str, bytes], pool_raw: dict[str, bytes],
            settings: SettingsLike) -> tuple[Ledger | None, TableMirror]:
    """The ledger, job ads included, as of the last flush that committed (None: none did)
    from the tables' raw entries, and the mirror the next flush diffs against: it rewrites
    the entries of a flush that did not commit, so no uncommitted tag outlives it."""
    commit = committed(pool_raw)
    subs, subs_undone = resolve(subs_raw, commit)
    pool, pool_undone = resolve(pool_raw, commit)
    doc = unflatten(subs, pool)
    mirror = TableMirror()
    mirror.load(subs, pool, (subs_undone, pool_undone))
    mirror.next_offset = committed_offset(pool_raw)
    return None if doc is None else from_snapshot_doc(settings, doc), mirror
