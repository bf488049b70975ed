"""The defaults table: every configuration knob PoolLedger reads, with HTCondor's default.

One table so `config show` can list everything, settings can type-check every value at
load, and an HTCondor admin finds the names and defaults they know (REFERENCE.md and the
seed manual pages). Defaults are condor_config text, expanded and converted like any value.
Names are case-insensitive, as in HTCondor. A name with `<...>` declares a family of knobs
(e.g. `GROUP_QUOTA_<group>`); `<N>` stands for a number, any other placeholder for a name.
"""
from __future__ import annotations

import difflib
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from schemas.classads import nondeterministic

KnobType = Literal["int", "float", "bool", "str", "expr", "list", "path"]
KNOB_TYPES: tuple[str, ...] = ("int", "float", "bool", "str", "expr", "list", "path")
#: A validator gets the converted value and returns why it is unacceptable, or None.
Validator = Callable[[Any], "str | None"]


@dataclass(frozen=True, slots=True)
class Knob:
    """One knob (or, when `name` has a `<placeholder>`, one family of knobs)."""

    name: str
    default: str
    type: KnobType
    description: str
    validate: Validator | None = None
    #: a credential: `config show` prints it as <hidden>
    secret: bool = False
    #: decides who may do what (authorization, identity, authentication, the time bounds):
    #: counts only from configuration owned by root or the data directory's owner, as
    #: HTCondor ignores security settings in a user's own config (schemas.settings)
    security: bool = False

    @property
    def is_pattern(self) -> bool:
        return "<" in self.name


# --- validators ------------------------------------------------------------------------


def at_least(low: float) -> Validator:
    """Reject values below `low` (used for counts, intervals, factors)."""
    def check(value: Any) -> str | None:
        return None if value is None or value >= low else f"must be >= {low:g}"
    return check


def greater_than(low: float) -> Validator:
    def check(value: Any) -> str | None:
        return None if value is None or value > low else f"must be > {low:g}"
    return check


def between(low: float, high: float) -> Validator:
    def check(value: Any) -> str | None:
        return None if value is None or low <= value <= high else f"must be between {low:g} and {high:g}"
    return check


def one_of(*choices: str) -> Validator:
    """Case-insensitive choice among fixed words."""
    allowed = {c.lower() for c in choices}

    def check(value: Any) -> str | None:
        return None if str(value).lower() in allowed else f"must be one of {', '.join(choices)}"
    return check


def _deterministic(value: Any) -> str | None:
    """A knob the folds evaluate must give the same value on every replay."""
    found = None if value is None else nondeterministic(str(value))
    return (f"calls {found}, which is nondeterministic: a folded knob must give the same value "
            "on every replay") if found else None


def _broker_url(value: Any) -> str | None:
    text = str(value)
    if not text or text.lower() == "embedded" or re.match(r"kafka://[^/\s]+\Z", text):
        return None
    return "must be empty (embedded log) or kafka://HOST:PORT[,HOST:PORT...]"


def _sec_req(value: Any) -> str | None:
    """HTCondor reads a security requirement by its first letter (condor_secman.cpp)."""
    text = str(value or "").strip()
    if not text or text[0].upper() in "RYTPOFN":
        return None
    return "must be REQUIRED, PREFERRED, OPTIONAL or NEVER"


# --- the table -------------------------------------------------------------------------

_GROUP_SORT_EXPR = ('ifThenElse(AccountingGroup=?="<none>",3.4e+38,'
                    'ifThenElse(GroupQuota>0,GroupResourcesInUse/GroupQuota,3.3e+38))')
_PRE_JOB_RANK = ("(10000000 * My.Rank) + (1000000 * (RemoteOwner =?= UNDEFINED)) "
                 "- (100000 * Cpus) - Memory")
_POST_JOB_RANK = ("(RemoteOwner =?= UNDEFINED) * (ifthenElse(isUndefined(KFlops), 1000, Kflops) "
                  "- SlotID - 1.0e10*(Offline=?=True))")
_PREEMPTION_RANK = ("(RemoteUserPrio * 1000000) - "
                    "ifThenElse(isUndefined(TotalJobRuntime), 0, TotalJobRuntime)")


def _fqdn() -> str:
    try:
        return socket.getfqdn() or "localhost"
    except OSError:  # pragma: no cover
        return "localhost"


_NONNEG = at_least(0)
_POS = greater_than(0)

KNOBS: tuple[Knob, ...] = (
    # host and directories
    Knob("FULL_HOSTNAME", _fqdn(), "str", "This machine's fully qualified name (built in, as HTCondor's)."),
    Knob("CONDOR_HOST", "", "str", "Central manager host of a real HTCondor pool to bridge from."),
    Knob("COLLECTOR_HOST", "$(CONDOR_HOST)", "str", "Collector of a real HTCondor pool to bridge from."),
    Knob("UID_DOMAIN", "$(FULL_HOSTNAME)", "str", "Domain appended to submitter names (user@UID_DOMAIN) "
         "and to the identity an admin event records.", security=True),
    Knob("LOG", "$(POOLLEDGER_HOME)/log", "path", "Directory for daemon logs and sink checkpoints."),
    Knob("SPOOL", "$(POOLLEDGER_HOME)/spool", "path", "Directory for persistent state (accountant log, snapshots)."),
    # PoolLedger's own
    Knob("POOLLEDGER_HOME", "out", "path", "PoolLedger's data directory (embedded log, state, caches); "
         "relative to the working directory, where `poolledger run` writes by default."),
    Knob("POOLLEDGER_BROKER", "", "str", "Kafka bootstrap as kafka://HOST:PORT; empty means the embedded log.",
         _broker_url),
    Knob("POOLLEDGER_EVENTS_TOPIC", "poolledger.events", "str",
         "The events topic every command reads and appends to, and the faust worker folds "
         "(`--topic`); a `--broker ... run` writes a topic of its own and prints its name."),
    Knob("POOLLEDGER_ACCOUNTING_MODE", "exact", "str",
         "exact: integrate usage between events; htcondor: update at negotiation cycles like condor_userprio.",
         one_of("exact", "htcondor")),
    Knob("POOLLEDGER_FAUST_APP", "poolledger", "str",
         "The faust worker's app id: its consumer group, changelog topics and status file "
         "(`poolledger faust-status`); a `--broker ... run` starts a worker of its own."),
    Knob("POOLLEDGER_EVENTS_PARTITIONS", "1", "int",
         "Partitions of the events topic; 1 keeps one total order, so every runner folds identically.",
         at_least(1)),
    Knob("POOLLEDGER_QUOTA_UPDATES", "cycle", "str",
         "cycle (default): compute and announce group quotas once per negotiation cycle, as "
         "HTCondor's negotiator does; event: recompute them after any event that moves an input "
         "(pool size, demand, a knob), so the state always shows current quotas (slower replays).",
         one_of("event", "cycle")),
    Knob("POOLLEDGER_MAX_EVENT_SKEW", "86400", "float",
         "Seconds an event's time may lie ahead of the ledger's clock (the latest event time "
         "folded); a later event is dead-lettered, so one bad clock never moves the ledger's. Not "
         "settable by a config.changed on the log.",
         _POS, security=True),
    Knob("POOLLEDGER_RECONCILE_TOLERANCE", "0.01", "float",
         "Relative difference between PoolLedger's accounting and a real negotiator's Accounting "
         "ad beyond which `poolledger reconcile` reports drift (|ours - theirs| > tolerance x "
         "max(|ours|, |theirs|), per attribute); the reconciliation fold dates each drift with it.",
         _NONNEG),
    Knob("POOLLEDGER_LEASE_TIMEOUT", "6", "float",
         "Seconds the embedded log's negotiator lease outlives its holder's last renewal (as "
         "a Kafka consumer group's session timeout): a stopped or dead active negotiator's "
         "standby takes over after it.", _POS),
    Knob("POOLLEDGER_CLOCK_QUORUM", "2", "int",
         "Sources whose latest event times vouch for the ledger's clock: it stands at most "
         "POOLLEDGER_CLOCK_LEAD ahead of the latest time of this many distinct sources, so one "
         "source's events cannot walk it. Not settable by a config.changed on the log.",
         between(1, 64), security=True),
    Knob("POOLLEDGER_CLOCK_LEAD", "900", "float",
         "Seconds the ledger's clock may lead the POOLLEDGER_CLOCK_QUORUM-th source's latest "
         "event (a live daemon reports within its ClassAd lifetime); an event further ahead is "
         "folded at the clock. Not settable by a config.changed on the log.",
         between(1, 10 * 365 * 86400), security=True),
    Knob("POOLLEDGER_FOLLOW_INTERVAL", "5", "float",
         "Seconds between two polls of a followed file (`poolledger follow`: a job event log, a "
         "history file, Accountantnew.log).", between(0.01, 86400)),
    Knob("POOLLEDGER_FOLLOW_NEGOTIATOR", "$(FULL_HOSTNAME)", "str",
         "NegotiatorName of the Accounting ads `follow accountant` reads from a real negotiator's "
         "Accountantnew.log: that negotiator's Name (its host name unless NEGOTIATOR_NAME is set)."),
    Knob("POOLLEDGER_DUCKDB_PATH", "$(POOLLEDGER_HOME)/history.duckdb", "path", "DuckDB file of the history sink."),
    Knob("POOLLEDGER_ES_URL", "", "str", "Elasticsearch URL of the history sink; empty disables it."),
    Knob("POOLLEDGER_LIVE_WINDOW", "3600", "float",
         "Seconds: a log whose last event lies within this of the wall clock is live, and an admin "
         "edit carries the time it was issued; otherwise (a finished simulation, an imported "
         "history) the edit is placed at the log's last event time.", between(1, 10 * 365 * 86400),
         security=True),
    Knob("POOLLEDGER_KAFKA_SASL_MECHANISM", "", "str",
         "SASL mechanism the Kafka clients authenticate with (SCRAM-SHA-512 for the launcher's "
         "secured broker); empty: no authentication.",
         one_of("", "SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"), security=True),
    Knob("POOLLEDGER_KAFKA_USER", "", "str", "SASL user name of the Kafka clients.", security=True),
    Knob("POOLLEDGER_KAFKA_PASSWORD", "", "str",
         "SASL password of the Kafka clients (never printed: config show says <hidden>).",
         secret=True, security=True),
    Knob("POOLLEDGER_COMPILE", "True", "bool",
         "Install streams/core compiled by mypyc (setup.py reads the environment variable at "
         "`make build`); False installs the plain-Python core, which folds identically."),
    # security (HTCondor's ADMINISTRATOR authorization level)
    Knob("ALLOW_ADMINISTRATOR", "", "list",
         "Who may append priority edits and knob changes: user@domain/host entries with * "
         "wildcards (HTCondor's forms; user@domain alone means any host, a bare host any user). "
         "Empty: root and the owner of the data directory, on this host. Read from condor_config "
         "files only: --set and POOLLEDGER_ALLOW_ADMINISTRATOR are refused.", security=True),
    Knob("DENY_ADMINISTRATOR", "", "list",
         "Identities refused ADMINISTRATOR even when ALLOW_ADMINISTRATOR admits them (deny wins).", security=True),
    # the collector endpoint (`poolledger collector`): network, and HTCondor's security knobs
    Knob("POOLLEDGER_COLLECTOR_ADDRESS", "127.0.0.1", "str",
         "Address `poolledger collector` binds (loopback by default; 0.0.0.0 for every interface)."),
    Knob("POOLLEDGER_COLLECTOR_PORT", "9618", "int",
         "TCP and UDP port of `poolledger collector` (HTCondor's collector port; 0: any free port).",
         between(0, 65535)),
    Knob("POOLLEDGER_COLLECTOR_MAX_CONNECTIONS", "1024", "int",
         "TCP connections the collector endpoint serves at once; one more is refused (logged) "
         "while the others are served.", at_least(1)),
    Knob("POOLLEDGER_COLLECTOR_TIMEOUT", "20", "float",
         "Seconds a message may take to arrive once begun, and a new connection to send its "
         "first command (HTCondor's 20 s command timeout): a slow sender is dropped.", _POS),
    Knob("POOLLEDGER_COLLECTOR_IDLE_TIMEOUT", "3600", "float",
         "Seconds a persistent connection may stay silent between commands before it is closed "
         "(a forwarding collector re-sends every few minutes).", _POS),
    Knob("POOLLEDGER_COLLECTOR_MAX_AD_ATTRIBUTES", "10000", "int",
         "Attributes one received ad may hold (a slot ad has a few hundred); more is refused.",
         at_least(1)),
    Knob("POOLLEDGER_COLLECTOR_MAX_MESSAGE_BYTES", "4194304", "int",
         "Bytes one received message may hold (its packets joined; a forwarded slot's public "
         "and private ads take tens of kB); more is refused. With MAX_CONNECTIONS it bounds "
         "the memory hostile senders can hold.", at_least(1024)),
    Knob("SEC_DEFAULT_AUTHENTICATION", "OPTIONAL", "str",
         "REQUIRED, PREFERRED, OPTIONAL or NEVER: whether a peer must authenticate (HTCondor's "
         "first-letter semantics; SEC_<level>_AUTHENTICATION per authorization level).", _sec_req, security=True),
    Knob("SEC_DEFAULT_ENCRYPTION", "REQUIRED", "str",
         "Whether sessions must be encrypted (AES-256-GCM after an ECDH key exchange); REQUIRED "
         "by default, as HTCondor's `use security:recommended`.", _sec_req, security=True),
    Knob("SEC_DEFAULT_INTEGRITY", "REQUIRED", "str",
         "Whether sessions must be integrity-checked (AES-GCM gives both).", _sec_req, security=True),
    Knob("SEC_DEFAULT_NEGOTIATION", "PREFERRED", "str",
         "Whether a peer must negotiate a session (DC_AUTHENTICATE); encryption or integrity "
         "REQUIRED makes it REQUIRED, refusing raw (SEC_CLIENT_NEGOTIATION = NEVER) commands.",
         _sec_req, security=True),
    Knob("SEC_DEFAULT_AUTHENTICATION_METHODS", "FS, IDTOKENS", "list",
         "Authentication methods offered, in order of preference (FS: same host; IDTOKENS: "
         "tokens signed with the pool signing key).", security=True),
    Knob("SEC_DEFAULT_SESSION_DURATION", "86400", "int", "Seconds a security session lives.", _POS, security=True),
    Knob("SEC_DEFAULT_SESSION_LEASE", "3600", "int",
         "Seconds a security session may go unused before it is forgotten (0: no lease).", _NONNEG, security=True),
    Knob("SEC_<level>_AUTHENTICATION", "", "str", "SEC_DEFAULT_AUTHENTICATION for one level "
         "(READ, DAEMON, NEGOTIATOR, ADVERTISE_STARTD, ...; ADVERTISE_* fall back to DAEMON).",
         _sec_req, security=True),
    Knob("SEC_<level>_ENCRYPTION", "", "str", "SEC_DEFAULT_ENCRYPTION for one level.", _sec_req, security=True),
    Knob("SEC_<level>_INTEGRITY", "", "str", "SEC_DEFAULT_INTEGRITY for one level.", _sec_req, security=True),
    Knob("SEC_<level>_NEGOTIATION", "", "str", "SEC_DEFAULT_NEGOTIATION for one level.", _sec_req, security=True),
    Knob("SEC_<level>_AUTHENTICATION_METHODS", "", "list",
         "SEC_DEFAULT_AUTHENTICATION_METHODS for one level.", security=True),
    Knob("SEC_PASSWORD_DIRECTORY", "/etc/condor/passwords.d", "path",
         "Directory of the token signing keys other than POOL (a token's kid names its key).", security=True),
    Knob("SEC_TOKEN_POOL_SIGNING_KEY_FILE", "$(SEC_PASSWORD_DIRECTORY)/POOL", "path",
         "The pool signing key: IDTOKENS signed with it (as condor_token_create issues them) "
         "authenticate; the key itself is never printed.", security=True),
    Knob("TRUST_DOMAIN", "$(FULL_HOSTNAME)", "str",
         "Issuer (iss) of the pool's IDTOKENS; a token from another trust domain is refused.", security=True),
    Knob("FS_LOCAL_DIR", "/tmp", "path", "Directory where FS authentication's clients prove their "
         "identity by creating a directory.", security=True),
    Knob("ALLOW_<level>", "", "list",
         "Who holds authorization level <level> (READ, WRITE, DAEMON, NEGOTIATOR, "
         "ADVERTISE_STARTD, ADVERTISE_SCHEDD, ADVERTISE_MASTER, ...): user@domain/host entries "
         "with * wildcards, IP addresses or networks (a.b.c.d/nn); unset: ADVERTISE_* fall back "
         "to ALLOW_DAEMON, every level to ALLOW_DEFAULT, and with nothing set anyone. A level "
         "implies lower ones (DAEMON: WRITE and READ; ADVERTISE_*, NEGOTIATOR: READ).", security=True),
    Knob("DENY_<level>", "", "list", "Who is refused authorization level <level> (deny wins).", security=True),
    Knob("SEC_<name>", "", "str",
         "HTCondor's other security settings (SEC_CLIENT_AUTHENTICATION_METHODS, ...).",
         security=True),
    # accountant
    Knob("PRIORITY_HALFLIFE", "86400", "float", "Seconds for a user's real priority to decay halfway to its usage.",
         _POS),
    Knob("DEFAULT_PRIO_FACTOR", "1000", "float", "Priority factor of a submitter with none set.", _POS),
    Knob("NICE_USER_PRIO_FACTOR", "1e10", "float", "Priority factor of nice-user submitters.", _POS),
    Knob("REMOTE_PRIO_FACTOR", "1e7", "float",
         "Priority factor of submitters outside ACCOUNTANT_LOCAL_DOMAIN (when that is set).", _POS),
    Knob("ACCOUNTANT_LOCAL_DOMAIN", "", "str", "Submitter domain counted as local; empty: every domain is local."),
    Knob("NEGOTIATOR_USE_SLOT_WEIGHTS", "True", "bool", "Charge usage by SlotWeight instead of by slot count."),
    Knob("SLOT_WEIGHT", "Cpus", "expr", "Weight of a slot for accounting and pie size (evaluated in the slot ad).",
         _deterministic),
    Knob("NEGOTIATOR_DISCOUNT_SUSPENDED_RESOURCES", "False", "bool", "Do not charge usage for suspended claims."),
    Knob("MAX_ACCOUNTANT_DATABASE_SIZE", "1000000", "int", "Bytes after which the accountant log is compacted.",
         _POS),
    # hierarchical group quotas
    Knob("GROUP_NAMES", "", "list", "Accounting groups (dotted for hierarchy); empty disables group quotas."),
    Knob("GROUP_QUOTA_<group>", "", "float", "Static quota of a group, in weighted slots.", _NONNEG),
    Knob("GROUP_QUOTA_DYNAMIC_<group>", "", "float", "Quota of a group as a fraction of its parent's.",
         between(0, 1)),
    Knob("GROUP_ACCEPT_SURPLUS", "False", "bool", "Groups may use surplus beyond their quota by default."),
    Knob("GROUP_ACCEPT_SURPLUS_<group>", "", "bool", "Whether this group may use surplus beyond its quota."),
    Knob("GROUP_AUTOREGROUP", "False", "bool", "Groups' jobs also negotiate as <none> after their quota, by default."),
    Knob("GROUP_AUTOREGROUP_<group>", "", "bool", "Whether this group's jobs also negotiate as <none>."),
    Knob("GROUP_PRIO_FACTOR_<group>", "", "float", "Priority factor of the group's submitters (0 or unset: none).",
         _NONNEG),
    Knob("GROUP_SORT_EXPR", _GROUP_SORT_EXPR, "expr", "Order of groups in negotiation (ascending; starvation first).",
         _deterministic),
    Knob("GROUP_QUOTA_MAX_ALLOCATION_ROUNDS", "3", "int", "Rounds of surplus allocation among groups.", at_least(1)),
    Knob("GROUP_QUOTA_ROUND_ROBIN_RATE", "", "float",
         "Slots by which each allocation round raises every group's limit at a time, so groups "
         "competing for the same slots share them; empty: the whole limit at once.", at_least(1)),
    Knob("HFS_MAX_ALLOCATION_ROUNDS", "", "int",
         "HTCondor's older spelling of GROUP_QUOTA_MAX_ALLOCATION_ROUNDS, read when that is unset.",
         at_least(1)),
    Knob("HFS_ROUND_ROBIN_RATE", "", "float",
         "HTCondor's older spelling of GROUP_QUOTA_ROUND_ROBIN_RATE, read when that is unset.",
         at_least(1)),
    Knob("NEGOTIATOR_ALLOW_QUOTA_OVERSUBSCRIPTION", "False", "bool",
         "False (seed 000's behaviour, our default): scale child quotas down to the parent's; "
         "True is current HTCondor's default."),
    Knob("NEGOTIATOR_STRICT_ENFORCE_QUOTA", "True", "bool", "Never let a group exceed its quota (unless surplus)."),
    Knob("NEGOTIATOR_USE_WEIGHTED_DEMAND", "True", "bool", "Measure group demand in weighted slots, not jobs."),
    # concurrency limits
    Knob("CONCURRENCY_LIMIT_DEFAULT", "2308032", "int", "Limit of a concurrency-limit name with no <NAME>_LIMIT.",
         _NONNEG),
    Knob("CONCURRENCY_LIMIT_DEFAULT_<set>", "", "int", "Default limit of names <set>.* (sub-limits).", _NONNEG),
    Knob("<name>_LIMIT", "", "float", "Maximum concurrent units of the concurrency limit <name>.", _NONNEG),
    # collector
    Knob("CLASSAD_LIFETIME", "900", "int", "Seconds after which an ad not refreshed expires.", _POS),
    Knob("ABSENT_REQUIREMENTS", "", "expr", "Expired machine ads for which this is true become absent.",
         _deterministic),
    Knob("ABSENT_EXPIRE_ADS_AFTER", "2592000", "int", "Seconds an absent ad is kept (0: forever).", _NONNEG),
    Knob("EXPIRE_INVALIDATED_ADS", "False", "bool", "Treat invalidated ads as expired (so they may become absent)."),
    Knob("UPDATE_INTERVAL", "300", "int", "Seconds between a startd's ad updates.", _POS),
    # negotiator
    Knob("NEGOTIATOR_INTERVAL", "60", "int", "Seconds between negotiation cycles.", _POS),
    Knob("NEGOTIATOR_CYCLE_DELAY", "20", "int", "Minimum seconds between the end of one cycle and the next.",
         _NONNEG),
    Knob("NEGOTIATOR_MIN_INTERVAL", "5", "int", "Minimum seconds between cycle starts.", _NONNEG),
    Knob("NEGOTIATOR_MAX_TIME_PER_SUBMITTER", "60", "int", "Seconds one submitter may negotiate per cycle.", _POS),
    Knob("NEGOTIATOR_MAX_TIME_PER_SCHEDD", "120", "int", "Seconds one schedd may negotiate per cycle.", _POS),
    Knob("NEGOTIATOR_MAX_TIME_PER_CYCLE", "1200", "int", "Seconds one negotiation cycle may last.", _POS),
    Knob("NEGOTIATOR_MAX_TIME_PER_PIESPIN", "120", "int", "Seconds one pie spin may last.", _POS),
    Knob("NEGOTIATOR_WORKERS", "2", "int",
         "Processes one cycle may use when a core is idle (PoolLedger's; same result either way).",
         _POS),
    Knob("PREEMPTION_REQUIREMENTS", "False", "expr", "Must be true for a priority preemption (slot MY, job TARGET)."),
    Knob("PREEMPTION_REQUIREMENTS_STABLE", "True", "bool", "PREEMPTION_REQUIREMENTS is constant within a cycle."),
    Knob("PREEMPTION_RANK", _PREEMPTION_RANK, "expr", "Prefers which claimed slot to preempt (higher first)."),
    Knob("PREEMPTION_RANK_STABLE", "True", "bool", "PREEMPTION_RANK is constant within a cycle."),
    Knob("NEGOTIATOR_PRE_JOB_RANK", _PRE_JOB_RANK, "expr", "Slot sort key applied before the job's Rank."),
    Knob("NEGOTIATOR_POST_JOB_RANK", _POST_JOB_RANK, "expr", "Slot sort key applied after the job's Rank."),
    Knob("NEGOTIATOR_CONSIDER_PREEMPTION", "True", "bool", "Consider claimed slots at all (False trims them)."),
    Knob("NEGOTIATOR_CONSIDER_EARLY_PREEMPTION", "False", "bool", "Match slots with retirement time remaining."),
    Knob("ALLOW_PSLOT_PREEMPTION", "False", "bool",
         "Preempt dynamic slots only together, through their partitionable slot (jobs with WantPslotPreemption)."),
    Knob("NEGOTIATE_ALL_JOBS_IN_CLUSTER", "False", "bool", "Keep trying a cluster's jobs after one fails to match."),
    Knob("SIGNIFICANT_ATTRIBUTES", "", "list", "Job attributes defining autoclusters; empty: computed."),
    Knob("NEGOTIATOR_SLOT_CONSTRAINT", "", "expr", "Only slots for which this is true (sharded negotiators)."),
    Knob("NEGOTIATOR_NAMES", "", "list",
         "Named negotiators sharing the pool, each with its own accounting (empty: one negotiator)."),
    Knob("NEGOTIATOR_SLOT_CONSTRAINT_<name>", "", "expr",
         "The slots negotiator <name> owns (NEGOTIATOR_SLOT_CONSTRAINT of that shard)."),
    Knob("NEGOTIATOR_JOB_CONSTRAINT", "", "expr", "Only jobs for which this is true."),
    Knob("NEGOTIATOR_RESOURCE_REQUEST_LIST_SIZE", "200", "int", "Resource requests fetched per schedd round trip.",
         at_least(1)),
    Knob("USE_GLOBAL_JOB_PRIOS", "False", "bool", "Order submitters of equal EUP by their best JobPrio."),
    # claims
    Knob("MATCH_TIMEOUT", "120", "int", "Seconds a matched slot waits to be claimed.", _POS),
    Knob("ALIVE_INTERVAL", "300", "int", "Seconds between a schedd's keep-alives to its claims.", _POS),
    Knob("MAX_CLAIM_ALIVES_MISSED", "6", "int", "Missed keep-alives after which a claim is dropped.", at_least(1)),
    # startd policy
    Knob("NUM_CPUS", "", "int", "Cores a startd advertises; empty: detected.", at_least(1)),
    Knob("NUM_SLOTS", "", "int", "Static slots of a startd; empty: one per core.", at_least(1)),
    Knob("SLOT_TYPE_<N>", "", "str", "Resources of slot type N (e.g. cpus=2, ram=128, swap=25%, disk=1/2)."),
    Knob("NUM_SLOTS_TYPE_<N>", "", "int", "How many slots of type N.", _NONNEG),
    Knob("SLOT_TYPE_<N>_PARTITIONABLE", "False", "bool", "Slots of type N are partitionable."),
    Knob("MACHINE_RESOURCE_NAMES", "", "list", "Custom machine resources (e.g. GPUs)."),
    Knob("MACHINE_RESOURCE_<name>", "", "str", "Quantity or list of IDs of the custom resource <name>."),
    Knob("STARTD_ATTRS", "", "list", "Extra configuration macros a startd publishes in its ad."),
    Knob("START", "True", "expr", "A slot may start the job (TARGET) when true."),
    Knob("RANK", "0", "expr", "The slot's preference for a job; a higher rank may preempt."),
    Knob("SUSPEND", "False", "expr", "Suspend the running job when true."),
    Knob("CONTINUE", "True", "expr", "Resume a suspended job when true."),
    Knob("PREEMPT", "False", "expr", "Preempt the running job when true."),
    Knob("KILL", "False", "expr", "Hard-kill a vacating job when true."),
    Knob("WANT_SUSPEND", "False", "expr", "Suspend rather than preempt when SUSPEND is true."),
    Knob("WANT_VACATE", "False", "expr", "Vacate gracefully rather than kill when preempting."),
    Knob("IS_OWNER", "False", "expr", "The slot is in the Owner state when true (seed 001: False, for "
         "dedicated machines; POLICY : Desktop sets (START =?= False))."),
    Knob("MAXJOBRETIREMENTTIME", "0", "expr", "Seconds a job may keep running after it is chosen for preemption."),
    Knob("MachineMaxVacateTime", "10 * $(MINUTE)", "expr", "Seconds a vacating job gets before it is killed."),
    Knob("CLAIM_WORKLIFE", "1200", "int", "Seconds a claim may start new jobs (-1: forever, 0: one job).",
         at_least(-1)),
    Knob("KILLING_TIMEOUT", "30", "int", "Seconds a killed job gets before its starter is hard-killed.", _NONNEG),
    Knob("POLLING_INTERVAL", "5", "int", "Seconds between a startd's policy evaluations while claimed.", _POS),
    Knob("DISCONNECTED_KEYBOARD_IDLE_BOOST", "1200", "int",
         "Seconds of KeyboardIdle a startd with no keyboard starts with.", _NONNEG),
    Knob("CONSUMPTION_POLICY", "False", "bool", "Partitionable slots size dynamic slots with CONSUMPTION_<res>."),
    Knob("SLOT_TYPE_<N>_CONSUMPTION_POLICY", "", "bool", "CONSUMPTION_POLICY of partitionable slots of type N."),
    # HTCondor's param_info.in defaults: a policy that leaves one out still consumes by these
    Knob("CONSUMPTION_CPUS", "quantize(target.RequestCpus, {1})", "expr",
         "Cpus a consumption-policy match takes (slot MY, job TARGET)."),
    Knob("CONSUMPTION_MEMORY", "quantize(target.RequestMemory, {128})", "expr",
         "Memory a consumption-policy match takes (slot MY, job TARGET)."),
    Knob("CONSUMPTION_DISK", "quantize(target.RequestDisk, {1024})", "expr",
         "Disk a consumption-policy match takes (slot MY, job TARGET)."),
    Knob("CONSUMPTION_<res>", "", "expr", "Custom resource <res> a consumption-policy match takes; "
         "empty: the job's Request<res>, 0 when it has none."),
    Knob("SLOT_TYPE_<N>_CONSUMPTION_<res>", "", "expr", "CONSUMPTION_<res> of slots of type N."),
    Knob("MODIFY_REQUEST_EXPR_REQUESTCPUS", "quantize(RequestCpus, {1})", "expr",
         "A dynamic slot's Cpus from the job's request."),
    Knob("MODIFY_REQUEST_EXPR_REQUESTMEMORY", "quantize(RequestMemory, {128})", "expr",
         "A dynamic slot's Memory from the job's request."),
    Knob("MODIFY_REQUEST_EXPR_REQUESTDISK", "quantize(RequestDisk, {1024})", "expr",
         "A dynamic slot's Disk from the job's request."),
    Knob("MEMORY", "", "int", "MiB of memory a startd advertises; empty: detected.", at_least(0)),
    Knob("DISK", "", "int", "KiB of disk a startd advertises; empty: detected.", at_least(0)),
    Knob("OPSYS", "LINUX", "str", "Operating system a startd advertises (detected by HTCondor; the "
         "simulated machines' default)."),
    Knob("ARCH", "X86_64", "str", "Architecture a startd advertises (detected by HTCondor; the "
         "simulated machines' default)."),
    Knob("FILESYSTEM_DOMAIN", "$(FULL_HOSTNAME)", "str", "Machines sharing files advertise the same domain."),
    # the default policy's helper macros (seed 001, HTCondor's built-in defaults)
    Knob("MINUTE", "60", "int", "Seconds in a minute, for policy expressions."),
    Knob("HOUR", "(60 * $(MINUTE))", "int", "Seconds in an hour, for policy expressions."),
    Knob("StateTimer", "(time() - EnteredCurrentState)", "expr", "Seconds in the slot's current state."),
    Knob("ActivityTimer", "(time() - EnteredCurrentActivity)", "expr", "Seconds in the current activity."),
    Knob("ActivationTimer", "(time() - JobStart)", "expr", "Seconds the current job has run."),
    Knob("NonCondorLoadAvg", "(LoadAvg - CondorLoadAvg)", "expr", "Load not caused by HTCondor jobs."),
    Knob("BackgroundLoad", "0.3", "float", "Load below which the CPU counts as idle."),
    Knob("HighLoad", "0.5", "float", "Load above which the CPU counts as busy."),
    Knob("StartIdleTime", "15 * $(MINUTE)", "int", "Idle seconds before a desktop starts jobs."),
    Knob("ContinueIdleTime", "5 * $(MINUTE)", "int", "Idle seconds before a suspended job continues."),
    Knob("MaxSuspendTime", "10 * $(MINUTE)", "int", "Seconds a job may stay suspended."),
    Knob("KeyboardBusy", "KeyboardIdle < $(MINUTE)", "expr", "The keyboard is in use."),
    Knob("ConsoleBusy", "(ConsoleIdle  < $(MINUTE))", "expr", "The console is in use."),
    Knob("CPUIdle", "$(NonCondorLoadAvg) <= $(BackgroundLoad)", "expr", "The CPU is idle."),
    Knob("CPUBusy", "$(NonCondorLoadAvg) >= $(HighLoad)", "expr", "The CPU is busy."),
    Knob("KeyboardNotBusy", "($(KeyboardBusy) == False)", "expr", "The keyboard is not in use."),
    Knob("MachineBusy", "($(CPUBusy) || $(KeyboardBusy))", "expr", "The CPU or the keyboard is busy."),
    # schedd
    Knob("SCHEDD_INTERVAL", "300", "int", "Seconds between a schedd's ad updates.", _POS),
    Knob("MAX_JOBS_RUNNING", "10000", "int", "Jobs a schedd runs at most at once.", _NONNEG),
    Knob("MAX_JOBS_PER_OWNER", "100000", "int", "Jobs one owner may have in a schedd's queue.", _NONNEG),
    Knob("STATISTICS_WINDOW_SECONDS", "1200", "int", "Window of a daemon's Recent* statistics.", _POS),
    # condor_defrag
    Knob("DEFRAG_INTERVAL", "600", "int", "Seconds between condor_defrag polls.", _POS),
    Knob("DEFRAG_UPDATE_INTERVAL", "300", "int", "Seconds between condor_defrag ad updates.", _POS),
    Knob("DEFRAG_DRAINING_MACHINES_PER_HOUR", "0", "float", "Machines to start draining per hour.", _NONNEG),
    Knob("DEFRAG_MAX_CONCURRENT_DRAINING", "-1", "int", "Most machines draining at once (-1: no limit).",
         at_least(-1)),
    Knob("DEFRAG_MAX_WHOLE_MACHINES", "-1", "int", "Stop draining at this many whole machines (-1: no limit).",
         at_least(-1)),
    Knob("DEFRAG_WHOLE_MACHINE_EXPR", "Cpus == TotalSlotCpus", "expr", "A machine counts as whole when true."),
    Knob("DEFRAG_RANK", "-ExpectedMachineGracefulDrainingBadput", "expr", "Which machines to drain first."),
    Knob("DEFRAG_DRAINING_SCHEDULE", "graceful", "str", "How to drain: graceful, quick or fast.",
         one_of("graceful", "quick", "fast")),
    Knob("DEFRAG_CANCEL_REQUIREMENTS", "$(DEFRAG_WHOLE_MACHINE_EXPR)", "expr", "Stop draining a machine when true."),
    Knob("DEFRAG_DRAINING_START_EXPR", "FALSE", "expr", "START expression of a draining machine."),
    Knob("DEFRAG_REQUIREMENTS", "", "expr", "Only machines for which this is true are drained."),
    Knob("DAEMON_LIST", "MASTER, COLLECTOR, NEGOTIATOR, STARTD, SCHEDD", "list",
         "The pool's daemons; DEFRAG in it runs condor_defrag."),
    # condor_schedd policy, backfill, per-type slot weights (the simulated pool)
    Knob("SUBMIT_REQUIREMENT_NAMES", "", "list", "Submit requirements, evaluated in this order."),
    Knob("SUBMIT_REQUIREMENT_<name>", "", "str",
         "A submit requirement's expression; its _REASON (a string expression) and _IS_WARNING."),
    Knob("JOB_TRANSFORM_NAMES", "", "list", "Job transforms, applied in this order at submission."),
    Knob("JOB_TRANSFORM_<name>", "", "str", "A job transform's rules (REQUIREMENTS, SET, EVALSET, ...)."),
    Knob("SCHEDD_CLASSAD_USER_MAP_NAMES", "", "list", "Map files the schedd's userMap() reads."),
    Knob("CLASSAD_USER_MAPFILE_<name>", "", "str", "The map file of userMap(\"<name>\", ...)."),
    Knob("SLOT_TYPE_<N>_SLOT_WEIGHT", "", "expr", "SLOT_WEIGHT of slots of type N."),
    Knob("ENABLE_BACKFILL", "False", "bool", "Idle slots may run backfill computations."),
    Knob("START_BACKFILL", "False", "expr", "An Unclaimed slot enters the Backfill state when true."),
    Knob("EVICT_BACKFILL", "False", "expr", "A slot leaves the Backfill state for Owner when true."),
    # condor_gangliad
    Knob("GANGLIAD_INTERVAL", "60", "int", "Seconds between metric publications.", _POS),
    Knob("GANGLIAD_VERBOSITY", "0", "int", "Metrics with a higher Verbosity are skipped.", _NONNEG),
    Knob("GANGLIAD_MIN_METRIC_LIFETIME", "86400", "int", "Lower bound of a metric's DMAX.", _NONNEG),
    Knob("GANGLIAD_METRICS_CONFIG_DIR", "", "path", "Directory of metric definition ads; empty: built in."),
    Knob("GANGLIAD_REQUIREMENTS", "", "expr", "Only ads for which this is true are measured."),
    Knob("GANGLIAD_PER_EXECUTE_NODE_METRICS", "True", "bool", "Publish per-execute-node metrics."),
    Knob("GANGLIA_SEND_DATA_FOR_ALL_HOSTS", "False", "bool", "Publish for hosts gmond does not yet know."),
    Knob("GANGLIAD_DEFAULT_CLUSTER", "", "str", "Ganglia cluster of metrics with no Cluster."),
    Knob("GANGLIAD_DEFAULT_MACHINE", "", "str", "Ganglia host of metrics with no Machine."),
    Knob("GANGLIAD_DEFAULT_IP", "", "str", "Ganglia IP of metrics with no IP."),
    Knob("GANGLIA_CONFIG", "/etc/ganglia/gmond.conf", "path", "gmond configuration telling where to send metrics."),
    Knob("POOLLEDGER_PROMETHEUS_LISTEN", "127.0.0.1:9718", "str", "host:port of the gangliad Prometheus exporter."),
    Knob("POOLLEDGER_GRAPHITE", "127.0.0.1:2003", "str", "host:port of carbon's plaintext receiver."),
    Knob("POOLLEDGER_GRAPHITE_PREFIX", "htcondor", "str", "First nodes of every Graphite path."),
    # the collector endpoint's backend (`poolledger collector`): heartbeats
    Knob("POOLLEDGER_COLLECTOR_VOLATILE_ATTRS",
         "LastHeardFrom, MyCurrentTime, UpdateSequenceNumber, *LoadAvg, KeyboardIdle, "
         "ConsoleIdle, ClockMin, ClockDay, MonitorSelf*, *DutyCycle, Recent*, TotalTime*, "
         "ExpectedMachine*Badput, ExpectedMachine*Completion, TimeToLive", "list",
         "Attributes (case-insensitive, * wildcards) whose change alone makes an update a "
         "heartbeat: it is not logged; a keep-alive (`ad.refreshed`) with the latest values "
         "is written before the ad would expire."),
    Knob("POOLLEDGER_COLLECTOR_CYCLES", "True", "bool",
         "The collector endpoint writes a `negotiation.cycle` for each cycle of a real "
         "negotiator its Negotiator and Accounting ads report (at the time its accountant "
         "updated), so htcondor accounting mode updates as the real one does. False when "
         "PoolLedger's own negotiator writes to the same log."),
    Knob("POOLLEDGER_COLLECTOR_REFRESH_MARGIN", "60", "float",
         "Seconds before an ad's expiry (its last logged update plus ClassAdLifetime) at which "
         "the heartbeats not logged since are written as a keep-alive.", _POS),
    # condor_adstash
    Knob("ADSTASH_SAMPLE_INTERVAL", "1200", "int", "Seconds between history polls.", _POS),
    Knob("ADSTASH_CHECKPOINT_FILE", "$(LOG)/adstash_checkpoint.json", "path", "Where adstash keeps its positions."),
    Knob("ADSTASH_SE_HOST", "localhost:9200", "str", "Elasticsearch host:port."),
    Knob("ADSTASH_SE_USE_HTTPS", "False", "bool", "Talk to Elasticsearch over HTTPS."),
    Knob("ADSTASH_SE_INDEX_NAME", "htcondor-000001", "str", "Elasticsearch index (or write alias) for job ads."),
    Knob("ADSTASH_SE_NUMBER_OF_SHARDS", "", "int", "Primary shards of the history index PoolLedger creates; empty: the engine's default (condor_adstash sets none).", at_least(1)),
    Knob("ADSTASH_SE_NUMBER_OF_REPLICAS", "", "int", "Replicas of the history index PoolLedger creates; empty: the engine's default (condor_adstash sets none).", at_least(0)),
    Knob("ADSTASH_SE_BUNCH_SIZE", "250", "int", "Documents per bulk request.", at_least(1)),
    Knob("ADSTASH_SCHEDD_HISTORY", "True", "bool", "Read schedd job history."),
    Knob("ADSTASH_STARTD_HISTORY", "False", "bool", "Read startd job history."),
    Knob("ADSTASH_READ_SCHEDDS", "*", "list", "Schedd names to read (* for all)."),
    Knob("ADSTASH_READ_STARTDS", "*", "list", "Startd names to read (* for all)."),
    Knob("ADSTASH_INTERFACE", "elasticsearch", "str", "Where adstash writes documents.",
         one_of("elasticsearch", "opensearch", "jsonfile")),
    Knob("ADSTASH_SE_USERNAME", "", "str", "User for the search engine's basic auth (empty: none)."),
    Knob("ADSTASH_SE_PASSWORD", "", "str", "Password for the search engine's basic auth (never printed)."),
    Knob("ADSTASH_SE_CA_CERTS", "", "str", "CA bundle for HTTPS to the search engine (empty: system)."),
    Knob("ADSTASH_SE_TIMEOUT", "60", "int", "Seconds a search engine request may take.", _POS),
    Knob("ADSTASH_JSON_DIR", "$(LOG)", "path", "Directory of the jsonfile interface's files."),
)


# --- lookup ----------------------------------------------------------------------------

_EXACT: dict[str, Knob] = {k.name.upper(): k for k in KNOBS if not k.is_pattern}


def _pattern_regex(name: str) -> re.Pattern[str]:
    parts = re.split(r"(<[^>]+>)", name)
    out = []
    for part in parts:
        if part == "<N>":
            out.append(r"(\d+)")
        elif part.startswith("<"):
            out.append(r"([A-Za-z0-9_.]+)")
        else:
            out.append(re.escape(part.upper()))
    return re.compile("".join(out) + r"\Z")


#: Families, most specific (longest literal text) first, so GROUP_QUOTA_DYNAMIC_x is not GROUP_QUOTA_<g>.
_PATTERNS: tuple[tuple[re.Pattern[str], Knob], ...] = tuple(sorted(
    ((_pattern_regex(k.name), k) for k in KNOBS if k.is_pattern),
    key=lambda pk: -len(re.sub(r"<[^>]+>", "", pk[1].name))))


_FAMILIES: dict[str, Knob] = {k.name.upper(): k for k in KNOBS if k.is_pattern}


def find_knob(name: str) -> Knob | None:
    """The declared knob or family a name belongs to (case-insensitive), or None."""
    upper = name.upper()
    knob = _EXACT.get(upper)
    if knob is not None:
        return knob
    for regex, pattern in _PATTERNS:
        if regex.match(upper):
            return pattern
    return None


def family_member(pattern: str, name: str) -> str | None:
    """The placeholder's value when `name` belongs to the family `pattern`, else None.

    E.g. family_member('GROUP_QUOTA_<group>', 'group_quota_physics') == 'physics'.
    Names are matched case-insensitively; the returned part keeps `name`'s casing. A declared
    knob is never a member: GROUP_QUOTA_ROUND_ROBIN_RATE is no group's quota.
    """
    knob = _FAMILIES.get(pattern.upper())
    if knob is None:
        raise KeyError(f"no knob family {pattern!r}")
    if find_knob(name) is not knob:
        return None
    m = _pattern_regex(knob.name).match(name.upper())
    if m is None:  # pragma: no cover - find_knob matched it
        return None
    start, end = m.span(1)
    return name[start:end]


def family_name(pattern: str, member: str) -> str:
    """The knob name of one family member: family_name('GROUP_QUOTA_<group>', 'g') == 'GROUP_QUOTA_g'."""
    return re.sub(r"<[^>]+>", lambda _: member, pattern, count=1)


def declared(include_patterns: bool = False) -> Iterable[Knob]:
    """Every declared knob in table order (families only when asked)."""
    return (k for k in KNOBS if include_patterns or not k.is_pattern)


def closest_knob(name: str) -> str | None:
    """The declared knob (or family, e.g. `GROUP_QUOTA_<group>`) a misspelled name most likely
    meant, for "did you mean" hints; None when nothing is close. difflib's ratio is enough:
    typos of a table this size are one or two letters."""
    upper = name.upper()
    exact = [k.name.upper() for k in KNOBS if not k.is_pattern]
    found = difflib.get_close_matches(upper, exact, n=1, cutoff=0.8)
    if found:
        return _EXACT[found[0]].name
    # a family member: compare the literal prefix of each family with the name's
    best: tuple[float, str] | None = None
    for k in KNOBS:
        if not k.is_pattern:
            continue
        literal = k.name.split("<", 1)[0].upper()
        if not literal:
            continue
        ratio = difflib.SequenceMatcher(None, upper[:len(literal)], literal).ratio()
        if ratio >= 0.8 and (best is None or ratio > best[0]):
            best = (ratio, k.name)
    return best[1] if best else None


def unknown_knob_message(name: str) -> str:
    """`unknown knob X` plus the closest declared name, for errors and warnings alike."""
    hint = closest_knob(name)
    return f"unknown knob {name}" + (f" (did you mean {hint}?)" if hint else "")
