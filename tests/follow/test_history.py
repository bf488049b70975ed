"""`follow history` / `log import-history --follow`: history files followed as they grow and
rotate, with the importer's parser (old ClassAd syntax) and ids."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from adstash.sources import import_history
from services.follow.history import HistoryFollower
from tests.follow.helpers import DATA, cli, cli_argv, cli_env, dead, event_log, events

SAMPLE = (DATA / "history.sample").read_text()


def ad(cluster: int, extra: str = "") -> str:
    """One history ad and its banner, as the schedd appends it."""
    return (f'ClusterId = {cluster}\nProcId = 0\nOwner = "alice"\nJobStatus = 4\n'
            f"CompletionDate = {1763800000 + cluster}\nQDate = 1763790000\n"
            f'GlobalJobId = "ap1.example.org#{cluster}.0#1763790000"\n{extra}'
            f"*** ProcId = 0 ClusterId = {cluster} Owner = \"alice\" CompletionDate = "
            f"{1763800000 + cluster}\n")


def test_follow_history_grows_with_importer_ids(tmp_path: Path) -> None:
    """An ad counts once its banner is written; ids are the importer's, so importing the same
    file afterwards adds nothing (and following an imported file adds nothing)."""
    path = tmp_path / "history"
    text = ad(1) + ad(2)
    path.write_text(text[:-10])  # the second banner half written
    elog = event_log(tmp_path / "home")
    f = HistoryFollower(elog, path)
    assert f.poll().events == 1
    with open(path, "a") as out:
        out.write(text[-10:] + ad(3, 'Iwd = "C:\\Users\\x\\test"\nTransferInput = "C:\\in\\"\n'))
    assert f.poll().events == 2
    evs = events(elog)
    assert [e.id for e in evs] == [f"history:ap1.example.org#{c}.0#1763790000#{1763800000 + c}"
                                   for c in (1, 2, 3)]
    # old ClassAd syntax: backslashes are literal, a trailing one does not dead-letter the job
    assert evs[2].data.ad["Iwd"] == "C:\\Users\\x\\test"
    assert evs[2].data.ad["TransferInput"] == "C:\\in\\"
    report = import_history(elog, [path])
    assert (report.imported, report.already) == (0, 3)


def test_history_rotation_and_malformed_ad(tmp_path: Path) -> None:
    """MAX_HISTORY_LOG rotation renames `history` to `history.<time>`: the ads appended to it
    before the rename are read, then the new file's. A malformed ad is dead-lettered with
    file:line and byte offset; the ads around it are read."""
    path = tmp_path / "history"
    path.write_text(ad(1))
    elog = event_log(tmp_path / "home")
    f = HistoryFollower(elog, path)
    f.poll()
    bad = ad(2, "Requirements = (TARGET.Memory >\n")
    with open(path, "a") as out:
        out.write(bad + ad(3))
    os.rename(path, tmp_path / "history.20251122T100000")
    path.write_text(ad(4))
    report = f.poll()
    assert report.rotations == 1 and report.events == 2 and report.dead == 1
    assert [e.data.ad["ClusterId"] for e in events(elog)] == [1, 3, 4]
    [letter] = dead(elog)
    old = tmp_path / "history.20251122T100000"
    line = len(ad(1).splitlines()) + bad.splitlines().index("Requirements = (TARGET.Memory >") + 1
    at = len(ad(1)) + bad.index("Requirements")  # the byte where the bad line starts
    assert letter.reason.startswith(f"{old}:{line} (byte {at}): attribute Requirements")
    assert letter.line == line


def test_startd_history_sample(tmp_path: Path) -> None:
    """The importer's sample history file (three ads) read by the follower, as import does."""
    path = tmp_path / "startd_history"
    path.write_text(SAMPLE)
    elog = event_log(tmp_path / "home")
    assert HistoryFollower(elog, path).poll().events == 3
    ids = [e.id for e in events(elog)]
    other = event_log(tmp_path / "other")
    import_history(other, [DATA / "history.sample"])
    assert ids == [e.id for e in events(other)]


def test_import_history_follow_cli(tmp_path: Path) -> None:
    """`log import-history --follow FILE`: a service; it reads what is appended until SIGTERM,
    then says what it did and exits 0."""
    path, home = tmp_path / "history", tmp_path / "home"
    path.write_text(ad(1))
    proc = subprocess.Popen(cli_argv(home, "--set", "POOLLEDGER_FOLLOW_INTERVAL=0.05", "log",
                                     "import-history", "--follow", str(path)),
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (home / "log").exists():
                elog = event_log(home)
                n = len(events(elog))
                elog.log.close()
                if n == 1:
                    break
            time.sleep(0.1)
        with open(path, "a") as out:
            out.write(ad(2))
        while time.monotonic() < deadline:
            elog = event_log(home)
            n = len(events(elog))
            elog.log.close()
            if n == 2:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "2 events appended, 0 dead-lettered" in stdout
    r = cli(home, "log", "import-history", str(path))
    assert r.returncode == 0 and "imported 0 job ads" in r.stdout and "(2 already there)" in r.stdout
