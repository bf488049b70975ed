"""The collector endpoint's security: policy, sessions, key exchange, authentication, authorization.

Facts from HTCondor's `condor_secman.cpp` (policy ads and their reconciliation, ECDH),
`daemon_command.cpp` (the server side of DC_AUTHENTICATE, new and resumed sessions),
`authentication.cpp` (method handshake), `condor_auth_fs.cpp` (FS), `condor_perms.cpp` and
IpVerify (authorization levels). The flow of a new session over TCP:
client `60010 + policy ad` -> server the reconciled ad -> [authentication: client method bitmask,
server's pick, the method's own messages, server `0` (the key comes from ECDH)] -> both derive
HKDF-SHA256(ECDH secret, "htcondor", "keygen") and turn AES-256-GCM on -> server the post-auth
ad (Sid, ReturnCode, User) -> the command's payload. A resumed session: client `60010 + {UseSession,
Sid, ResumeResponse}` -> server `{ReturnCode AUTHORIZED | SID_NOT_FOUND, Nonce}` -> AES with the
cached key.
"""
from __future__ import annotations

import base64
import ipaddress
import itertools
import logging
import os
import pwd
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import classad2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from schemas.config import SettingsLike
from services.admin import Identity, matches_entry
from services.collector import commands as cmds
from services.collector.cedar import Channel, Reader, Writer
from services.collector.port import CollectorError

log = logging.getLogger("poolledger.collector")

#: What this endpoint tells clients it is (clients gate features on the version).
CONDOR_VERSION = "$CondorVersion: 25.0.0 2025-01-01 BuildID: PoolLedger $"
#: getPODClassAd's bound on a security ad.
MAX_SECURITY_ATTRIBUTES = 100
UNAUTHENTICATED = Identity("unauthenticated", "unmapped", "")

# authentication method bits (condor_auth.h)
CAUTH_FILESYSTEM = 4
CAUTH_TOKEN = 2048
_METHOD_BITS = {"FS": CAUTH_FILESYSTEM, "IDTOKENS": CAUTH_TOKEN, "IDTOKEN": CAUTH_TOKEN,
                "TOKEN": CAUTH_TOKEN, "TOKENS": CAUTH_TOKEN}
_METHOD_NAMES = {CAUTH_FILESYSTEM: "FS", CAUTH_TOKEN: "IDTOKENS"}

# security requirements, ordered as HTCondor's sec_req
NEVER, OPTIONAL, PREFERRED, REQUIRED = 0, 1, 2, 3
_REQ_NAMES = {NEVER: "NEVER", OPTIONAL: "OPTIONAL", PREFERRED: "PREFERRED", REQUIRED: "REQUIRED"}

# authorization levels: where an unset knob falls back to, and what a level implies
_CONFIG_NEXT = {"ADVERTISE_STARTD": "DAEMON", "ADVERTISE_SCHEDD": "DAEMON",
                "ADVERTISE_MASTER": "DAEMON"}
_IMPLIED_NEXT = {"WRITE": "READ", "NEGOTIATOR": "READ", "ADMINISTRATOR": "WRITE", "CONFIG": "READ",
                 "DAEMON": "WRITE", "ADVERTISE_STARTD": "READ", "ADVERTISE_SCHEDD": "READ",
                 "ADVERTISE_MASTER": "READ"}
LEVELS = ("READ", "WRITE", "NEGOTIATOR", "ADMINISTRATOR", "CONFIG", "DAEMON", "ADVERTISE_STARTD",
          "ADVERTISE_SCHEDD", "ADVERTISE_MASTER")


class RefusedError(CollectorError):
    """The security layer refuses the peer; the message is the one line the server logs."""


def _req(text: str | None) -> int | None:
    if not text:
        return None
    return {"R": REQUIRED, "Y": REQUIRED, "T": REQUIRED, "P": PREFERRED, "O": OPTIONAL,
            "F": NEVER, "N": NEVER}.get(text.strip()[:1].upper())


def _config_chain(level: str) -> list[str]:
    chain = [level]
    while chain[-1] in _CONFIG_NEXT:
        chain.append(_CONFIG_NEXT[chain[-1]])
    if level != "DEFAULT":
        chain.append("DEFAULT")
    return chain


def _implied(level: str) -> list[str]:
    """The level and every level it implies (DAEMON: WRITE, READ)."""
    out = [level]
    while out[-1] in _IMPLIED_NEXT:
        out.append(_IMPLIED_NEXT[out[-1]])
    return out


def _text(ad: classad2.ClassAd, name: str) -> str | None:
    """A security ad's attribute as text; an expression (they hold literals only) is absent."""
    value = ad.get(name)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)) and not isinstance(value, classad2.Value):
        return str(value)
    return None


# --- policy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LevelPolicy:
    """Our side of a negotiation for one authorization level (FillInSecurityPolicyAd)."""

    authentication: int
    authentication_new: int
    encryption: int
    integrity: int
    negotiation: int
    methods: tuple[str, ...]
    duration: int
    lease: int


class Policy:
    """HTCondor's security knobs read through the settings object, per authorization level."""

    def __init__(self, settings: SettingsLike) -> None:
        self.settings = settings
        self._cache: dict[str, LevelPolicy] = {}

    def _setting(self, fmt: str, level: str) -> Any:
        return self._knob(fmt, level)[0]

    def _knob(self, fmt: str, level: str) -> tuple[Any, str]:
        """The value for `level` along HTCondor's chain, and the knob that set it."""
        for each in _config_chain(level):
            name = fmt.format(each)
            try:
                value = self.settings.get(name)
            except KeyError:
                value = None
            if value not in (None, "", ()):
                return value, name
        return None, fmt.format("DEFAULT")

    def level(self, level: str) -> LevelPolicy:
        cached = self._cache.get(level)
        if cached is not None:
            return cached
        get = self._setting
        auth = _req(get("SEC_{}_AUTHENTICATION", level)) or OPTIONAL
        enc = _req(get("SEC_{}_ENCRYPTION", level))
        enc = OPTIONAL if enc is None else enc
        integ = _req(get("SEC_{}_INTEGRITY", level))
        integ = OPTIONAL if integ is None else integ
        nego = _req(get("SEC_{}_NEGOTIATION", level))
        nego = PREFERRED if nego is None else nego
        auth_new = auth
        # ReconcileSecurityDependency: NEVER forbids what depends on it; else it rises to it
        for a, b in (("auth", "enc"), ("auth", "integ"), ("nego", "auth"), ("nego", "enc"),
                     ("nego", "integ")):
            va = {"auth": auth, "nego": nego}[a]
            vb = {"enc": enc, "integ": integ, "auth": auth}[b]
            if va == NEVER:
                if vb == REQUIRED:
                    raise CollectorError(f"SEC_{level}: {a} NEVER but {b} REQUIRED: no valid policy")
                vb = NEVER
            elif vb > va:
                va = vb
            if a == "auth":
                auth = va
            else:
                nego = va
            if b == "enc":
                enc = vb
            elif b == "integ":
                integ = vb
            else:
                auth = vb
        raw_methods = get("SEC_{}_AUTHENTICATION_METHODS", level) or ()
        if isinstance(raw_methods, str):
            raw_methods = tuple(m for m in raw_methods.replace(",", " ").split() if m)
        methods = tuple(m.upper() for m in raw_methods if m.upper() in _METHOD_BITS)
        if not methods:
            if auth_new == REQUIRED:
                knob = self._knob("SEC_{}_AUTHENTICATION", level)[1]
                methods_knob = self._knob("SEC_{}_AUTHENTICATION_METHODS", level)[1]
                raise CollectorError(f"{knob} is REQUIRED but {methods_knob} names no supported "
                                     "method (FS, IDTOKENS)")
            auth_new = NEVER
        policy = LevelPolicy(auth, auth_new, enc, integ, nego, methods,
                             int(get("SEC_{}_SESSION_DURATION", level) or 86400),
                             int(get("SEC_{}_SESSION_LEASE", level) or 0))
        self._cache[level] = policy
        return policy


def _reconcile(client: int | None, server: int) -> str:
    """ReconcileSecurityAttribute's table: YES, NO or FAIL (a missing client value is NEVER)."""
    c = NEVER if client is None else client
    if c == REQUIRED:
        return "FAIL" if server == NEVER else "YES"
    if c == PREFERRED:
        return "NO" if server == NEVER else "YES"
    if c == OPTIONAL:
        return "YES" if server in (REQUIRED, PREFERRED) else "NO"
    return "FAIL" if server == REQUIRED else "NO"


# --- authorization --------------------------------------------------------------------------


class Authorizer:
    """ALLOW_<level>/DENY_<level> with HTCondor's entry forms (`services.admin.matches_entry`:
    user@domain/host with * wildcards) plus IP networks (a.b.c.d/nn). An unset list falls back
    along HTCondor's configuration chain (ADVERTISE_* -> DAEMON -> DEFAULT); a holder of a level
    holds the levels it implies (DAEMON: WRITE, READ); a level whose chain sets no ALLOW list is
    open, as in HTCondor's IpVerify. A DENY entry wins."""

    def __init__(self, settings: SettingsLike) -> None:
        self.settings = settings

    def _list(self, kind: str, level: str) -> tuple[str, tuple[str, ...]] | None:
        """The knob that applies and its entries (None: unset along the chain)."""
        for each in _config_chain(level):
            name = f"{kind}_{each}"
            try:
                value = self.settings.get(name)
            except KeyError:
                value = None
            if value:
                entries = tuple(value.replace(",", " ").split()) if isinstance(value, str) else tuple(value)
                return name, entries
        return None

    @staticmethod
    def _matches(entry: str, who: Identity, addr: str) -> bool:
        if "@" not in entry and "/" in entry and all(c.isdigit() or c in "./:" for c in entry):
            try:  # a network, e.g. 192.168.0.0/24
                return ipaddress.ip_address(addr) in ipaddress.ip_network(entry, strict=False)
            except ValueError:
                return False
        if matches_entry(entry, Identity(who.user, who.domain, addr)):
            return True
        host = entry.rsplit("/", 1)[-1] if "/" in entry else ("*" if "@" in entry else entry)
        if host == "*" or not any(c.isalpha() for c in host):
            return False
        return any(matches_entry(entry, Identity(who.user, who.domain, name)) for name in _hostnames(addr))

    def check(self, level: str, who: Identity, addr: str) -> str | None:
        """None when `who` at `addr` holds `level`; else why not (one line)."""
        denied = self._list("DENY", level)
        if denied and any(self._matches(e, who, addr) for e in denied[1]):
            return f"{who.user}@{who.domain} from {addr} matches {denied[0]}"
        if self._list("ALLOW", level) is None:
            return None  # IpVerify: a level with no ALLOW list of its own is open (but for DENY)
        lists = [found for each in _implied_by(level) if (found := self._list("ALLOW", each))]
        if any(self._matches(e, who, addr) for _, entries in lists for e in entries):
            return None
        return f"{who.user}@{who.domain} from {addr} is not in ALLOW_{level}" + (
            f" ({lists[0][0]} applies)" if lists[0][0] != f"ALLOW_{level}" else "")


def _implied_by(level: str) -> list[str]:
    """The levels whose holders also hold `level` (itself first)."""
    return [level] + [other for other in LEVELS if other != level and level in _implied(other)]


_HOSTNAMES: dict[str, list[str]] = {}


def _hostnames(addr: str) -> list[str]:
    """The peer's names by reverse DNS (cached), for host entries given as names."""
    if addr not in _HOSTNAMES:
        try:
            name, aliases, _ = socket.gethostbyaddr(addr)
            _HOSTNAMES[addr] = [name, *aliases]
        except OSError:
            _HOSTNAMES[addr] = []
    return _HOSTNAMES[addr]


# --- sessions -----------------------------------------------------------------------------------


@dataclass
class Session:
    sid: str
    key: bytes | None
    identity: Identity | None
    method: str | None
    expires: float
    lease: int
    #: authorization levels a token's scopes limit the session to (None: no limit)
    limits: frozenset[str] | None = None
    #: the policy it was negotiated under: it serves only levels with this very policy
    policy: LevelPolicy | None = None
    last_used: float = field(default_factory=time.monotonic)

    @property
    def user(self) -> str | None:
        return None if self.identity is None else f"{self.identity.user}@{self.identity.domain}"


class SessionCache:
    """Incoming sessions by Sid, each with its expiry and lease (as HTCondor's KeyCache)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions: dict[str, Session] = {}
        self._clock = clock
        self._counter = itertools.count(1)

    def new_sid(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}:{int(time.time())}:{next(self._counter)}"

    def add(self, session: Session) -> None:
        self._sessions[session.sid] = session
        if len(self._sessions) % 1024 == 0:
            self.expire()

    def get(self, sid: str) -> Session | None:
        session = self._sessions.get(sid)
        if session is None:
            return None
        now = self._clock()
        if now > session.expires or (session.lease and now - session.last_used > session.lease):
            del self._sessions[sid]
            return None
        session.last_used = now
        return session

    def expire(self) -> None:
        for sid in list(self._sessions):
            self.get(sid)

    def __len__(self) -> int:
        return len(self._sessions)


# --- key exchange -----------------------------------------------------------------------------


class KeyExchange:
    """ECDH on P-256; public keys travel as base64 of the uncompressed point (i2d_PublicKey)."""

    def __init__(self) -> None:
        self._private = ec.generate_private_key(ec.SECP256R1())

    def public(self) -> str:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
        raw = self._private.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
        return base64.b64encode(raw).decode()

    def session_key(self, peer_b64: str) -> bytes:
        try:
            peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), base64.b64decode(peer_b64))
        except ValueError as exc:
            raise RefusedError(f"the client's ECDH public key is invalid ({exc})") from None
        secret = self._private.exchange(ec.ECDH(), peer)
        return HKDF(hashes.SHA256(), 32, salt=b"htcondor", info=b"keygen").derive(secret)


# --- the server side of DC_AUTHENTICATE ---------------------------------------------------------


@dataclass
class Negotiated:
    """What a DC_AUTHENTICATE established for the command that follows it."""

    #: the command authorized (for DC_SEC_QUERY and session-only requests: the one asked about)
    command: cmds.Command | None
    session: Session
    sec_query: bool = False
    #: DC_AUTHENTICATE as the real command: a session for later (UDP) commands, no payload
    session_only: bool = False


class SecurityManager:
    """One per server: the policy, the session cache, authorization and the methods."""

    def __init__(self, settings: SettingsLike, tokens: Any | None = None) -> None:
        self.settings = settings
        self.policy = Policy(settings)
        self.authorizer = Authorizer(settings)
        self.sessions = SessionCache()
        self.tokens = tokens
        self.uid_domain = str(settings.get("UID_DOMAIN") or socket.getfqdn())

    def validate(self) -> None:
        """Fail at start-up, naming the knobs, when a level's policy cannot work (e.g.
        authentication REQUIRED with no supported method), instead of at the first command."""
        for level in (*LEVELS, "ALLOW"):
            self.policy.level(level)

    # -- raw commands (no DC_AUTHENTICATE)

    def check_raw(self, level: str) -> str | None:
        """Why a raw (unnegotiated) command of `level` is refused, or None (VerifyCommand)."""
        policy = self.policy.level(level)
        if policy.negotiation == REQUIRED:
            return (f"an unnegotiated command needs SEC_{level}_NEGOTIATION below REQUIRED "
                    f"(encryption {_REQ_NAMES[policy.encryption]}, integrity "
                    f"{_REQ_NAMES[policy.integrity]}): SEC_CLIENT_NEGOTIATION = NEVER is refused")
        if policy.authentication_new == REQUIRED:
            return f"an unnegotiated command cannot authenticate (SEC_{level}_AUTHENTICATION is REQUIRED)"
        return None

    def covers(self, session: Session, level: str) -> str | None:
        """Why `session` may not carry a command of `level` (negotiated under another policy,
        e.g. without encryption for a level that requires it), or None."""
        if session.policy is not None and self.policy.level(level) != session.policy:
            return f"session {session.sid} was negotiated under another policy than {level}'s"
        return None

    def authorize(self, level: str, identity: Identity | None, addr: str,
                  limits: frozenset[str] | None = None) -> str | None:
        """None when the peer holds `level`; else why not. `limits`: a token's scopes."""
        if level == "ALLOW":
            return None
        if limits is not None and not any(level in _implied(limit) for limit in limits):
            return f"its token's scopes ({', '.join(sorted(limits))}) do not include {level}"
        return self.authorizer.check(level, identity or UNAUTHENTICATED, addr)

    # -- DC_AUTHENTICATE

    async def negotiate(self, channel: Channel, reader: Reader, addr: str,
                        local: tuple[str, int]) -> Negotiated:
        """Run the server side of DC_AUTHENTICATE whose message `reader` holds (after the
        command number); RefusedError or ProtocolError with the one line to log."""
        info, _ = reader.ad(MAX_SECURITY_ATTRIBUTES)
        reader.done()
        real = _int(info, "Command")
        auth_cmd = _int(info, "AuthCommand") if real in (cmds.DC_AUTHENTICATE, cmds.DC_SEC_QUERY) else real
        command = cmds.command(auth_cmd) if auth_cmd is not None else None
        if command is None and auth_cmd != cmds.DC_AUTHENTICATE:
            raise RefusedError(f"DC_AUTHENTICATE for an unregistered command ({auth_cmd})")
        level = command.level if command is not None else "ALLOW"
        if (_text(info, "UseSession") or "").upper().startswith("Y"):
            return await self._resume(channel, info, command, level, addr, real)
        return await self._new_session(channel, info, command, level, addr, local, real)

    async def _resume(self, channel: Channel, info: classad2.ClassAd, command: cmds.Command | None,
                      level: str, addr: str, real: int | None) -> Negotiated:
        sid = _text(info, "Sid")
        if not sid:
            raise RefusedError("DC_AUTHENTICATE resumes a session but names no Sid")
        want_response = (_text(info, "ResumeResponse") or "").lower() in ("true", "1")
        session = self.sessions.get(sid)
        if session is None:
            if want_response:
                channel.send(Writer(channel.encrypted).ad(_ad(ReturnCode="SID_NOT_FOUND")).payload())
                await channel.drain()
            raise RefusedError(f"resume of unknown or expired session {sid} (SID_NOT_FOUND sent)")
        if want_response:
            nonce = base64.b64encode(os.urandom(33)).decode()
            channel.send(Writer(channel.encrypted).ad(
                _ad(ReturnCode="AUTHORIZED", RemoteVersion=CONDOR_VERSION, Nonce=nonce)).payload())
            await channel.drain()
        if session.key is not None:
            channel.enable_crypto(session.key)
        why = self.covers(session, level) or self.authorize(level, session.identity, addr, session.limits)
        if why:
            raise RefusedError(f"permission denied for {_cmd_text(command)} in resumed session {sid}: {why}")
        return Negotiated(command, session, sec_query=real == cmds.DC_SEC_QUERY,
                          session_only=real == cmds.DC_AUTHENTICATE)

    async def _new_session(self, channel: Channel, info: classad2.ClassAd,
                           command: cmds.Command | None, level: str, addr: str,
                           local: tuple[str, int], real: int | None) -> Negotiated:
        try:
            ours = self.policy.level(level)
        except CollectorError as exc:
            raise RefusedError(f"our security policy is invalid: {exc}") from None
        client_auth = _req(_text(info, "AuthenticationNew") or _text(info, "Authentication"))
        authenticate = _reconcile(client_auth, ours.authentication_new)
        encrypt = _reconcile(_req(_text(info, "Encryption")), ours.encryption)
        integrity = _reconcile(_req(_text(info, "Integrity")), ours.integrity)
        failed = [name for name, act in (("authentication", authenticate), ("encryption", encrypt),
                                         ("integrity", integrity)) if act == "FAIL"]
        if failed:
            raise RefusedError(
                f"cannot reconcile security policy ({', '.join(failed)}): client "
                f"Authentication={_text(info, 'AuthenticationNew') or _text(info, 'Authentication')} "
                f"Encryption={_text(info, 'Encryption')} Integrity={_text(info, 'Integrity')}, ours "
                f"{_REQ_NAMES[ours.authentication_new]}/{_REQ_NAMES[ours.encryption]}/"
                f"{_REQ_NAMES[ours.integrity]} for {level}")
        auth_required = REQUIRED in (client_auth, ours.authentication_new)
        client_methods = [m.strip().upper() for m in (_text(info, "AuthMethods") or "").split(",") if m.strip()]
        methods = [m for m in ours.methods
                   if any(_METHOD_BITS.get(c) == _METHOD_BITS[m] for c in client_methods)
                   and (m == "FS" or getattr(self.tokens, "available", False))]
        crypto = [m.strip().upper() for m in (_text(info, "CryptoMethods") or "").split(",")]
        peer_ec = _text(info, "ECDHPublicKey")
        if (_text(info, "NewSession") or "").upper()[:1] != "Y":
            raise RefusedError("DC_AUTHENTICATE neither resumes nor asks for a new session")
        exchange: KeyExchange | None = None
        reply: dict[str, Any] = {"Authentication": authenticate, "Encryption": encrypt,
                                 "Integrity": integrity, "Enact": "YES"}
        if authenticate == "YES" and not auth_required:
            reply["AuthRequired"] = False
        if methods:
            reply["AuthMethodsList"] = ",".join(methods)
            reply["AuthMethods"] = methods[0]
        if peer_ec:
            if "AES" not in crypto:
                raise RefusedError(f"the client offers no AES-GCM (CryptoMethods {crypto})")
            exchange = KeyExchange()
            reply["ECDHPublicKey"] = exchange.public()
            reply["CryptoMethods"] = "AES"
            reply["CryptoMethodsList"] = "AES"
            # AES-GCM always encrypts and checks integrity once a key exists (sock.cpp)
            reply["Encryption"] = reply["Integrity"] = "YES"
        elif encrypt == "YES" or integrity == "YES" or authenticate == "YES":
            raise RefusedError("the client sent no ECDH public key, so no session key can be "
                               "made (needed for encryption/integrity)")
        client_duration = _int(info, "SessionDuration") or ours.duration
        duration = min(client_duration, ours.duration)
        reply["SessionDuration"] = str(duration)
        # the lease (longest unused time): the shorter of both, 0 meaning the other's; none
        # when the client names none (ReconcileSecurityPolicyAds)
        client_lease = _int(info, "SessionLease")
        lease = 0
        if client_lease is not None:
            lease = min(client_lease or ours.lease, ours.lease or client_lease)
            reply["SessionLease"] = lease
        reply["RemoteVersion"] = CONDOR_VERSION
        reply["TrustDomain"] = str(self.settings.get("TRUST_DOMAIN") or "")
        if (_text(info, "Enact") or "NO").upper().startswith("N"):
            channel.send(Writer(False).ad(_ad(**reply)).payload())
            await channel.drain()
        identity: Identity | None = None
        method: str | None = None
        limits: frozenset[str] | None = None
        tried = False
        if authenticate == "YES":
            tried = True
            identity, method, why, limits = await self._authenticate(channel, methods, local)
            if identity is None and auth_required:
                raise RefusedError(f"required authentication failed: {why}")
        key = exchange.session_key(peer_ec) if exchange is not None and peer_ec else None
        if key is not None:
            channel.enable_crypto(key)
        sid = self.sessions.new_sid()
        session = Session(sid, key, identity, method, time.monotonic() + duration + 20,
                          lease + 20 if lease else 0, limits, ours)
        why_denied = self.authorize(level, identity, addr, limits) if command is not None else None
        post = _ad(Sid=sid, ValidCommands=self._valid_commands(level), ReturnCode="DENIED" if why_denied else "AUTHORIZED")
        if identity is not None:
            post["User"] = f"{identity.user}@{identity.domain}"
        if tried:
            post["TriedAuthentication"] = True
        channel.send(Writer(channel.encrypted).ad(post).payload())
        await channel.drain()
        if why_denied:
            raise RefusedError(f"permission denied for {_cmd_text(command)}: {why_denied}")
        self.sessions.add(session)
        return Negotiated(command, session, sec_query=real == cmds.DC_SEC_QUERY,
                          session_only=real == cmds.DC_AUTHENTICATE)

    def _valid_commands(self, level: str) -> str:
        """The commands the client may send under a session made for `level`: those of every
        level with the very same policy (HTCondor lists one level's; one session for all keeps a
        restart down to one failed command per client). Each is still authorized per level."""
        ours = self.policy.level(level)
        return ",".join(str(c.number) for c in cmds.COMMANDS.values()
                        if self.policy.level(c.level) == ours)

    async def _authenticate(self, channel: Channel, methods: list[str], local: tuple[str, int]
                            ) -> tuple[Identity | None, str | None, str, frozenset[str] | None]:
        """The method handshake and the chosen methods until one succeeds or none is left."""
        failures: list[str] = []
        tried: set[int] = set()
        while True:
            msg = Reader(await channel.receive(), channel.encrypted)
            client_bits = msg.integer()
            msg.done()
            pick = 0
            for name in methods:
                bit = _METHOD_BITS[name]
                if client_bits & bit and bit not in tried:
                    pick = bit
                    break
            channel.send(Writer(channel.encrypted).integer(pick).payload())
            await channel.drain()
            if pick == 0:
                return None, None, "; ".join(failures) or "no common authentication method", None
            tried.add(pick)
            limits: frozenset[str] | None = None
            if pick == CAUTH_FILESYSTEM:
                who, why = await self._fs(channel, local)
            else:
                who, why, limits = await self._token(channel)
            if who is not None:
                # exchangeKey: 0, the session key comes from ECDH
                channel.send(Writer(channel.encrypted).integer(0).payload())
                await channel.drain()
                return who, _METHOD_NAMES[pick], "", limits
            failures.append(f"{_METHOD_NAMES[pick]}: {why}")

    async def _fs(self, channel: Channel, local: tuple[str, int]) -> tuple[Identity | None, str]:
        """FS: the client creates the directory we name; its owner is who the client is."""
        parent = str(self.settings.get("FS_LOCAL_DIR") or "/tmp").rstrip("/") or "/tmp"
        ip, port = local
        try:
            fd, path = tempfile.mkstemp(prefix=f"FS_{ip}_{port}_", dir=parent)
            os.close(fd)
            os.unlink(path)
            new_dir = path + "_"
        except OSError as exc:
            new_dir = ""
            log.warning("FS authentication: cannot make a name in FS_LOCAL_DIR %s: %s", parent, exc)
        channel.send(Writer(channel.encrypted).string(new_dir).payload())
        await channel.drain()
        msg = Reader(await channel.receive(), channel.encrypted)
        client_result = msg.integer()
        ext = msg.text() if msg.remaining else ""
        msg.done()
        who: Identity | None = None
        why = ""
        local_text = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        if ext and ("/" in ext or ext.split("?", 1)[0] != local_text):
            why = f"the client's view of our address ({ext!r}) is not {local_text}"
        elif client_result == -1 or not new_dir:
            why = f"the client could not create {new_dir or 'the directory'}"
        else:
            target = new_dir + ext
            try:
                st = os.lstat(target)
                if (st.st_nlink in (1, 2) and stat.S_ISDIR(st.st_mode)
                        and stat.S_IMODE(st.st_mode) == 0o700):
                    user = pwd.getpwuid(st.st_uid).pw_name
                    who = Identity(user, self.uid_domain, "")
                else:
                    why = f"bad attributes on {target}"
            except (OSError, KeyError) as exc:
                why = f"cannot check {target}: {exc}"
        channel.send(Writer(channel.encrypted).integer(0 if who else -1).payload())
        await channel.drain()
        return who, why

    async def _token(self, channel: Channel) -> tuple[Identity | None, str, frozenset[str] | None]:
        assert self.tokens is not None  # IDTOKENS is offered only with a token authenticator
        try:
            result: tuple[Identity | None, str, frozenset[str] | None] = \
                await self.tokens.authenticate(channel)
        except CollectorError as exc:
            raise RefusedError(str(exc)) from None
        return result


def _int(ad: classad2.ClassAd, name: str) -> int | None:
    text = _text(ad, name)
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


def _ad(**attrs: Any) -> classad2.ClassAd:
    ad = classad2.ClassAd()
    for name, value in attrs.items():
        ad[name] = value
    return ad


def _cmd_text(command: cmds.Command | None) -> str:
    return "DC_AUTHENTICATE" if command is None else f"{command.name} ({command.number})"
