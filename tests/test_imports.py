"""Real pools' state into the log: `log import-status` (a condor_status -l dump) and
`log import-accountant` (a negotiator's Accountantnew.log) — ids from the input, so a second
import changes nothing; malformed input to the DLQ with file:line, the rest imported."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.events import AdUpdated, Envelope
from services.cli import main
from streams.log.embedded import EmbeddedLog
from streams.log.events import DeadLetter, EventLog
from streams.log.topics import EVENTS

DATA = Path(__file__).parent / "data"


def cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["--home", str(home), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def events_and_dlq(home: Path) -> tuple[list[Envelope], list[DeadLetter]]:
    lg = EmbeddedLog(home / "log")
    try:
        elog = EventLog(lg)
        return [env for _, env in elog.read(EVENTS)], elog.dead_letters(EVENTS)
    finally:
        lg.close()


def test_accountant_log_seeds_the_ledger(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    log_file = DATA / "Accountantnew.log"
    rc, out, _ = cli(capsys, tmp_path, "log", "import-accountant", str(log_file))
    assert rc == 1  # two malformed lines
    # bob's claim on slot1@ep1 (a Resource record) and 9 edits
    assert out.startswith("imported 10 claims and record edits into poolledger.events (0 already "
                          "there); 2 malformed")
    # alice's unweighted AccumulatedUsage (7200) has no edit: said, not dropped in silence
    assert out.splitlines()[1] == (
        "not imported: the unweighted AccumulatedUsage of 1 record(s) (no condor_userprio "
        "edit sets it; WeightedAccumulatedUsage is imported, as -setaccum)")
    rc, out, _ = cli(capsys, tmp_path, "userprio", "--json")
    assert rc == 0
    table = json.loads(out)
    subs = {s["Name"]: s for s in table["Submitters"]}
    assert set(subs) == {"alice@example.org", "bob@example.org"}  # carol was destroyed (102)
    alice, bob = subs["alice@example.org"], subs["bob@example.org"]
    # 20.0 from the last complete transaction; the trailing one without 106 (99.0) is dropped
    assert (alice["Priority"], alice["PriorityFactor"], alice["WeightedAccumulatedUsage"],
            alice["BeginUsageTime"], alice["LastUsageTime"]) == (
        20.0, 1000.0, 14400.0, 1763790000.0, 1763803000.0)
    assert (bob["Priority"], bob["PriorityFactor"], bob["Floor"], bob["Ceiling"],
            bob["ResourcesUsed"]) == (3.0, 500.0, 2.0, 4.0, 1)
    assert table["Now"] == 1763803600.0  # the accountant's LastUpdateTime dates the edits
    evs, dead = events_and_dlq(tmp_path)
    assert sorted(d.reason.split(": ")[0] for d in dead) == [f"{log_file}:30", f"{log_file}:31"]
    # importing again changes nothing
    rc, out, _ = cli(capsys, tmp_path, "log", "import-accountant", str(log_file))
    assert out.startswith("imported 0 claims and record edits into poolledger.events (10 already "
                          "there)")
    evs2, dead2 = events_and_dlq(tmp_path)
    assert len(evs2) == len(evs) == 10 and len(dead2) == 2


def test_status_dump_becomes_ad_updated_events(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    extra = tmp_path / "status.more"
    extra.write_text('MyType = "Machine"\nName = "slot2@ep9.example.org"\n'
                     "LastHeardFrom = 1763800100\nUpdateSequenceNumber = 17\nCpus = 8\n\n"
                     "\n# no name below\n"
                     'MyType = "Machine"\nCpus = 1\n')
    files = [str(DATA / "status.sample"), str(DATA / "status.bad"), str(extra)]
    rc, out, err = cli(capsys, tmp_path, "log", "import-status", *files)
    assert rc == 1
    # status.bad's readable ad has no time, nor has any ad of that dump: refused, not dated now
    assert out.startswith("imported 3 ads into poolledger.events (0 already there); 3 malformed")
    assert f"refused: {DATA / 'status.bad'}: 1 ad(s) without LastHeardFrom" in err
    evs, dead = events_and_dlq(tmp_path)
    ads = {(e.data.ad_type, e.data.name): e for e in evs if isinstance(e.data, AdUpdated)}
    assert set(ads) == {("Machine", "slot1@ep7.example.org"),  # sample and status.bad's first
                        ("Machine", "slot1_1@ep8.example.org"),
                        ("Machine", "slot2@ep9.example.org")}
    assert len([e for e in evs if isinstance(e.data, AdUpdated)]) == 3
    seqd = ads[("Machine", "slot2@ep9.example.org")]
    assert seqd.id == "status:Machine/slot2@ep9.example.org@seq17" and seqd.ts == 1763800100.0
    assert seqd.data.ad["Cpus"] == 8
    assert {d.reason.split(": ")[0] for d in dead} == {
        f"{DATA / 'status.bad'}:1", f"{DATA / 'status.bad'}:7", f"{extra}:9"}
    rc, out, _ = cli(capsys, tmp_path, "log", "import-status", *files)
    assert out.startswith("imported 0 ads into poolledger.events (3 already there)")
    evs2, dead2 = events_and_dlq(tmp_path)
    assert len(evs2) == len(evs) and len(dead2) == 3
