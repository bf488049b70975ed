"""Ganglia publisher: gmetric packets (XDR metadata + value) over UDP to gmond, as
condor_gangliad's libganglia path sends them, and gmond's XML dump read back.

Why our own encoder: PyPI has no maintained gmetric sender (DESIGN.md), the Ganglia 3.1+ wire
format is two small XDR records, and spawning the `gmetric` tool per metric would cost a
process per value (gangliad itself prefers the library for the same reason). `xdrlib` left
the standard library in 3.13, so the few XDR primitives are written out here.

Each metric is "spoofed" onto its daemon's host (`IP:hostname`, hostname sanitized the way
gangliad does), so gmond shows one host per daemon machine and the aggregates under the
collector's host.
"""
from __future__ import annotations

import re
import socket
import struct
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ganglia.errors import GangliaError, PublisherUnavailableError
from ganglia.metrics import Metric

__all__ = ["GmondPublisher", "metadata_packet", "value_packet", "spoof_host", "read_gmond",
           "gmond_channels", "GmondHost"]

_METADATA_FULL = 128  # gmetadata_full
_VALUE_STRING = 133   # gmetric_string
SLOPE_BOTH = 3
SLOPE_DERIVATIVE = 5
_XML_SPECIALS = str.maketrans({"<": "(", ">": ")", "&": "+", '"': "'"})


def _u32(n: int) -> bytes:
    return struct.pack(">I", n & 0xFFFFFFFF)


def _string(text: str) -> bytes:
    # gmond writes names and extras into its XML unescaped: one '<' would make the whole dump
    # unreadable for every reader, so the XML specials never leave here
    data = text.translate(_XML_SPECIALS).encode("utf-8", "replace")
    return _u32(len(data)) + data + b"\0" * (-len(data) % 4)


def spoof_host(metric: Metric) -> str:
    """`IP:host` naming the host gmond files the metric under ('' when there is no machine);
    characters other than letters, digits, '-' and '_' become '.' as gangliad sanitizes them."""
    if not metric.machine:
        return ""
    host = re.sub(r"[^A-Za-z0-9_-]", ".", metric.machine)
    return f"{metric.ip or metric.machine}:{host}"


def metadata_packet(metric: Metric, spoof: str) -> bytes:
    """The metadata record: type, units, slope, TMAX/DMAX and the GROUP/TITLE/DESC/CLUSTER
    extras gmond keeps with the metric."""
    extras = [("GROUP", metric.group), ("TITLE", metric.title), ("DESC", metric.desc)]
    if metric.cluster:
        extras.append(("CLUSTER", metric.cluster))
    if spoof:
        extras.append(("SPOOF_HOST", spoof))
    slope = SLOPE_DERIVATIVE if metric.derivative else SLOPE_BOTH
    out = [_u32(_METADATA_FULL), _string(spoof or "localhost"), _string(metric.name),
           _u32(1 if spoof else 0), _string(metric.type), _string(metric.name),
           _string(metric.units), _u32(slope), _u32(metric.tmax), _u32(metric.dmax),
           _u32(len(extras))]
    for key, value in extras:
        out += [_string(key), _string(value)]
    return b"".join(out)


def value_packet(metric: Metric, spoof: str) -> bytes:
    """The value record (sent as text with format "%s", as gmetric does for every type)."""
    return b"".join([_u32(_VALUE_STRING), _string(spoof or "localhost"), _string(metric.name),
                     _u32(1 if spoof else 0), _string("%s"), _string(metric.text)])


def gmond_channels(config: str | Path) -> tuple[tuple[str, int], tuple[str, int] | None]:
    """(udp_send_channel host, port) and (tcp_accept_channel host, port) of a gmond.conf —
    GANGLIA_CONFIG tells gangliad where to send, as it tells gmetric."""
    try:
        text = Path(config).read_text()
    except OSError as exc:
        raise GangliaError(f"GANGLIA_CONFIG {str(config)!r}: cannot read: {exc.strerror}") from None
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"(#|//)[^\n]*", "", text)

    def section(name: str) -> dict[str, str] | None:
        m = re.search(name + r"\s*\{([^}]*)\}", text)
        if m is None:
            return None
        return {k.lower(): v.strip('"') for k, v in re.findall(r"(\w+)\s*=\s*(\"[^\"]*\"|\S+)", m.group(1))}

    send = section("udp_send_channel")
    if send is None or "port" not in send:
        raise GangliaError(f"GANGLIA_CONFIG {str(config)!r}: no udp_send_channel with a port")
    tcp = section("tcp_accept_channel")
    try:
        target = (send.get("host") or send.get("mcast_join") or "127.0.0.1", int(send["port"]))
        xml_at = (tcp.get("bind") or "127.0.0.1", int(tcp["port"])) if tcp and "port" in tcp else None
    except ValueError:
        raise GangliaError(f"GANGLIA_CONFIG {str(config)!r}: a port is not a number") from None
    return target, xml_at


@dataclass(frozen=True, slots=True)
class GmondHost:
    """One host of gmond's XML: its IP and metrics (name -> attributes incl. VAL, extras)."""

    name: str
    ip: str
    metrics: dict[str, dict[str, str]]


def read_gmond(host: str, port: int, timeout: float = 5.0) -> dict[str, GmondHost]:
    """gmond's XML dump (its tcp_accept_channel), by host name."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            chunks = []
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    break
                chunks.append(data)
    except OSError as exc:
        raise PublisherUnavailableError(f"gmond at {host}:{port}: {exc}") from None
    try:
        root = ET.fromstring(b"".join(chunks))
    except ET.ParseError as exc:
        raise GangliaError(f"gmond at {host}:{port}: unreadable XML: {exc}") from None
    out: dict[str, GmondHost] = {}
    for h in root.iter("HOST"):
        metrics: dict[str, dict[str, str]] = {}
        for m in h.iter("METRIC"):
            attrs = dict(m.attrib)
            for e in m.iter("EXTRA_ELEMENT"):
                attrs[e.get("NAME", "")] = e.get("VAL", "")
            metrics[attrs.get("NAME", "")] = attrs
        name = h.get("NAME", "")
        out[name] = GmondHost(name, h.get("IP", ""), metrics)
    return out


class GmondPublisher:
    """Sends metrics to gmond; with GANGLIA_SEND_DATA_FOR_ALL_HOSTS False only to the hosts
    gmond already monitors (read from its XML, as gangliad asks gstat)."""

    name = "ganglia"

    def __init__(self, send_to: tuple[str, int], xml_at: tuple[str, int] | None = None,
                 *, all_hosts: bool = False) -> None:
        self.send_to = send_to
        self.xml_at = xml_at
        self.all_hosts = all_hosts
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def _known(self) -> set[str] | None:
        """The hosts gmond monitors (None: every host). Reading its XML also tells whether
        gmond is up at all, which a UDP send never does."""
        if self.xml_at is None:
            if self.all_hosts:
                return None
            raise GangliaError("GANGLIA_SEND_DATA_FOR_ALL_HOSTS is False but GANGLIA_CONFIG has "
                               "no tcp_accept_channel to learn gmond's hosts from")
        if self.all_hosts:
            try:
                socket.create_connection(self.xml_at, timeout=5.0).close()
            except OSError as exc:
                raise PublisherUnavailableError(f"gmond at {self.xml_at[0]}:{self.xml_at[1]}: {exc}") from None
            return None
        try:
            hosts = read_gmond(*self.xml_at)
        except GangliaError as exc:
            raise PublisherUnavailableError(f"cannot learn gmond's hosts: {exc}") from None
        return set(hosts) | {h.ip for h in hosts.values()}

    def publish(self, metrics: Sequence[Metric], at: float) -> int:
        """Send every metric (metadata then value); the number sent. `at` is not sent: gmond
        stamps values on arrival, it keeps no history."""
        known = self._known()
        sent = 0
        try:
            for m in metrics:
                spoof = spoof_host(m)
                if known is not None and m.machine not in known and m.ip not in known:
                    continue
                self._sock.sendto(metadata_packet(m, spoof), self.send_to)
                self._sock.sendto(value_packet(m, spoof), self.send_to)
                sent += 1
        except OSError as exc:
            raise PublisherUnavailableError(f"gmond at {self.send_to[0]}:{self.send_to[1]}: {exc}") from None
        return sent

    def close(self) -> None:
        self._sock.close()

