"""The collector endpoint end to end: the real htcondor2 client (a subprocess: the client holds
the GIL while it talks) advertising a simulated pool's whole scenario into the CEDAR server in
front of the ledger backend, then querying it and asking for priorities."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import classad2
import pytest

from schemas.classads import ad_from_json, ad_to_json
from schemas.events import AdInvalidated, AdUpdated, Envelope, decode
from schemas.settings import load_settings
from services.cli import main
from services.collector.backend import LedgerCollector
from services.collector.port import Peer
from streams.log.embedded import EmbeddedLog
from streams.log.topics import EVENTS, ensure_topics
from streams.replay import replay
from tests.collector.cedar_harness import CLIENT_PRELUDE, PYTHON, Endpoint

#: the update and invalidation command of each MyType the simulated pool publishes
UPDATE = {"Machine": "UPDATE_STARTD_AD", "Scheduler": "UPDATE_SCHEDD_AD",
          "Submitter": "UPDATE_SUBMITTOR_AD", "Negotiator": "UPDATE_NEGOTIATOR_AD",
          "Accounting": "UPDATE_ACCOUNTING_AD", "Collector": "UPDATE_COLLECTOR_AD"}
INVALIDATE = {"Machine": "INVALIDATE_STARTD_ADS", "Submitter": "INVALIDATE_SUBMITTOR_ADS",
              "Scheduler": "INVALIDATE_SCHEDD_ADS"}

CLIENT_LOOP = """
c = htcondor2.Collector(ADDR)
for line in sys.stdin:
    req = json.loads(line)
    try:
        if "ads" in req:
            c.advertise([classad2.ClassAd(t) for t in req["ads"]], req["command"])
            print(json.dumps({"ok": len(req["ads"])}), flush=True)
        elif "constraint" in req:
            found = c.query(htcondor2.AdType.Startd, constraint=req["constraint"],
                            projection=req["projection"])
            print(json.dumps({"ads": [{k: str(v) if isinstance(v, classad2.ExprTree) else v
                                       for k, v in a.items()} for a in found]}), flush=True)
        elif "priorities" in req:
            neg = htcondor2.Negotiator(classad2.ClassAd({"MyType": "Negotiator", "Name": "n",
                                                         "MyAddress": f"<{ADDR}>"}))
            print(json.dumps({"prios": [dict(p) for p in neg.getPriorities()]}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
"""


class Client:
    """One real htcondor2 client process taking requests on stdin, one JSON line each."""

    def __init__(self, port: int, tmp: Path) -> None:
        config = tmp / "client_config"
        config.write_text("")
        self.proc = subprocess.Popen([PYTHON, "-c", CLIENT_PRELUDE + CLIENT_LOOP, str(port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=str(tmp), env={**os.environ, "CONDOR_CONFIG": str(config)})

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        assert "error" not in answer, answer
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


class ReplayBackend:
    """The ledger backend with event time taken from each replayed ad (`ReplayEventTime`,
    removed before the backend sees the ad): the simulated pool's clock, not the wall's."""

    def __init__(self, inner: LedgerCollector, now: list[float]) -> None:
        self.inner, self.now = inner, now

    def _time(self, ad: classad2.ClassAd) -> None:
        if "ReplayEventTime" in ad:
            self.now[0] = float(ad["ReplayEventTime"])
            del ad["ReplayEventTime"]

    def update(self, ad_type: str, ad: classad2.ClassAd, private: Any, peer: Peer) -> None:
        self._time(ad)
        self.inner.update(ad_type, ad, private, peer)

    def invalidate(self, ad_type: str, query: classad2.ClassAd, peer: Peer) -> None:
        self._time(query)
        self.inner.invalidate(ad_type, query, peer)

    def query(self, ad_type: str | None, query: classad2.ClassAd, peer: Peer) -> Any:
        return self.inner.query(ad_type, query, peer)

    def priorities(self, peer: Peer) -> classad2.ClassAd:
        return self.inner.priorities(peer)


def _command(env: Envelope) -> str | None:
    d = env.data
    if isinstance(d, AdUpdated):
        return UPDATE.get(d.ad_type, "UPDATE_AD_GENERIC")
    if isinstance(d, AdInvalidated):
        return INVALIDATE[d.ad_type]
    return None


def _wire_text(env: Envelope) -> str:
    d = env.data
    if isinstance(d, AdUpdated):
        ad = ad_from_json(d.ad)
    else:
        ad = classad2.ClassAd({"MyType": "Query", "TargetType": d.ad_type, "Name": d.name})
    ad["ReplayEventTime"] = env.ts
    return repr(ad)


@pytest.fixture(scope="module")
def replayed(small_run: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[LedgerCollector, Client, list[Envelope], Path]]:
    """Every event of the embedded run, in order: ads and invalidations through `advertise`,
    the rest appended as they are (the job events come from the schedds' logs, not CEDAR).
    The tests share one replay (a minute); the one closing the backend runs last."""
    tmp_path = tmp_path_factory.mktemp("replayed")
    home = tmp_path / "home"
    log = EmbeddedLog(home / "log")
    ensure_topics(log)
    now = [0.0]
    inner = LedgerCollector(log, load_settings(config_path=[], env={}, overrides={}),
                            name="collector@cm.example.org", clock=lambda: now[0])
    envs = [decode(line) for line in (small_run / "events.jsonl").read_bytes().splitlines()]
    with Endpoint(tmp_path, backend=ReplayBackend(inner, now)) as ep:  # type: ignore[arg-type]
        client = Client(ep.port, tmp_path)
        try:
            run: list[Envelope] = []
            sent = 0

            def send() -> None:
                nonlocal sent
                if run:
                    client.ask(command=_command(run[0]), ads=[_wire_text(e) for e in run])
                    sent += len(run)
                    deadline = time.monotonic() + 30
                    while inner.commands < sent and time.monotonic() < deadline:
                        time.sleep(0.001)  # the server is still handling the last command
                    assert inner.commands == sent, (inner.commands, sent)
                    run.clear()

            for env in envs:
                command = _command(env)
                if command is None:
                    send()
                    inner.tick(env.ts)
                    inner.elog.append(EVENTS, [env])
                    continue
                if run and _command(run[0]) != command:
                    send()
                run.append(env)
            send()
            assert ep.refusals() == []
            yield inner, client, envs, home
        finally:
            client.close()
            inner.close()


def _normal(ad: dict[str, Any]) -> dict[str, Any]:
    """An ad as the wire carries it: HTCondor's unparser writes reals to 16 significant
    digits, and `/Expr(120)/` and 120 are the same ClassAd."""
    return ad_to_json(classad2.ClassAd(repr(ad_from_json(ad))))


def test_client_queries_and_priorities_are_the_folds(replayed: Any) -> None:
    backend, client, _envs, _home = replayed
    machines = [r for r in backend.ledger.collector_ads("Machine")]
    for constraint, projection in [("Cpus >= 4", ["Name", "Cpus"]),
                                   ('State == "Claimed" && Memory > 0', []),
                                   ("PartitionableSlot =?= true", ["Name", "Start", "TotalSlotCpus"]),
                                   ("NoSuchAttr > 1", ["Name"])]:
        got = client.ask(constraint=constraint, projection=projection)["ads"]
        want = []
        for rec in machines:
            ad = ad_from_json(rec.ad)
            value = classad2.ExprTree(constraint).eval(scope=ad)
            if value is True:
                want.append({k: (str(ad.lookup(k)) if isinstance(ad.lookup(k), classad2.ExprTree)
                                 and not isinstance(ad[k], (int, float, str, bool)) else ad[k])
                             for k in (projection or ad.keys()) if k in ad})
        key = lambda a: a["Name"]  # noqa: E731
        assert sorted(got, key=key) == sorted(want, key=key), constraint
    prios = client.ask(priorities=True)["prios"]
    ledger = backend.ledger
    rows = ledger.priorities(ledger.now, all_groups=True)
    # htcondor2 splits Name12 as Name1 + 2 (a greedy regex): only entries 1-9 read back whole
    readable = {p["Name"]: p for p in prios if "Name" in p and "Priority" in p}
    assert readable and set(readable) <= set(rows)
    for name, p in readable.items():
        assert p["Priority"] == pytest.approx(rows[name]["Priority"])
        assert p["PriorityFactor"] == rows[name]["PriorityFactor"]


def test_a_replayed_scenario_leaves_the_embedded_runs_state_and_userprio(
        replayed: Any, small_run: Path) -> None:
    backend, _client, envs, home = replayed
    backend.close()
    settings = load_settings(config_path=[], env={}, overrides={})
    want = replay(iter(envs), settings)
    got = replay((env for _, env in backend.elog.read(EVENTS)), settings)
    assert got.now == want.now
    ads_want = {(r.ad_type, r.name): r for r in want.collector_ads(absent=None)}
    ads_got = {(r.ad_type, r.name): r for r in got.collector_ads(absent=None)}
    assert ads_got.keys() == ads_want.keys() and len(ads_want) > 20
    for key, w in ads_want.items():
        g = ads_got[key]
        ad = dict(g.ad)
        if "LastHeardFrom" not in w.ad:  # the collector stamps every ad it receives
            assert ad.pop("LastHeardFrom") == int(g.updated)
        assert _normal(ad) == _normal(w.ad), key
        assert (g.updated, g.expires, g.absent, g.weight) == (w.updated, w.expires, w.absent,
                                                             w.weight), key
    assert got.pool_size() == want.pool_size()
    assert got.priorities(want.now) == want.priorities(want.now)
    # the log did not grow with the heartbeats: fewer ad events than the embedded run's
    ours = sum(1 for _, e in backend.elog.read(EVENTS) if e.type.startswith("ad."))
    theirs = sum(1 for e in envs if e.type.startswith("ad."))
    assert ours < theirs
    # and the commands read the same: condor_userprio's and condor_status's views

    def cli(home: Path, *argv: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["--home", str(home), *argv]) == 0
        return out.getvalue()

    backend.elog.log.close()
    for view in (["userprio", "-all"], ["status"], ["status", "-submitters"]):
        assert cli(home, *view) == cli(small_run, *view), view
