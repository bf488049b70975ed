"""The port between the CEDAR wire and what a collector does with a command.

The server (framing, sessions, encryption, authentication, authorization) decodes a command
into one of these calls; the backend never sees bytes, and the server never sees the log.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import classad2


class CollectorError(Exception):
    """Root of the collector endpoint's errors."""


class CommandRefusedError(CollectorError):
    """The backend refuses a command; the server logs the reason in one line and drops it."""


@dataclass(frozen=True)
class Peer:
    """Who sent a command, as the security layer established it."""

    host: str
    port: int
    transport: str  # "tcp" or "udp"
    user: str | None  # the authenticated identity (e.g. "condor@pool"), None when unauthenticated
    method: str | None  # the authentication method that established `user` (FS, IDTOKENS, ...)
    encrypted: bool


@dataclass(frozen=True, slots=True)
class RenderedAd:
    """An ad a query answers with, already in the wire's old syntax: its `Name = expr` lines
    as `cedar.ad_lines` writes them. A backend answering 200,000 ads keeps these per ad
    rather than building 200,000 ClassAds per query (seconds at that size)."""

    lines: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.lines)

    def to_classad(self) -> classad2.ClassAd:
        """The ad as classad2 reads the wire (old syntax), for a reader in process."""
        return classad2.parseOne(b"\n".join(self.lines).decode(), classad2.ParserType.Old)


class CollectorBackend(Protocol):
    """What the collector does with each command family. `ad_type` is HTCondor's MyType
    ("Machine", "Scheduler", "Submitter", "DaemonMaster", "Negotiator", "Accounting",
    "Collector", "Generic", ...) resolved by the server from the command number."""

    def update(self, ad_type: str, ad: classad2.ClassAd, private: classad2.ClassAd | None,
               peer: Peer) -> None:
        """An UPDATE_*_AD: the public ad and, for startds, the private ad sent with it."""

    def invalidate(self, ad_type: str, query: classad2.ClassAd, peer: Peer) -> None:
        """An INVALIDATE_*_AD(S): `query` names the ads (Name / Requirements)."""

    def query(self, ad_type: str | None, query: classad2.ClassAd,
              peer: Peer) -> Iterable[classad2.ClassAd | RenderedAd]:
        """A QUERY_*_ADS (ad_type set) or QUERY_MULTIPLE_ADS (None: the types are in the
        query ad's TargetType, with per-type <Type>Requirements / <Type>Projection); each
        answer a ClassAd, or the same ad already rendered for the wire."""

    def priorities(self, peer: Peer) -> classad2.ClassAd:
        """GET_PRIORITY: one ad of numbered attributes (Name1, Priority1, ...), as the
        negotiator answers condor_userprio."""
