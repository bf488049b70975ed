"""IDTOKENS (HTCondor's TOKEN method): JWTs signed with a signing key such as the pool's.

Facts from HTCondor's `condor_auth_passwd.cpp` (the server side, "version 2" of the AKEP2-style
PASSWORD protocol) and `store_cred.cpp` (reading signing keys):
- a signing key file is XOR-scrambled with DE AD BE EF; the POOL key is used doubled (key+key);
  the JWT key is HKDF-SHA256(key, salt "htcondor", info "master jwt", 32 bytes) and tokens are
  HS256 JWTs (iss = TRUST_DOMAIN, sub = identity, kid = key name, iat, exp, jti, scope);
- the client sends `status, len(a), a, "<header>.<payload>", 256, ra` (never the signature); the
  server re-signs header.payload: a token signed with another key derives other keys;
- K and K' are HKDF-SHA256(signature, salt seed_ka|seed_kb + token, info "master ka"|"master kb"),
  32 bytes; the server answers `status, a, b, ra, rb, HMAC-SHA1(K, "a b\\0" ra rb)` and checks the
  client's `status, a, rb, HMAC-SHA1(K, a "\\0" rb)`; the identity is the token's subject, which
  must be the `a` the client claimed.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from schemas.config import SettingsLike
from services.admin import Identity
from services.collector.cedar import Channel, ProtocolError, Reader, Writer
from services.collector.port import CollectorError

KEY_LEN = 256  # AUTH_PW_KEY_LEN: the random challenges ra, rb
KEY_STRENGTH = 32  # AUTH_PW_KEY_STRENGTH: K, K' and the JWT key
A_OK, ERROR = 0, -1
SCRAMBLE = bytes.fromhex("deadbeef")
#: The server's name in the protocol (CONDOR_PASSWORD_FQU, peers since 23.9).
SERVER_LOGIN = "condor@password"

# setup_seed(): the fixed 256-byte seeds from which K and K' are derived (protocol constants)
SEED_KA = bytes.fromhex(
    "3e4a502047d5f4e5dc7c69bb5210cbb6167add8084f7dd9ef3ad2cca71d283dd114a4fbb7b1ee90adfa862c44304de54"
    "73a3172f735c2cbb6e775b5d40d39face873182523f9252b623be0d4b167a3a8040cacfee9ee3da02c0abbf4d9d8b11f"
    "89004c943923ce5d9508bb3f04bc66a3fa20a13a416c5e6f4e0d3187d45fc78335c5e485db2c5a3717970cc26e7b6b9d"
    "1965b47a67df77a31f22f08a6c0ba57097a21a9ca7c60424f72739ab5cb915a4185bd109828e35e42108ab851c08a3df"
    "fde0e3b06f3d3938cdad6df6ef9a6f6dc2cb74f0228512eb7a3d6823010684b015c12ac3014c4f9f938e384dad1e3bd7"
    "45ff8c141fd70b465ba8af5d1b98b4b1")
SEED_KB = bytes.fromhex(
    "010026ad75dfc6c190a5a266b0d1b5d860f7cfa38467205501cd460d4a88d473fa52e0b3e9141e33c97d851eee2dd336"
    "32f3886768ef010ec8dfdd668ade92d5c34308bb243895d84ed785e27268cc5ee7560de49828fab766c2ad8c0b2c0afb"
    "435c382db5d2ff36a8aead5820470a9ad45d79856f5e2ece894bd2507929dcf26f7d09f0028f1ac4d971f4820c5f5471"
    "7e9dcdabeb215f61655dead4b72c3d3b5f66fa4b30b85888d62facd4129c1304919f69ad6d8c2c43d9ce5cdb31d45803"
    "52c7362b8d80b7ef1bba5d676660a944764502f91d1d3c54910c088bccb72b11948a5e1a1dcd04369c17d298804c216e"
    "7a2690b8c0e970363300d092df24fb8c")


class TokenError(CollectorError):
    """A token that does not authenticate; the message says why in one line."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int = KEY_STRENGTH) -> bytes:
    return HKDF(hashes.SHA256(), length, salt=salt, info=info).derive(ikm)


def read_signing_key(path: str | Path, pool: bool) -> bytes:
    """A signing key as HTCondor uses it: unscrambled, and doubled for the POOL key."""
    raw = Path(path).read_bytes()
    key = bytes(b ^ SCRAMBLE[i % 4] for i, b in enumerate(raw))
    return key + key if pool else key


def write_signing_key(path: str | Path, secret: bytes) -> None:
    """Store a signing key scrambled, mode 0600, as condor_store_cred would."""
    target = Path(path)
    target.write_bytes(bytes(b ^ SCRAMBLE[i % 4] for i, b in enumerate(secret)))
    target.chmod(0o600)


def jwt_key(signing_key: bytes) -> bytes:
    return _hkdf(signing_key, b"htcondor", b"master jwt")


def create_token(signing_key: bytes, issuer: str, subject: str, *, key_id: str = "POOL",
                 lifetime: int | None = None, scopes: tuple[str, ...] = (),
                 now: float | None = None) -> str:
    """An IDTOKEN as `condor_token_create -identity subject` issues it (HS256, signed with the
    JWT key derived from `signing_key` as read by `read_signing_key`)."""
    issued = int(time.time() if now is None else now)
    header = {"alg": "HS256", "kid": key_id, "typ": "JWT"}
    payload: dict[str, Any] = {"iat": issued, "iss": issuer, "jti": os.urandom(16).hex(), "sub": subject}
    if lifetime is not None:
        payload["exp"] = issued + lifetime
    if scopes:
        payload["scope"] = " ".join(f"condor:/{s}" for s in scopes)
    text = f"{_b64url(json.dumps(header, separators=(',', ':')).encode())}." \
           f"{_b64url(json.dumps(payload, separators=(',', ':')).encode())}"
    signature = hmac.new(jwt_key(signing_key), text.encode(), hashlib.sha256).digest()
    return f"{text}.{_b64url(signature)}"


class TokenAuthenticator:
    """The server side of IDTOKENS, with the signing keys named by HTCondor's knobs."""

    def __init__(self, settings: SettingsLike) -> None:
        self.settings = settings
        self.pool_key_file = str(settings.get("SEC_TOKEN_POOL_SIGNING_KEY_FILE") or "")
        self.key_dir = str(settings.get("SEC_PASSWORD_DIRECTORY") or "")

    @property
    def available(self) -> bool:
        """Offer IDTOKENS only with a signing key to check tokens against (as HTCondor)."""
        return bool(self.pool_key_file) and os.access(self.pool_key_file, os.R_OK)

    def signing_key(self, key_id: str) -> bytes:
        if key_id == "POOL":
            path, pool = self.pool_key_file, True
        else:
            if not key_id or "/" in key_id or key_id.startswith(".") or not self.key_dir:
                raise TokenError(f"unknown signing key {key_id!r}")
            path, pool = os.path.join(self.key_dir, key_id), False
        try:
            return read_signing_key(path, pool)
        except OSError as exc:
            raise TokenError(f"signing key {key_id} unreadable ({exc.strerror})") from None

    def check(self, text: str) -> tuple[dict[str, Any], bytes]:
        """The claims of `header.payload` and the signature we compute for it."""
        try:
            head_b64, payload_b64 = text.split(".")
            header = json.loads(_unb64url(head_b64))
            claims = json.loads(_unb64url(payload_b64))
        except (ValueError, UnicodeDecodeError):
            raise TokenError("the token is not a JWT") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise TokenError("the token is not a JWT")
        if header.get("alg") not in ("HS256", "HS384", "HS512"):
            raise TokenError(f"token algorithm {header.get('alg')!r} is not HS256/384/512")
        key = jwt_key(self.signing_key(str(header.get("kid") or "")))
        exp = claims.get("exp")
        if isinstance(exp, (int, float)) and time.time() > exp:
            raise TokenError(f"the token of {claims.get('sub')} expired {int(time.time() - exp)} s ago")
        if not claims.get("iss"):
            raise TokenError("the token has no issuer")
        if not claims.get("jti"):
            raise TokenError("the token has no jti")
        if not claims.get("sub"):
            raise TokenError("the token has no subject")
        digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[header["alg"]]
        return claims, hmac.new(key, text.encode(), digest).digest()

    async def authenticate(self, channel: Channel) -> tuple[Identity | None, str, frozenset[str] | None]:
        """Run the server side; (identity, why not, authorization limits from the scopes)."""
        msg = Reader(await channel.receive(), channel.encrypted)
        client_status = msg.integer()
        msg.integer()  # len(a)
        claimed = msg.text()
        token = msg.text()
        ra_len = msg.integer()
        if not 0 <= ra_len <= KEY_LEN:
            raise ProtocolError(f"IDTOKENS: a challenge of {ra_len} bytes")
        ra = msg.raw(ra_len)
        msg.done()
        why = ""
        status = A_OK
        claims: dict[str, Any] = {}
        ka = b""
        if client_status != A_OK:
            status, why = ERROR, "the client reported an error (no usable token)"
        elif ra_len != KEY_LEN:
            status, why = ERROR, f"a challenge of {ra_len} bytes"
        else:
            try:
                claims, signature = self.check(token)
                salt_tail = token.encode()
                ka = _hkdf(signature, SEED_KA + salt_tail, b"master ka")
            except TokenError as exc:
                status, why = ERROR, str(exc)
        rb = os.urandom(KEY_LEN)
        out = Writer(channel.encrypted).integer(status)
        if status == A_OK:
            hkt = hmac.new(ka, f"{claimed} {SERVER_LOGIN}".encode() + b"\0" + ra + rb, hashlib.sha1).digest()
            out.integer(len(claimed)).string(claimed).integer(len(SERVER_LOGIN)).string(SERVER_LOGIN)
            out.integer(KEY_LEN).raw(ra).integer(KEY_LEN).raw(rb).integer(len(hkt)).raw(hkt)
        else:
            out.integer(0).string("").integer(0).string("").integer(0).integer(0).integer(0)
        channel.send(out.payload())
        await channel.drain()
        msg = Reader(await channel.receive(), channel.encrypted)
        client_status = msg.integer()
        msg.integer()
        a = msg.text()
        rb_len = msg.integer()
        if not 0 <= rb_len <= KEY_LEN:
            raise ProtocolError(f"IDTOKENS: a challenge of {rb_len} bytes")
        rb_back = msg.raw(rb_len)
        hk_len = msg.integer()
        if not 0 <= hk_len <= 64:
            raise ProtocolError(f"IDTOKENS: a MAC of {hk_len} bytes")
        hk = msg.raw(hk_len)
        msg.done()
        if status != A_OK:
            return None, why, None
        if client_status != A_OK:
            # the client could not check our MAC: its K differs, so its token's signature is not
            # the one our key gives (a foreign or forged token)
            return None, (f"the token for {claimed} is not signed with the key it names "
                          "(foreign or forged: the client rejected our proof)"), None
        expected = hmac.new(ka, a.encode() + b"\0" + rb, hashlib.sha1).digest()
        if a != claimed or rb_back != rb or not hmac.compare_digest(hk, expected):
            # the client believes it succeeded; HTCondor leaves it waiting, we drop it
            raise TokenError(f"IDTOKENS: the token for {claimed} is not signed with the key it "
                             "names (foreign or forged: MAC mismatch)")
        subject = str(claims["sub"])
        if subject != claimed:
            raise TokenError(f"IDTOKENS: the client claims {claimed} but its token names {subject}")
        user, _, domain = subject.rpartition("@") if "@" in subject else (subject, "", "")
        scopes = [s[len("condor:/"):] for s in str(claims.get("scope") or "").split()
                  if s.startswith("condor:/")]
        return Identity(user, domain, ""), "", frozenset(scopes) if scopes else None

