"""CEDAR, HTCondor's wire format: packets, values, ClassAds, and the AES-GCM record layer.

Facts from HTCondor's `src/condor_io` (reli_sock.cpp, stream.cpp, condor_crypt_aesgcm.cpp,
src/condor_utils/classad_oldnew.cpp); REFERENCE.md "CEDAR" sums them up:
- a packet is a 1-byte end flag (1: the message's last packet), a 4-byte big-endian length and
  the body; a receiver refuses a length over 1 MB or <= 0;
- integers are 8-byte big-endian; a string is its bytes and a NUL (a lone 0xFF is the null
  string), and once a channel is encrypted each string is preceded by an 8-byte length that
  counts the NUL;
- a ClassAd is a count N, N strings `Name = <expression in old ClassAd syntax>` and two (empty)
  strings for MyType/TargetType; a string `ZKM` announces that the next one is private;
- AES-256-GCM: each direction's first encrypted packet starts with the sender's random 16-byte
  IV, packet k uses that IV with its first 4 bytes (big-endian) increased by k, the 16-byte tag
  follows the ciphertext, and the AAD is the packet header, prefixed for the first encrypted
  packet by the SHA-256 digests of the plaintext packets sent and received before.

Everything here is synchronous over bytes except `Channel`, which owns one TCP connection.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import struct
from typing import Iterable, Sequence

import classad2
import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from services.collector.port import CollectorError, RenderedAd

#: HTCondor's largest packet body (reli_sock.cpp, max_packet_size).
MAX_PACKET = 1024 * 1024
#: Plaintext per packet we send (16 KB less room for the IV and tag): the client library
#: reads big packets slowly (a 100,000-ad query took twice as long in 1 MB packets than in
#: 16 KB ones; 4 KB ones were no faster and cost four times the AES calls).
SEND_CHUNK = 16 * 1024 - 64
IV_SIZE = 16
TAG_SIZE = 16
#: A string that announces a private attribute ("it's a Zecret Klassad, Mon!").
SECRET_MARKER = b"ZKM"
#: Attributes HTCondor never shows to a reader without NEGOTIATOR rights
#: (ClassAdAttributeIsPrivateV1); any attribute sent after `ZKM` is private too.
PRIVATE_ATTRIBUTES = frozenset(a.lower() for a in (
    "Capability", "ChildClaimIds", "ClaimId", "ClaimIdList", "ClaimIds", "PairedClaimId",
    "TransferKey"))
_PRIVATE_BYTES = frozenset(a.encode() for a in PRIVATE_ATTRIBUTES)

_Q = struct.Struct(">q")
_HEADER = struct.Struct(">bI")


class ProtocolError(CollectorError):
    """The peer broke CEDAR; the message is the one line the server logs."""


def is_private(name: str) -> bool:
    """HTCondor's private attributes: the V1 list and the `_condor_priv` prefix (V2)."""
    lower = name.lower()
    return lower in PRIVATE_ATTRIBUTES or lower.startswith("_condor_priv")


# --- values ---------------------------------------------------------------------------------


class Writer:
    """A message being built: CEDAR values appended to a list of byte strings."""

    __slots__ = ("parts", "encrypted")

    def __init__(self, encrypted: bool) -> None:
        self.parts: list[bytes] = []
        self.encrypted = encrypted

    def integer(self, value: int) -> Writer:
        self.parts.append(_Q.pack(value))
        return self

    def string(self, text: str | bytes) -> Writer:
        data = text.encode() if isinstance(text, str) else text
        if self.encrypted:
            self.parts.append(_Q.pack(len(data) + 1))
        self.parts.append(data + b"\0")
        return self

    def ad(self, ad: classad2.ClassAd | RenderedAd, types: bool = True) -> Writer:
        """An ad in old syntax (its private attributes are the caller's business)."""
        lines = ad.lines if isinstance(ad, RenderedAd) else ad_lines(ad)
        self.integer(len(lines))
        if self.encrypted:
            self.parts.extend(_length_prefixed(lines))
        elif lines:
            self.parts.append(b"\0".join(lines) + b"\0")
        if types:
            self.string(b"").string(b"")
        return self

    def raw(self, data: bytes) -> Writer:
        """Bytes as put_bytes sends them (no length, no NUL)."""
        self.parts.append(data)
        return self

    def payload(self) -> bytes:
        return b"".join(self.parts)


def _length_prefixed(lines: Sequence[bytes]) -> Iterable[bytes]:
    pack = _Q.pack
    for line in lines:
        yield pack(len(line) + 1)
        yield line + b"\0"


def ad_lines(ad: classad2.ClassAd) -> list[bytes]:
    """`Name = expr` lines in old syntax: one printOld() call, split at newlines; a string
    holding a newline of its own makes the split disagree with the count, and then each
    attribute is printed alone."""
    text = ad.printOld().encode()
    lines = text.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    if len(lines) == len(ad):
        return lines
    out = []
    for name in ad.keys():
        one = classad2.ClassAd()
        one[name] = ad.lookup(name)
        out.append(one.printOld().encode().rstrip(b"\n"))
    return out


def encode_query_ads(ads: Sequence[classad2.ClassAd | RenderedAd], encrypted: bool) -> bytes:
    """`1, ad` for each ad: a block of a query reply, equal to `Writer.integer(1).ad(ad)` each.

    A query may return 200,000 ads: per-attribute Python work would dominate, so the ads' old
    syntax text is joined and framed in bulk (NULs for plain channels; on encrypted channels
    the 8-byte length before each string is inserted by numpy in one pass). An ad whose
    string values hold newlines goes through `Writer` alone."""
    out: list[bytes] = []
    texts: list[bytes] = []
    counts: list[int] = []
    for ad in ads:
        if isinstance(ad, RenderedAd):
            text = b"\n".join(ad.lines) + b"\n" if ad.lines else b""
        else:
            text = ad.printOld().encode()
        count = text.count(b"\n")
        if count == len(ad):
            texts.append(text)
            counts.append(count)
            continue
        if texts:
            out.append(_frame_texts(texts, counts, encrypted))
            texts, counts = [], []
        out.append(Writer(encrypted).integer(1).ad(ad).payload())
    if texts:
        out.append(_frame_texts(texts, counts, encrypted))
    return b"".join(out)


_ONE = _Q.pack(1)


def _frame_texts(texts: list[bytes], counts: list[int], encrypted: bool) -> bytes:
    if not encrypted:
        tail = b"\0\0"  # the two empty MyType/TargetType strings
        return b"".join(_ONE + _Q.pack(n) + t.replace(b"\n", b"\0") + tail for t, n in zip(texts, counts))
    # Each ad's text plus two empty lines (the MyType/TargetType strings); every line becomes
    # [8-byte length incl. NUL][line][NUL], and each ad is preceded by [1][attribute count].
    arr = np.frombuffer(b"\n\n".join(texts) + b"\n\n", np.uint8)
    ends = np.flatnonzero(arr == 10)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = (ends - starts + 1).astype(">i8")
    body = arr.copy()
    body[ends] = 0
    n = np.asarray(counts, np.int64)
    first = np.zeros(len(counts), np.int64)  # each ad's first line
    np.cumsum(n[:-1] + 2, out=first[1:])
    header = np.empty((len(counts), 2), ">i8")
    header[:, 0] = 1
    header[:, 1] = n
    at = np.repeat(first * 8, 16)
    values = np.insert(lengths.view(np.uint8), at, header.view(np.uint8).ravel())
    positions = np.insert(np.repeat(starts, 8), at, np.repeat(starts[first], 16))
    return bytes(np.insert(body, positions, values))


class Reader:
    """Reads CEDAR values from one received message."""

    __slots__ = ("data", "pos", "encrypted")

    def __init__(self, data: bytes, encrypted: bool) -> None:
        self.data = data
        self.pos = 0
        self.encrypted = encrypted

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def integer(self) -> int:
        end = self.pos + 8
        if end > len(self.data):
            raise ProtocolError("truncated message (an integer is cut short)")
        (value,) = _Q.unpack_from(self.data, self.pos)
        self.pos = end
        return int(value)

    def string(self) -> bytes | None:
        """The string's bytes without its NUL; None for HTCondor's null string."""
        data = self.data
        if self.encrypted:
            length = self.integer()
            if length < 0 or length > len(data) - self.pos:
                raise ProtocolError(f"truncated message (a string of {length} bytes is cut short)")
            raw = data[self.pos:self.pos + length]
            self.pos += length
            if raw[:1] == b"\xff":
                return None
            return raw[:-1] if raw.endswith(b"\0") else raw
        if self.pos >= len(data):
            raise ProtocolError("truncated message (a string is missing)")
        if data[self.pos] == 0xFF:
            self.pos += 1
            return None
        end = data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError("truncated message (a string has no terminating NUL)")
        raw = data[self.pos:end]
        self.pos = end + 1
        return raw

    def raw(self, count: int) -> bytes:
        """`count` bytes as put_bytes sends them (no length, no NUL)."""
        end = self.pos + count
        if count < 0 or end > len(self.data):
            raise ProtocolError(f"truncated message ({count} raw bytes cut short)")
        data = self.data[self.pos:end]
        self.pos = end
        return data

    def text(self) -> str:
        raw = self.string()
        return "" if raw is None else raw.decode("utf-8", "replace")

    def ad(self, max_attributes: int,
           types: bool = True) -> tuple[classad2.ClassAd, classad2.ClassAd | None]:
        """The ad and, apart, its private attributes (ZKM-marked or private by name)."""
        count = self.integer()
        if count < 0:
            raise ProtocolError(f"an ad announces a negative number of attributes ({count})")
        if count > max_attributes:
            raise ProtocolError(f"an ad with {count} attributes (more than {max_attributes})")
        lines, secret = self._lines(count)
        if types:
            self.string()
            self.string()
        names = [line.partition(b"=")[0].strip().lower() for line in lines]
        private = secret | {i for i, name in enumerate(names)
                            if name in _PRIVATE_BYTES or name.startswith(b"_condor_priv")}
        if not private:
            return parse_lines(lines, names), None
        public = [i for i in range(len(lines)) if i not in private]
        return (parse_lines([lines[i] for i in public], [names[i] for i in public]),
                parse_lines([lines[i] for i in sorted(private)], [names[i] for i in sorted(private)]))

    def _lines(self, count: int) -> tuple[list[bytes], set[int]]:
        """An ad's `count` strings (one loop with locals: this is the update path's hot spot)
        and the indexes of those a ZKM marked private."""
        data, pos, size = self.data, self.pos, len(self.data)
        lines: list[bytes] = []
        secret: set[int] = set()
        unpack = _Q.unpack_from
        find = data.find
        marked = False
        while len(lines) < count:
            if self.encrypted:
                if pos + 8 > size:
                    raise ProtocolError("truncated message (an integer is cut short)")
                (length,) = unpack(data, pos)
                pos += 8
                if length < 1 or pos + length > size:
                    raise ProtocolError(f"truncated message (a string of {length} bytes is cut short)")
                start, pos = pos, pos + length
                end = pos - 1 if data[pos - 1] == 0 else pos
            else:
                end = find(b"\0", pos)
                if end < 0:
                    raise ProtocolError("truncated message (a string has no terminating NUL)")
                start, pos = pos, end + 1
            if data[start:start + 1] == b"\xff":
                raise ProtocolError("an ad holds a null string")
            line = data[start:end]
            if not marked and line == SECRET_MARKER:
                marked = True
                continue
            if marked:
                secret.add(len(lines))
                marked = False
            lines.append(line)
        self.pos = pos
        return lines, secret

    def done(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.pos} unexpected bytes after the message's values")


def parse_lines(lines: list[bytes], names: list[bytes] | None = None) -> classad2.ClassAd:
    """An ad from `Name = expr` lines in old syntax (backslashes are literal there).

    One parse of the joined lines; classad2's old-syntax parser returns a short ad (or None)
    instead of raising, so the result is checked against the distinct names, and on a mismatch
    (a bad line, or a string holding a newline) each line is parsed alone to name the culprit."""
    if not lines:
        return classad2.ClassAd()
    for line in lines:
        if b"=" not in line:
            raise ProtocolError(f"an ad line is not `Name = expression`: {line[:60]!r}")
    if names is None:
        names = [line.partition(b"=")[0].strip().lower() for line in lines]
    ad = classad2.parseNext(b"\n".join(lines).decode("utf-8", "replace"), classad2.ParserType.Old)
    if ad is not None and len(ad) == len(set(names)):
        return ad
    ad = classad2.ClassAd()
    for line in lines:
        left, _, rhs = line.decode("utf-8", "replace").partition("=")
        attr = left.strip()
        one = classad2.parseNext(f"{attr} = {rhs}", classad2.ParserType.Old) if "\n" not in rhs else None
        if one is not None and len(one) == 1:
            ad.update(one)
            continue
        try:  # old syntax has only \" as an escape: double the other backslashes for the new parser
            ad[attr] = classad2.ExprTree(rhs.replace("\\", "\\\\").replace('\\\\"', '\\"'))
        except (classad2.ClassAdException, ValueError, SyntaxError):
            raise ProtocolError(f"attribute {attr[:60]} does not parse as old ClassAd syntax: "
                                f"{rhs.strip()[:60]!r}") from None
    return ad


# --- packets and the record layer ------------------------------------------------------------


class Channel:
    """One TCP connection: packet framing, the handshake digests and the AES-GCM layer.

    `timeout` bounds the arrival of a message once its first byte is in (a slow sender);
    the caller bounds the wait for a first byte (idle connections)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: float, max_message: int) -> None:
        self.reader = reader
        self.writer = writer
        self.timeout = timeout
        self.max_message = max_message
        self._sent_digest: hashlib._Hash | None = hashlib.sha256()
        self._recv_digest: hashlib._Hash | None = hashlib.sha256()
        self._sent_any = False
        self._recv_any = False
        self._final: tuple[bytes, bytes] | None = None  # (sent, received) plaintext digests
        self._aead: AESGCM | None = None
        self._enc_iv = b""
        self._enc_ctr = 0
        self._dec_iv = b""
        self._dec_ctr = 0
        self._pending = bytearray()
        # the handshake digests go into the AAD of a connection's first encrypted packet in
        # each direction only, even if a later DC_AUTHENTICATE re-keys it (reli_sock.cpp)
        self._sealed_any = False
        self._opened_any = False
        self._first_byte = b""

    @property
    def encrypted(self) -> bool:
        return self._aead is not None

    def enable_crypto(self, key: bytes) -> None:
        """AES-256-GCM from now on in both directions (a fresh stream state per connection)."""
        self._aead = AESGCM(key)
        self._enc_iv = os.urandom(IV_SIZE)
        self._enc_ctr = 0
        self._dec_ctr = 0

    def _digests(self) -> tuple[bytes, bytes]:
        """The handshake digests, fixed at the first encrypted packet in either direction."""
        if self._final is None:
            zero = bytes(32)
            sent = self._sent_digest.digest() if self._sent_any and self._sent_digest else zero
            recv = self._recv_digest.digest() if self._recv_any and self._recv_digest else zero
            self._final = (sent, recv)
            self._sent_digest = self._recv_digest = None
        return self._final

    @staticmethod
    def _iv(base: bytes, ctr: int) -> bytes:
        (first,) = struct.unpack_from(">i", base)
        bumped = (first + ctr + 2**31) % 2**32 - 2**31
        return struct.pack(">i", bumped) + base[4:]

    # -- sending

    def send_partial(self, data: bytes) -> int:
        """Queue part of a message: whole packets go out, the rest waits; returns what waits."""
        pending = self._pending
        pending += data
        if len(pending) >= SEND_CHUNK:
            out = []
            view = memoryview(pending)
            start = 0
            while len(pending) - start >= SEND_CHUNK:
                out.append(self._packet(bytes(view[start:start + SEND_CHUNK]), False))
                start += SEND_CHUNK
            view.release()
            del pending[:start]
            self.writer.write(b"".join(out))
        return len(pending)

    def send(self, payload: bytes) -> None:
        """Queue the (rest of the) message, its last packet flagged; `drain` sends it."""
        if self._pending:
            self.send_partial(payload)
            payload = bytes(self._pending)
            self._pending.clear()
        self.writer.write(self._packet(payload, True) if len(payload) <= SEND_CHUNK else self._split(payload))

    def _split(self, payload: bytes) -> bytes:
        view = memoryview(payload)
        out = []
        for start in range(0, len(payload), SEND_CHUNK):
            out.append(self._packet(bytes(view[start:start + SEND_CHUNK]),
                                    start + SEND_CHUNK >= len(payload)))
        return b"".join(out)

    def _packet(self, body: bytes, last: bool) -> bytes:
        end = 1 if last else 0
        aead = self._aead
        if aead is None:
            header = _HEADER.pack(end, len(body))
            if self._sent_digest is not None:
                self._sent_any = True
                self._sent_digest.update(header)
                self._sent_digest.update(body)
            return header + body
        first = self._enc_ctr == 0
        size = len(body) + TAG_SIZE + (IV_SIZE if first else 0)
        header = _HEADER.pack(end, size)
        if not self._sealed_any:
            self._sealed_any = True
            sent, recv = self._digests()
            aad = sent + recv + header
        else:
            aad = header
        sealed = aead.encrypt(self._iv(self._enc_iv, self._enc_ctr), body, aad)
        self._enc_ctr += 1
        return header + (self._enc_iv + sealed if first else sealed)

    async def drain(self) -> None:
        try:
            await asyncio.wait_for(self.writer.drain(), self.timeout)
        except asyncio.TimeoutError:
            raise ProtocolError(f"the peer read nothing for {self.timeout:g} s (slow receiver)") from None

    # -- receiving

    async def wait_message(self, idle: float | None) -> bool:
        """Wait up to `idle` seconds (None: forever) for the next message's first byte;
        False when the peer closed the connection cleanly."""
        try:
            self._first_byte = await asyncio.wait_for(self.reader.read(1), idle)
        except asyncio.TimeoutError:
            raise ProtocolError(f"no command for {idle:g} s (idle timeout)") from None
        return bool(self._first_byte)

    async def receive(self) -> bytes:
        """One whole message (its packets joined, decrypted); ProtocolError on any violation."""
        try:
            return await asyncio.wait_for(self._receive(), self.timeout)
        except asyncio.TimeoutError:
            raise ProtocolError(f"a message took over {self.timeout:g} s to arrive (slow sender)") from None
        except asyncio.IncompleteReadError as exc:
            raise ProtocolError(f"the connection closed mid-message (truncated message, "
                                f"{len(exc.partial)} of {exc.expected} bytes)") from None

    async def _receive(self) -> bytes:
        parts = []
        total = 0
        read = self.reader.readexactly
        while True:
            if self._first_byte:
                header = self._first_byte + await read(4)
                self._first_byte = b""
            else:
                header = await read(5)
            end, length = header[0], int.from_bytes(header[1:], "big", signed=True)
            if end > 10:
                raise ProtocolError(f"garbage: packet header {header.hex()} is not CEDAR")
            if length > MAX_PACKET:
                raise ProtocolError(f"a packet of {length} bytes (over the 1 MB limit)")
            if length <= 0:
                raise ProtocolError(f"a packet of length {length} (must be > 0)")
            total += length
            if total > self.max_message:
                raise ProtocolError(f"a message over {self.max_message} bytes")
            body = await read(length)
            parts.append(self._open(header, body))
            if end:
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _open(self, header: bytes, body: bytes) -> bytes:
        aead = self._aead
        if aead is None:
            if self._recv_digest is not None:
                self._recv_any = True
                self._recv_digest.update(header)
                self._recv_digest.update(body)
            return body
        if self._dec_ctr == 0:
            if len(body) < IV_SIZE + TAG_SIZE:
                raise ProtocolError("an encrypted packet too short for its IV and tag")
            self._dec_iv, body = body[:IV_SIZE], body[IV_SIZE:]
        elif len(body) < TAG_SIZE:
            raise ProtocolError("an encrypted packet too short for its tag")
        if not self._opened_any:
            self._opened_any = True
            sent, recv = self._digests()
            aad = recv + sent + header  # the peer's sent digest is our received one
        else:
            aad = header
        try:
            plain = aead.decrypt(self._iv(self._dec_iv, self._dec_ctr), body, aad)
        except InvalidTag:
            raise ProtocolError("bad GCM tag (the packet was not sealed with this session's key)") from None
        self._dec_ctr += 1
        return plain

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
