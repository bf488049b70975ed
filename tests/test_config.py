"""condor_config reader, knob table, typed Settings with precedence, and `config show`."""
from __future__ import annotations

import argparse
import dataclasses
import io
import os
from pathlib import Path

import pytest

from schemas.classads import ExprTree, evaluate
from schemas.config import DEFAULT_SOURCE, ConfigEntry, ConfigValues, parse_config_text, read_config
from schemas.errors import ConfigError
from schemas.knobs import KNOBS, find_knob
from schemas.settings import Settings, UnknownKnobError, load_settings
from services.commands import config as config_cmd

DATA = Path(__file__).parent / "data"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- the reader ------------------------------------------------------------------------


def test_macro_expansion_recursive_with_defaults() -> None:
    cfg = parse_config_text(
        "MINUTE = 60\nHOUR = (60 * $(MINUTE))\nDAY = 24 * $(hour)\n"
        "A = $(UNSET:fallback $(MINUTE))\nB = [$(UNSET)]\nC = $(MINUTE:ignored)\n"
        "D = $$(Memory) stays\nE = $ENV(PL_TEST_VAR:none)\n", "f.conf")
    assert cfg.get("DAY") == "24 * (60 * 60)"
    assert cfg.get("a") == "fallback 60"
    assert cfg.get("B") == "[]"             # undefined macros expand to nothing, as HTCondor
    assert cfg.get("C") == "60"
    assert cfg.get("D") == "$$(Memory) stays"
    assert cfg.raw("DAY") == "24 * $(hour)"
    assert cfg.source("DAY") == "f.conf:3"
    assert evaluate(cfg.get("DAY") or "") == 86400


def test_macro_cycle_names_the_chain(tmp_path: Path) -> None:
    path = write(tmp_path / "c.conf", "A = x $(B)\nB = $(C)\nC = $(a) y\n")
    cfg = read_config(path)
    with pytest.raises(ConfigError) as exc:
        cfg.get("A")
    assert "A -> B -> C -> A" in str(exc.value)
    assert exc.value.knob == "A" and exc.value.source == f"{path}:1"
    with pytest.raises(ConfigError, match="cycle"):  # and Settings refuses it at load
        load_settings(path, env={})


def test_self_reference_takes_the_previous_value() -> None:
    base = ConfigValues({"START": ConfigEntry("START", "True", DEFAULT_SOURCE)})
    cfg = parse_config_text('START = ($(START)) || Owner == "coltrane"\nSTART = $(START) && X\n', base=base)
    assert cfg.get("START") == '(True) || Owner == "coltrane" && X'  # textual, as HTCondor
    assert parse_config_text("NEW = a $(NEW:b)\n").get("NEW") == "a b"


def test_multiline_value() -> None:
    cfg = parse_config_text("X = 1\nBIG @=end\n  line one $(X)\n  # not a comment here\n@end\nY = 2\n", "m")
    assert cfg.get("BIG") == "  line one 1\n  # not a comment here"
    assert cfg.source("BIG") == "m:2" and cfg.source("Y") == "m:6"
    with pytest.raises(ConfigError, match="never closed") as exc:
        parse_config_text("BIG @=end\nstuff\n", "m")
    assert exc.value.source == "m:1" and exc.value.knob == "BIG"


def test_continuation_and_comments() -> None:
    cfg = parse_config_text(
        "# a comment\n   # indented comment\nLIST = a, \\\n       b, \\\n# dropped inside\n       c\n"
        "AFTER = 1 # not a comment: HTCondor comments start lines\n", "k")
    assert cfg.get("LIST") == "a,        b,        c"
    assert cfg.source("LIST") == "k:3" and cfg.source("AFTER") == "k:7"
    assert cfg.get("AFTER") == "1 # not a comment: HTCondor comments start lines"


def test_case_insensitive_and_later_wins() -> None:
    cfg = parse_config_text("Negotiator_Interval = 10\nNEGOTIATOR_INTERVAL = 20\n", "f")
    assert cfg.get("negotiator_interval") == "20" and cfg.source("NeGoTiAtOr_InTeRvAl") == "f:2"
    assert len(cfg) == 1


def test_directory_is_read_in_lexical_order(tmp_path: Path) -> None:
    d = tmp_path / "config.d"
    write(d / "20-b.conf", "X = b\nY = $(X)-y\n")
    write(d / "10-a.conf", "X = a\nZ = a\n")
    write(d / "99-z.conf~", "X = backup\n")       # skipped like LOCAL_CONFIG_DIR_EXCLUDE_REGEXP
    write(d / ".hidden", "X = hidden\n")
    cfg = read_config(d)
    assert cfg.get("X") == "b" and cfg.source("X") == f"{d / '20-b.conf'}:1"
    assert cfg.get("Z") == "a" and cfg.get("Y") == "b-y"


def test_fixture_config_with_include_dir() -> None:
    cfg = read_config(DATA / "condor_config")
    assert cfg.get("NEGOTIATOR_INTERVAL") == "50"                     # config.d/20 wins over 10
    assert cfg.source("NEGOTIATOR_INTERVAL") == f"{DATA / 'config.d' / '20-override.conf'}:1"
    assert cfg.get("SLOT_WEIGHT") == "    Cpus\n      + Memory / 4096"


def test_include_and_conditionals(tmp_path: Path) -> None:
    write(tmp_path / "sub" / "extra.conf", "EXTRA = yes\n")
    main = write(tmp_path / "main.conf",
                 "include : sub/extra.conf\ninclude ifexist : missing.conf\n"
                 "if defined EXTRA\n  A = 1\nelse\n  A = 2\nendif\n"
                 "if false\n  B = 1\nelif $(EXTRA)\n  B = 2\nelse\n  B = 3\nendif\n")
    cfg = read_config(main)
    assert cfg.get("EXTRA") == "yes" and cfg.get("A") == "1" and cfg.get("B") == "2"
    with pytest.raises(ConfigError, match="does not exist") as exc:
        read_config(write(tmp_path / "bad.conf", "X = 1\ninclude : nowhere.conf\n"))
    assert exc.value.source == f"{tmp_path / 'bad.conf'}:2"


@pytest.mark.parametrize("text, line, words", [
    ("A = 1\nthis is not config\n", 2, "expected 'NAME = value'"),
    ("use ROLE : CentralManager\n", 1, "not supported"),
    ("if true\nA = 1\n", 1, "without 'endif'"),
    ("endif\n", 1, "without 'if'"),
])
def test_malformed_lines_name_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = write(tmp_path / "x.conf", text)
    with pytest.raises(ConfigError) as exc:
        read_config(path)
    assert exc.value.source == f"{path}:{line}" and words in str(exc.value)


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as exc:
        load_settings(tmp_path / "nope", env={})
    assert exc.value.source == "command line --config"
    with pytest.raises(ConfigError) as exc:
        load_settings(env={"POOLLEDGER_CONFIG": str(tmp_path / "nope")})
    assert exc.value.source == "env POOLLEDGER_CONFIG"


# --- the knob table --------------------------------------------------------------------


REQUIRED = """PRIORITY_HALFLIFE DEFAULT_PRIO_FACTOR NICE_USER_PRIO_FACTOR REMOTE_PRIO_FACTOR
ACCOUNTANT_LOCAL_DOMAIN NEGOTIATOR_USE_SLOT_WEIGHTS SLOT_WEIGHT NEGOTIATOR_DISCOUNT_SUSPENDED_RESOURCES
UID_DOMAIN GROUP_NAMES GROUP_ACCEPT_SURPLUS GROUP_AUTOREGROUP GROUP_SORT_EXPR
GROUP_QUOTA_MAX_ALLOCATION_ROUNDS NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION NEGOTIATOR_STRICT_ENFORCE_QUOTA
CONCURRENCY_LIMIT_DEFAULT CLASSAD_LIFETIME ABSENT_REQUIREMENTS ABSENT_EXPIRE_ADS_AFTER EXPIRE_INVALIDATED_ADS
NEGOTIATOR_INTERVAL NEGOTIATOR_CYCLE_DELAY NEGOTIATOR_MIN_INTERVAL NEGOTIATOR_MAX_TIME_PER_SUBMITTER
NEGOTIATOR_MAX_TIME_PER_SCHEDD NEGOTIATOR_MAX_TIME_PER_CYCLE NEGOTIATOR_MAX_TIME_PER_PIESPIN
PREEMPTION_REQUIREMENTS PREEMPTION_REQUIREMENTS_STABLE PREEMPTION_RANK PREEMPTION_RANK_STABLE
NEGOTIATOR_PRE_JOB_RANK NEGOTIATOR_POST_JOB_RANK NEGOTIATOR_CONSIDER_PREEMPTION
NEGOTIATOR_CONSIDER_EARLY_PREEMPTION NEGOTIATE_ALL_JOBS_IN_CLUSTER SIGNIFICANT_ATTRIBUTES
NEGOTIATOR_SLOT_CONSTRAINT NEGOTIATOR_RESOURCE_REQUEST_LIST_SIZE USE_GLOBAL_JOB_PRIOS MATCH_TIMEOUT
ALIVE_INTERVAL NUM_SLOTS START RANK SUSPEND CONTINUE PREEMPT KILL WANT_SUSPEND WANT_VACATE IS_OWNER
MAXJOBRETIREMENTTIME MACHINEMAXVACATETIME POOLLEDGER_HOME POOLLEDGER_BROKER POOLLEDGER_ACCOUNTING_MODE
POOLLEDGER_EVENTS_PARTITIONS""".split()

FAMILIES = {"GROUP_QUOTA_g": "GROUP_QUOTA_<group>", "GROUP_QUOTA_DYNAMIC_g": "GROUP_QUOTA_DYNAMIC_<group>",
            "GROUP_ACCEPT_SURPLUS_g": "GROUP_ACCEPT_SURPLUS_<group>",
            "GROUP_AUTOREGROUP_g": "GROUP_AUTOREGROUP_<group>", "GROUP_PRIO_FACTOR_g": "GROUP_PRIO_FACTOR_<group>",
            "xsw_LIMIT": "<name>_LIMIT", "CONCURRENCY_LIMIT_DEFAULT_small": "CONCURRENCY_LIMIT_DEFAULT_<set>",
            "SLOT_TYPE_2": "SLOT_TYPE_<N>", "NUM_SLOTS_TYPE_2": "NUM_SLOTS_TYPE_<N>",
            "MACHINE_RESOURCE_GPUs": "MACHINE_RESOURCE_<name>"}


def test_table_has_every_knob_and_family() -> None:
    for name in REQUIRED:
        knob = find_knob(name)
        assert knob is not None and not knob.is_pattern and knob.name.upper() == name, name
    for name, family in FAMILIES.items():
        knob = find_knob(name)
        assert knob is not None and knob.name == family, name
    names = [k.name.upper() for k in KNOBS]
    assert len(names) == len(set(names))
    assert all(k.description and "\n" not in k.description for k in KNOBS)


def test_defaults_are_htcondors_and_all_convert() -> None:
    s = load_settings(env={})
    assert s.get("PRIORITY_HALFLIFE") == 86400.0
    assert s.get("DEFAULT_PRIO_FACTOR") == 1000.0 and s.get("NICE_USER_PRIO_FACTOR") == 1e10
    assert s.get("REMOTE_PRIO_FACTOR") == 1e7
    assert s.get("CONCURRENCY_LIMIT_DEFAULT") == 2308032 and s.get("CLASSAD_LIFETIME") == 900
    assert s.get("NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION") is False
    assert "seed" in (s.knob("NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION") or KNOBS[0]).description
    assert s.get("NEGOTIATOR_STRICT_ENFORCE_QUOTA") is True and s.get("GROUP_QUOTA_MAX_ALLOCATION_ROUNDS") == 3
    assert s.get("NEGOTIATOR_MAX_TIME_PER_CYCLE") == 1200 and s.get("ABSENT_EXPIRE_ADS_AFTER") == 30 * 86400
    assert s.get("MATCH_TIMEOUT") == 120 and s.get("NEGOTIATOR_RESOURCE_REQUEST_LIST_SIZE") == 200
    assert s.get("POOLLEDGER_ACCOUNTING_MODE") == "exact" and s.get("POOLLEDGER_BROKER") == ""
    assert s.get("GROUP_NAMES") == () and s.get("NUM_SLOTS") is None
    assert s.expr("NEGOTIATOR_SLOT_CONSTRAINT") is None
    for knob in KNOBS:
        if not knob.is_pattern:
            s.get(knob.name)  # every default converts
            assert s.source(knob.name) == DEFAULT_SOURCE
    slot = {"Cpus": 4, "Memory": 8192, "SlotID": 1}
    assert evaluate(s.expr("SLOT_WEIGHT") or "", slot) == 4
    assert evaluate(s.expr("IS_OWNER") or "", {"START": True}) is False
    assert evaluate(s.expr("MachineMaxVacateTime") or "") == 600
    sort = s.expr("GROUP_SORT_EXPR")
    assert evaluate(sort or "", {"AccountingGroup": "g", "GroupQuota": 10, "GroupResourcesInUse": 5.0}) == 0.5
    assert evaluate(s.expr("NEGOTIATOR_POST_JOB_RANK") or "", slot) == 999.0


# --- Settings: precedence, types, sources ----------------------------------------------


def test_precedence_all_four_levels(tmp_path: Path) -> None:
    cfg = write(tmp_path / "condor_config",
                "PRIORITY_HALFLIFE = 1000\nNEGOTIATOR_INTERVAL = 30\nMATCH_TIMEOUT = 90\n")
    env = {"POOLLEDGER_NEGOTIATOR_INTERVAL": "40", "POOLLEDGER_MATCH_TIMEOUT": "80",
           "POOLLEDGER_HOME": str(tmp_path / "home"), "POOLLEDGER_CONFIG": "/ignored/when/path/given"}
    s = load_settings(str(cfg), env=env, overrides={"match_timeout": "70"})
    assert (s.get("CLASSAD_LIFETIME"), s.source("CLASSAD_LIFETIME")) == (900, "<Default>")
    assert (s.get("PRIORITY_HALFLIFE"), s.source("PRIORITY_HALFLIFE")) == (1000.0, f"{cfg}:1")
    assert (s.get("NEGOTIATOR_INTERVAL"), s.source("NEGOTIATOR_INTERVAL")) == (40, "env POOLLEDGER_NEGOTIATOR_INTERVAL")
    assert (s.get("MATCH_TIMEOUT"), s.source("MATCH_TIMEOUT")) == (70, "command line")
    assert (s.get("POOLLEDGER_HOME"), s.source("POOLLEDGER_HOME")) == (str(tmp_path / "home"), "env POOLLEDGER_HOME")
    assert s.get("POOLLEDGER_DUCKDB_PATH") == str(tmp_path / "home" / "history.duckdb")
    # POOLLEDGER_CONFIG is used when no path is given
    s2 = load_settings(env={"POOLLEDGER_CONFIG": str(cfg)})
    assert s2.source("MATCH_TIMEOUT") == f"{cfg}:3" and s2.get("MATCH_TIMEOUT") == 90


def test_config_values_use_macros_and_expressions() -> None:
    s = load_settings(DATA / "condor_config", env={})
    assert s.get("PRIORITY_HALFLIFE") == 7200.0          # 2 * $(HOUR), evaluated as HTCondor does
    assert s.raw("PRIORITY_HALFLIFE") == "2 * $(HOUR)" and s.text("PRIORITY_HALFLIFE") == "2 * (60 * 60)"
    assert s.get("GROUP_NAMES") == ("group_physics", "group_chemistry", "group_physics.hep")
    assert s.get("UID_DOMAIN") == "example.org" and s.get("DEFAULT_PRIO_FACTOR") == 100.0
    assert str(s.expr("START")) == '(true) && (Owner != "mallory")'
    weight = s.expr("SLOT_WEIGHT")
    assert isinstance(weight, ExprTree) and evaluate(weight, {"Cpus": 2, "Memory": 8192}) == 4
    assert s.get("MINUTE") == 60 and s.get("HOUR") == 3600  # HTCondor's built-in macros, typed
    assert s.with_overrides({"MY_MACRO": "60"}).get("MY_MACRO") == "60"  # undeclared: plain text


def test_families() -> None:
    s = load_settings(DATA / "condor_config", env={},
                      overrides={"GROUP_ACCEPT_SURPLUS_group_chemistry": "false", "large.swlicense_LIMIT": "2",
                                 "CONCURRENCY_LIMIT_DEFAULT_large": "3", "GROUP_PRIO_FACTOR_group_physics": "2.5"})
    assert s.group_quota("group_physics") == 60.0 and s.group_quota("group_chemistry") is None
    assert s.group_quota_dynamic("group_chemistry") == 0.25
    assert s.group_accept_surplus("group_physics") is True          # falls back to GROUP_ACCEPT_SURPLUS
    assert s.group_accept_surplus("group_chemistry") is False
    assert s.group_autoregroup("group_physics") is False and s.group_prio_factor("group_physics") == 2.5
    assert s.family("GROUP_QUOTA_<group>") == {"group_physics": 60.0}
    assert s.concurrency_limit("xsw") == 4.0
    assert s.concurrency_limit("large.swlicense") == 2.0 and s.concurrency_limit("large.other") == 3.0
    assert s.concurrency_limit("unnamed") == 2308032.0
    assert s.get("GROUP_QUOTA_unconfigured") is None


@pytest.mark.parametrize("knob, value, words", [
    ("NEGOTIATOR_INTERVAL", "soon", "expected an integer"),
    ("NEGOTIATOR_INTERVAL", "2.5", "expected an integer"),
    ("PRIORITY_HALFLIFE", "one day", "expected a number"),
    ("NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION", "maybe", "expected a boolean"),
    ("START", "(Owner == ", "cannot parse expression"),
    ("NEGOTIATOR_INTERVAL", "0", "must be > 0"),
    ("GROUP_QUOTA_DYNAMIC_g", "1.5", "between 0 and 1"),
    ("POOLLEDGER_ACCOUNTING_MODE", "fuzzy", "one of exact, htcondor"),
    ("POOLLEDGER_BROKER", "http://x", "kafka://"),
])
def test_bad_values_name_knob_and_source(tmp_path: Path, knob: str, value: str, words: str) -> None:
    path = write(tmp_path / "condor_config", f"# header\nMINUTE = 60\n{knob} = {value}\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(path, env={})
    assert exc.value.knob == knob and exc.value.source == f"{path}:3"
    assert words in str(exc.value) and knob in str(exc.value) and f"{path}:3" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load_settings(env={f"POOLLEDGER_{knob}": value})
    assert exc.value.source == f"env POOLLEDGER_{knob}"
    with pytest.raises(ConfigError) as exc:
        load_settings(env={}, overrides={knob.lower(): value})
    assert exc.value.source == "command line"


def test_settings_are_frozen_and_derive(tmp_path: Path) -> None:
    s = load_settings(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.config = s.config  # type: ignore[misc]
    t = s.with_overrides({"PRIORITY_HALFLIFE": "3600"}, source="config.changed by admin")
    assert t.get("PRIORITY_HALFLIFE") == 3600.0 and t.source("PRIORITY_HALFLIFE") == "config.changed by admin"
    assert s.get("PRIORITY_HALFLIFE") == 86400.0 and isinstance(t, Settings)
    with pytest.raises(ConfigError):
        s.with_overrides({"NEGOTIATOR_INTERVAL": "x"})


def test_iteration_lookup_and_unknown() -> None:
    s = load_settings(env={}, overrides={"my_macro": "1"})
    names = list(s)
    assert "PRIORITY_HALFLIFE" in names and "MachineMaxVacateTime" in names and "my_macro" in names
    assert s.get("priority_halflife") == 86400.0 and "Priority_Halflife" in s
    assert dict(s.items())["my_macro"] == "1" and s.is_set("my_macro") and not s.is_set("START")
    with pytest.raises(UnknownKnobError, match="NO_SUCH_KNOB: not defined"):
        s.get("NO_SUCH_KNOB")
    with pytest.raises(KeyError):  # reads like a mapping lookup to callers
        s.get("NO_SUCH_KNOB")
    with pytest.raises(UnknownKnobError):
        s.source("NO_SUCH_KNOB")


# --- config show -----------------------------------------------------------------------


def _run_show(settings: Settings, *names: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    config_cmd.register(sub)
    args = parser.parse_args(["config", "show", *names])
    out, err = io.StringIO(), io.StringIO()
    rc = config_cmd.show(args, settings, out=out, err=err)
    assert args.func is config_cmd.show
    return rc, out.getvalue(), err.getvalue()


def test_config_show_like_condor_config_val(tmp_path: Path) -> None:
    cfg = write(tmp_path / "condor_config", "HOUR = 3600\nPRIORITY_HALFLIFE = 2 * $(HOUR)\n")
    s = load_settings(cfg, env={"POOLLEDGER_NEGOTIATOR_INTERVAL": "30"}, overrides={"MATCH_TIMEOUT": "10"})
    rc, out, err = _run_show(s, "priority_halflife", "NEGOTIATOR_INTERVAL", "MATCH_TIMEOUT", "CLASSAD_LIFETIME")
    assert rc == 0 and err == ""
    assert out.splitlines() == [
        "PRIORITY_HALFLIFE = 2 * 3600", f" # at: {cfg}:2", " # raw: PRIORITY_HALFLIFE = 2 * $(HOUR)",
        "NEGOTIATOR_INTERVAL = 30", " # at: env POOLLEDGER_NEGOTIATOR_INTERVAL",
        "MATCH_TIMEOUT = 10", " # at: command line",
        "CLASSAD_LIFETIME = 900", " # at: <Default>"]


def test_config_show_all_and_unknown() -> None:
    s = load_settings(env={})
    rc, out, _ = _run_show(s)
    assert rc == 0 and "PRIORITY_HALFLIFE = 86400\n # at: <Default>" in out
    assert out.count(" # at: ") == len(s)
    rc, out, err = _run_show(s, "NO_SUCH_KNOB", "CLASSAD_LIFETIME")
    assert rc == 1 and "Not defined: NO_SUCH_KNOB" in err and "CLASSAD_LIFETIME = 900" in out


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from services.cli import main
    for var in [v for v in os.environ if v.startswith("POOLLEDGER_")]:
        monkeypatch.delenv(var)
    cfg = write(tmp_path / "condor_config", "NEGOTIATOR_INTERVAL = 30\nCLASSAD_LIFETIME = forever\n")
    assert main(["--config", str(cfg), "config", "show", "NEGOTIATOR_INTERVAL"]) == 2
    err = capsys.readouterr().err
    assert "CLASSAD_LIFETIME" in err and f"{cfg}:2" in err
    assert main(["--set", "NEGOTIATOR_INTERVAL=12", "config", "show", "negotiator_interval"]) == 0
    assert capsys.readouterr().out == "NEGOTIATOR_INTERVAL = 12\n # at: command line\n"
    assert main(["config", "show", "NOPE"]) == 1
    assert "Not defined: NOPE" in capsys.readouterr().err


def test_a_5000_deep_macro_chain_is_named_not_a_recursion_error(tmp_path: Path) -> None:
    """Issue 10: a runaway chain of $(NAME) macros is one configuration error naming the knob
    and its file:line (was a RecursionError traceback)."""
    lines = ["M0 = 1"] + [f"M{i} = $(M{i - 1})" for i in range(1, 5001)]
    cfg = tmp_path / "condor_config"
    cfg.write_text("\n".join(lines + ["PRIORITY_HALFLIFE = $(M5000)"]) + "\n")
    values = read_config(cfg)
    with pytest.raises(ConfigError) as err:
        values.get("PRIORITY_HALFLIFE")
    assert "macros nested deeper than" in str(err.value)
    assert err.value.knob == "PRIORITY_HALFLIFE" and str(cfg) in str(err.value.source)
    assert values.get("M150") == "1"  # a deep but bounded chain still expands


@pytest.mark.parametrize("word, truth", [("True", True), ("yes", True), ("T", True), ("y", True),
                                         ("1", True), ("on", True), ("FALSE", False), ("No", False),
                                         ("f", False), ("n", False), ("0", False), ("off", False)])
def test_one_boolean_vocabulary_for_every_reader(tmp_path: Path, word: str, truth: bool) -> None:
    """Settings, the config reader's `if`, the folds' knob_bool (config.changed text), the
    accountant, the negotiator's config and the simulated daemons read the same words alike."""
    from schemas.config import Knobs, knob_bool
    from schemas.settings import DaemonConfig
    from services.negotiator.model import NegotiatorConfig
    from streams.core.accountant import AccountantConfig

    conf = write(tmp_path / "condor_config", f"if {word}\nX = yes\nelse\nX = no\nendif\n")
    assert load_settings(conf, env={}).text("X") == ("yes" if truth else "no")
    assert load_settings(config_path=[], env={}, overrides={"GROUP_ACCEPT_SURPLUS": word}).get(
        "GROUP_ACCEPT_SURPLUS") is truth
    assert knob_bool(Knobs({"EXPIRE_INVALIDATED_ADS": word}), "EXPIRE_INVALIDATED_ADS", not truth) is truth
    assert AccountantConfig().with_knob("NEGOTIATOR_USE_SLOT_WEIGHTS", word).use_slot_weights is truth
    assert NegotiatorConfig.from_knobs({"NEGOTIATOR_CONSIDER_PREEMPTION": word}) \
        .negotiator_consider_preemption is truth
    assert DaemonConfig({"CONSUMPTION_POLICY": word}).boolean("CONSUMPTION_POLICY") is truth


def test_negotiator_interval_is_read_in_one_place() -> None:
    """The cycle cadence comes from the log's settings in `negotiator_interval` only; the knob
    table declares it (and validates it, > 0). A second reader would drift from the log."""
    root = Path(__file__).resolve().parents[1]
    readers = sorted(str(p.relative_to(root)) for pkg in ("schemas", "streams", "services", "adstash", "ganglia")
                     for p in (root / pkg).rglob("*.py") if '"NEGOTIATOR_INTERVAL"' in p.read_text())
    assert readers == ["schemas/config.py", "schemas/knobs.py"]
