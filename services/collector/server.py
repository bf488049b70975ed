"""The collector endpoint's asyncio server: TCP connections and UDP datagrams in CEDAR.

A TCP connection carries commands one after another (a forwarding collector and
`Collector.advertise` keep it open): the first usually a DC_AUTHENTICATE that negotiates or
resumes a session, the next ones raw `[command][ad]` messages under that session. Each refused
input is ONE log line naming the peer and the reason; the connection is dropped, nothing reaches
the backend, and the server keeps serving the others. UDP datagrams carry raw commands only,
where the policy lets unnegotiated commands in: HTCondor secures UDP with a Blowfish copy of a
session's key, which this endpoint does not offer (sessions are AES-GCM only, and the client then
says "AES not supported for UDP"): senders set UPDATE_COLLECTOR_WITH_TCP /
UPDATE_VIEW_COLLECTOR_WITH_TCP = True.

Use: `server = CollectorServer(settings, backend); await server.start(); server.port;
await server.serve_forever()` (or `await server.close()`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import classad2

from schemas.config import SettingsLike
from services.collector import commands as cmds
from services.collector.cedar import Channel, ProtocolError, Reader, Writer, encode_query_ads
from services.collector.port import (CollectorBackend, CollectorError, CommandRefusedError, Peer,
                                     RenderedAd)
from services.collector.security import RefusedError, SecurityManager, Session
from services.collector.tokens import TokenAuthenticator

log = logging.getLogger("poolledger.collector")

_SAFE_MSG_MAGIC = b"MaGic6.0"
_SAFE_CRYPTO_TAG = b"CRAP"


class CollectorServer:
    """CEDAR in front of a `CollectorBackend` (see the module docstring for the lifecycle).

    The constructor raises CollectorError naming the knobs when the security policy cannot
    work; `start()` raises OSError when the address is taken."""

    def __init__(self, settings: SettingsLike, backend: CollectorBackend, *, host: str | None = None,
                 port: int | None = None) -> None:
        self.settings = settings
        self.backend = backend
        self.host = host if host is not None else str(settings.get("POOLLEDGER_COLLECTOR_ADDRESS"))
        self._want_port = port if port is not None else int(settings.get("POOLLEDGER_COLLECTOR_PORT"))
        self.max_connections = int(settings.get("POOLLEDGER_COLLECTOR_MAX_CONNECTIONS"))
        self.timeout = float(settings.get("POOLLEDGER_COLLECTOR_TIMEOUT"))
        self.idle_timeout = float(settings.get("POOLLEDGER_COLLECTOR_IDLE_TIMEOUT"))
        self.max_attributes = int(settings.get("POOLLEDGER_COLLECTOR_MAX_AD_ATTRIBUTES"))
        self.max_message = int(settings.get("POOLLEDGER_COLLECTOR_MAX_MESSAGE_BYTES"))
        self.security = SecurityManager(settings, TokenAuthenticator(settings))
        self.security.validate()
        self._server: asyncio.base_events.Server | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    # -- lifecycle

    async def start(self) -> None:
        """Bind TCP and UDP on the configured address and port (port 0: a free one)."""
        self._server = await asyncio.start_server(self._accept, self.host, self._want_port,
                                                  limit=2 ** 20, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        try:
            self._udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(self.host, self.port))
        except OSError as exc:
            log.warning("collector endpoint: no UDP on %s:%d (%s); TCP only", self.host, self.port, exc)
        log.info("collector endpoint listening on %s:%d (TCP%s)", self.host, self.port,
                 " and UDP" if self._udp else "")

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # -- TCP

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername") or ("?", 0)
        addr, port = str(peername[0]), int(peername[1])
        if len(self._connections) >= self.max_connections:
            log.warning("refused %s:%d: over POOLLEDGER_COLLECTOR_MAX_CONNECTIONS (%d connections open)",
                        addr, port, len(self._connections))
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        sockname = writer.get_extra_info("sockname") or ("", 0)
        channel = Channel(reader, writer, self.timeout, self.max_message)
        try:
            await self._serve_connection(channel, addr, port, (str(sockname[0]), int(sockname[1])))
        except (ProtocolError, RefusedError, CommandRefusedError) as exc:
            log.warning("refused %s:%d: %s", addr, port, exc)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.warning("refused %s:%d: connection lost mid-command (%s)", addr, port,
                        exc.__class__.__name__)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - one line, the server keeps serving the others
            log.error("refused %s:%d: internal error %s: %s", addr, port, exc.__class__.__name__, exc)
        finally:
            self._connections.discard(task)
            channel.close()

    async def _serve_connection(self, channel: Channel, addr: str, port: int,
                                local: tuple[str, int]) -> None:
        session: Session | None = None
        idle = self.timeout
        while await channel.wait_message(idle):
            reader = Reader(await channel.receive(), channel.encrypted)
            number = reader.integer()
            payload: Reader | None
            if number == cmds.DC_AUTHENTICATE:
                negotiated = await self.security.negotiate(channel, reader, addr, local)
                session = negotiated.session
                command = negotiated.command
                if negotiated.sec_query:
                    channel.send(Writer(channel.encrypted).ad(_ad(AuthorizationSucceeded=True)).payload())
                    await channel.drain()
                    return
                if command is None or negotiated.session_only:  # a session for later commands
                    idle = self.idle_timeout
                    continue
                payload = Reader(await channel.receive(), channel.encrypted) if command.payload else None
            else:
                command = cmds.command(number)
                if command is None:
                    raise ProtocolError(f"garbage or unknown command {number} "
                                        f"(first bytes {reader.data[:8].hex()})")
                why = self.security.check_raw(command.level) if session is None else \
                    self.security.covers(session, command.level)
                if why:
                    raise RefusedError(f"{command.name}: {why}")
                why = self.security.authorize(command.level, session.identity if session else None,
                                              addr, session.limits if session else None)
                if why:
                    raise RefusedError(f"permission denied for {command.name} ({command.number}): {why}")
                payload = reader
            peer = Peer(addr, port, "tcp", session.user if session else None,
                        session.method if session else None, channel.encrypted)
            reply = self._execute(command, payload, peer)
            if reply is not None:
                await reply.send(channel)
            idle = self.idle_timeout

    # -- commands

    def _execute(self, command: cmds.Command, payload: Reader | None,
                 peer: Peer) -> _Reply | _Ack | None:
        """Decode the payload, call the backend; the reply to send, if the command has one."""
        family = command.family
        if family == "nop":
            if payload is not None and payload.remaining:
                payload.done()
            return None
        if family == "priority":
            if payload is not None:
                payload.done()
            return _Reply([self.backend.priorities(peer)], types=False, stream=False)
        if payload is None:
            raise ProtocolError(f"{command.name} without its ad")
        ad, private = payload.ad(self.max_attributes)
        if family == "update":
            if payload.remaining:  # a forwarded startd update: the private ad follows the public one
                more, secret = payload.ad(self.max_attributes)
                if secret is not None:
                    more.update(secret)
                if private is not None:
                    more.update(private)
                private = more
            payload.done()
            assert command.ad_type is not None
            self.backend.update(command.ad_type, ad, private, peer)
            return _Ack() if command.ack and peer.transport == "tcp" else None
        payload.done()
        if private is not None:
            ad.update(private)
        if family == "invalidate":
            assert command.ad_type is not None
            self.backend.invalidate(command.ad_type, ad, peer)
            return None
        if peer.transport == "udp":
            raise ProtocolError(f"{command.name} over UDP (a query needs TCP for its reply)")
        results = self.backend.query(command.ad_type if family == "query" else None, ad, peer)
        return _Reply(results, types=True, stream=True)

    # -- UDP

    def datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        host, port = str(addr[0]), int(addr[1])
        try:
            if data.startswith(_SAFE_MSG_MAGIC):
                raise ProtocolError("a fragmented UDP message (send it over TCP: "
                                    "UPDATE_COLLECTOR_WITH_TCP = True)")
            if data.startswith(_SAFE_CRYPTO_TAG):
                raise RefusedError("an encrypted or signed UDP message (UDP sessions use a Blowfish "
                                   "key this endpoint does not make; use TCP)")
            reader = Reader(data, False)
            number = reader.integer()
            if number == cmds.DC_AUTHENTICATE:
                raise RefusedError("DC_AUTHENTICATE over UDP (a session resumed over UDP; use TCP: "
                                   "UPDATE_COLLECTOR_WITH_TCP = True)")
            command = cmds.command(number)
            if command is None:
                raise ProtocolError(f"garbage or unknown command {number} (first bytes {data[:8].hex()})")
            why = self.security.check_raw(command.level) or \
                self.security.authorize(command.level, None, host)
            if why:
                raise RefusedError(f"{command.name} over UDP: {why}")
            self._execute(command, reader, Peer(host, port, "udp", None, None, False))
        except (ProtocolError, RefusedError, CommandRefusedError) as exc:
            log.warning("refused %s:%d (UDP): %s", host, port, exc)
        except Exception as exc:  # noqa: BLE001 - one line, the server keeps serving
            log.error("refused %s:%d (UDP): internal error %s: %s", host, port,
                      exc.__class__.__name__, exc)


class _Reply:
    """A reply to send: GET_PRIORITY's one ad, or a query's `1, ad, ..., 0` streamed in packets."""

    def __init__(self, ads: Any, types: bool, stream: bool) -> None:
        self.ads = ads
        self.types = types
        self.stream = stream

    async def send(self, channel: Channel) -> None:
        encrypted = channel.encrypted
        if not self.stream:
            writer = Writer(encrypted)
            for ad in self.ads:
                writer.ad(ad, types=self.types)
            channel.send(writer.payload())
            await channel.drain()
            return
        batch: list[classad2.ClassAd | RenderedAd] = []
        for ad in self.ads:
            if not isinstance(ad, (classad2.ClassAd, RenderedAd)):
                raise CollectorError(f"the backend answered a query with {type(ad).__name__}, not a ClassAd")
            batch.append(ad)
            if len(batch) == _BATCH:
                channel.send_partial(encode_query_ads(batch, encrypted))
                batch.clear()
                await channel.drain()
        channel.send((encode_query_ads(batch, encrypted) if batch else b"") + _Q0)
        await channel.drain()


#: ads framed at once in a query reply (about 1 MB of a typical slot ad's text)
_BATCH = 512
_Q0 = Writer(False).integer(0).payload()


class _Ack:
    """UPDATE_STARTD_AD_WITH_ACK's answer: the integer 1, a message of its own."""

    async def send(self, channel: Channel) -> None:
        channel.send(Writer(channel.encrypted).integer(1).payload())
        await channel.drain()


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, server: CollectorServer) -> None:
        self.server = server

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.server.datagram(data, addr)


def _ad(**attrs: Any) -> classad2.ClassAd:
    ad = classad2.ClassAd()
    for name, value in attrs.items():
        ad[name] = value
    return ad


__all__ = ["CollectorServer"]
