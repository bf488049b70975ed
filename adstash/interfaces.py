"""Where adstash documents go: one small interface, a lazy registry, three implementations.

As condor_adstash's `interfaces/`: Elasticsearch, OpenSearch (the same wire protocol through
its own client) and JSON files. A client library is imported only when its interface is
chosen. Driver errors are translated here: a cluster that does not answer (or answers 429/5xx
to the whole request) is `TargetUnavailableError` (the runner retries, the checkpoint stays);
a document the cluster refuses comes back as (position, reason) and ends in the sink's DLQ.
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence
from urllib.parse import quote, urlsplit

import orjson

from adstash import fields
from adstash.convert import AdstashError, MAX_STRING
from streams.log.files import atomic_file
from streams.sink import TargetUnavailableError

__all__ = ["Interface", "SearchEngineOptions", "INTERFACES", "make_interface", "index_body"]

Doc = tuple[str, Mapping[str, Any]]  # (document id, document)

INDEX_SUFFIX = "-000001"
_ROLLOVER = re.compile(r"-\d{6}$")


class InterfaceError(AdstashError):
    """An interface that cannot be built (unknown name, bad option)."""


class Interface(Protocol):
    """One document store. `index` returns {position in docs: the store's reason} for the
    documents it refused; it raises TargetUnavailableError when it acknowledged nothing."""

    name: str

    def index(self, docs: Sequence[Doc]) -> dict[int, str]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SearchEngineOptions:
    """adstash's ADSTASH_SE_* knobs (condor_adstash option names in the CLI)."""

    host: str = "localhost:9200"
    index_name: str = "htcondor-000001"    # the first index; documents go to its write alias
    username: str | None = None
    password: str | None = None            # never printed or logged (repr hides it)
    use_https: bool = False
    bunch_size: int = 250
    timeout: float = 60.0
    ca_certs: str | None = None
    log_dir: str = "."                      # jsonfile: where the JSON files go
    shards: int | None = None               # None: the engine's default (condor_adstash sets
    replicas: int | None = None             # neither)

    def __repr__(self) -> str:
        return (f"SearchEngineOptions(host={self.host!r}, index_name={self.index_name!r}, "
                f"username={self.username!r}, password={'***' if self.password else None}, "
                f"use_https={self.use_https}, bunch_size={self.bunch_size})")

    @property
    def url(self) -> str:
        if "://" in self.host:
            return self.host
        return f"{'https' if self.use_https else 'http'}://{self.host}"

    def checked_url(self) -> str:
        """`url`, refused (InterfaceError) unless it is an http(s) URL of a host and port."""
        url = self.url
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - parsing the port is the check
        except ValueError as exc:
            raise InterfaceError(f"--se_host {self.host!r}: not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname \
                or any(c.isspace() for c in url) or parts.query or parts.fragment:
            raise InterfaceError(f"--se_host {self.host!r}: not HOST:PORT or an http(s) URL")
        return url

    @property
    def index(self) -> str:
        """The concrete first index (adstash: htcondor-000001)."""
        return self.index_name if _ROLLOVER.search(self.index_name) else self.index_name + INDEX_SUFFIX

    @property
    def alias(self) -> str:
        """The write alias documents are sent to (the index name without its -NNNNNN)."""
        return _ROLLOVER.sub("", self.index)


def index_body(shards: int | None = None, replicas: int | None = None) -> dict[str, Any]:
    """adstash's explicit mappings, dynamic templates and settings for the history index
    (shards and replicas: ADSTASH_SE_NUMBER_OF_SHARDS/_REPLICAS, else the engine's defaults)."""
    kw: dict[str, Any] = {"type": "keyword", "ignore_above": MAX_STRING}
    noindex: dict[str, Any] = {"type": "keyword", "index": False, "ignore_above": MAX_STRING}
    props: dict[str, Any] = {}
    for names, mapping in ((fields.TEXT, {"type": "text"}), (fields.INDEXED_KEYWORD, kw),
                           (fields.NOINDEX_KEYWORD, noindex), (fields.FLOAT, {"type": "double"}),
                           (fields.INT, {"type": "long"}),
                           (fields.DATE, {"type": "date", "format": "epoch_second"}),
                           (fields.BOOL, {"type": "boolean"}),
                           (fields.NESTED - {"metadata"}, {"type": "nested", "dynamic": True})):
        for name in names:
            props[name] = mapping
    # nested, as condor_adstash maps it: an index either one created takes the other's documents
    props["metadata"] = {"type": "nested", "dynamic": True, "properties": {
        f"condor_adstash_{k}": kw for k in ("hostname", "username", "version", "platform",
                                             "source")} | {
        "condor_adstash_runtime": {"type": "date", "format": "epoch_second"}}}
    templates = [
        {"raw_expression": {"match": "*_EXPR", "mapping": noindex}},
        # a value that failed its cast: keep it a string even when its name says Request*/Date
        {"failed_casts": {"match": "*_STRING", "mapping": kw}},
        {"date_attrs": {"match": "*Date", "mapping": {"type": "date", "format": "epoch_second"}}},
        {"provisioned_attrs": {"match": "*Provisioned", "mapping": {"type": "long"}}},
        {"resource_request_attrs": {"match_pattern": "regex", "match": "^Request[A-Z].*$",
                                    "mapping": {"type": "long"}}},
        {"target_boolean_attrs": {"match_pattern": "regex", "match": "^(Want|Has|Is)[A-Z_].*$",
                                  "match_mapping_type": "boolean",
                                  "mapping": {"type": "boolean"}}},
        {"strings": {"match_mapping_type": "string", "mapping": kw}},
    ]
    index: dict[str, Any] = {"mapping": {"total_fields": {"limit": 5000}}}
    if shards is not None:
        index["number_of_shards"] = shards
    if replicas is not None:
        index["number_of_replicas"] = replicas
    return {"settings": {"index": index},
            "mappings": {"date_detection": False, "numeric_detection": False,
                         "dynamic_templates": templates, "properties": props},
            }


def _bulk_lines(index: str, docs: Sequence[Doc]) -> bytes:
    out = bytearray()
    for doc_id, doc in docs:
        out += orjson.dumps({"index": {"_index": index, "_id": doc_id}})
        out += b"\n"
        out += orjson.dumps(doc)
        out += b"\n"
    return bytes(out)


def _item_reason(error: Any) -> str:
    if isinstance(error, Mapping):
        text = f"{error.get('type', 'error')}: {error.get('reason', '')}"
        cause = error.get("caused_by")
        if isinstance(cause, Mapping):
            text += f" (caused by {cause.get('type')}: {cause.get('reason')})"
        return text
    return str(error)


class _SearchEngine:
    """Shared by Elasticsearch and OpenSearch: alias + first index on first use, bulk in
    bunches of `bunch_size`, per-item errors as rejections."""

    name = "search_engine"

    def __init__(self, options: SearchEngineOptions) -> None:
        self.options = options
        self._client: Any = None
        self._write_to: str | None = None   # the alias, or an existing index of condor_adstash's
        self._require_alias = True

    # the two clients differ only here
    def _connect(self) -> Any:
        raise NotImplementedError

    def _unavailable(self) -> tuple[type[BaseException], ...]:
        raise NotImplementedError

    def _create(self, client: Any, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def _bulk(self, client: Any, payload: bytes, require_alias: bool) -> Mapping[str, Any]:
        raise NotImplementedError

    def _put_mapping(self, client: Any, index: str, properties: dict[str, Any]) -> None:
        raise NotImplementedError

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._unavailable() as exc:
            raise TargetUnavailableError(
                f"{self.name} at {self.options.url} is unreachable: {type(exc).__name__}") from None

    def _ensure_index(self) -> Any:
        """Decide once where documents go: the write alias when it exists; else an index of
        condor_adstash's already there (its first index, or a plain index named as the alias),
        with the mappings it lacks added as condor_adstash adds them; else a new first index
        behind the alias. Bulk requests to the alias require it, so the engine never creates an
        index of its own with default mappings."""
        if self._client is None:
            self._client = self._connect()
        if self._write_to is None:
            client = self._client
            alias = self.options.alias
            if self._call(lambda: bool(client.indices.exists_alias(name=alias))):
                write_to, require = alias, True
            else:
                existing = [name for name in (self.options.index, alias)
                            if self._exists(client, name)]
                if existing:
                    write_to, require = existing[0], False
                    self._add_missing_mappings(client, write_to)
                else:
                    body = index_body(self.options.shards, self.options.replicas)
                    body["aliases"] = {alias: {"is_write_index": True}}
                    self._call(lambda: self._create(client, body))
                    write_to, require = alias, True
            self._write_to, self._require_alias = write_to, require
        return self._client

    def _exists(self, client: Any, index: str) -> bool:
        return bool(self._call(lambda: client.indices.exists(index=index)))

    def _add_missing_mappings(self, client: Any, index: str) -> None:
        """Add to an existing index the explicit mappings it lacks (condor_adstash's
        setup_index does the same); one that clashes is refused in one line naming the index."""
        held: Any = self._call(lambda: client.indices.get_mapping(index=index))
        held = getattr(held, "body", held)
        first: Any = next(iter(held.values()), {})
        props: dict[str, Any] = first.get("mappings", {}).get("properties", {})
        wanted = index_body()["mappings"]["properties"]
        clashing = sorted(k for k, v in wanted.items() if k in props
                          and props[k].get("type", "object") != v.get("type", "object"))
        if clashing:
            one = clashing[0]
            raise InterfaceError(
                f"index {index} maps {', '.join(clashing[:5])} otherwise than the job history "
                f"needs ({one}: {props[one].get('type', 'object')}, not "
                f"{wanted[one].get('type', 'object')}); set ADSTASH_SE_INDEX_NAME to another "
                "index")
        missing = {k: v for k, v in wanted.items() if k not in props}
        if missing:
            self._call(lambda: self._put_mapping(client, index, missing))

    def index(self, docs: Sequence[Doc]) -> dict[int, str]:
        client = self._ensure_index()
        refused: dict[int, str] = {}
        size = max(1, self.options.bunch_size)
        for start in range(0, len(docs), size):
            bunch = docs[start:start + size]
            target = self._write_to or self.options.alias
            resp = self._call(lambda: self._bulk(client, _bulk_lines(target, bunch),
                                                 self._require_alias))
            if not resp.get("errors"):
                continue
            for k, item in enumerate(resp.get("items", ())):
                result = next(iter(item.values()))
                status = int(result.get("status", 200))
                if status == 429 or status >= 500:
                    raise TargetUnavailableError(
                        f"{self.name} answered {status} for a document: "
                        f"{_item_reason(result.get('error'))}")
                if status >= 300:
                    refused[start + k] = _item_reason(result.get("error"))
        return refused

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class ElasticsearchInterface(_SearchEngine):
    name = "elasticsearch"

    def _connect(self) -> Any:
        from elasticsearch import Elasticsearch

        # the runner logs one line per outage; the client's per-retry warnings would flood it
        logging.getLogger("elastic_transport").setLevel(logging.ERROR)

        auth = ((self.options.username, self.options.password or "")
                if self.options.username else None)
        extra: dict[str, Any] = {"ca_certs": self.options.ca_certs} if self.options.ca_certs else {}
        return Elasticsearch(self.options.url, basic_auth=auth,
                             request_timeout=self.options.timeout, max_retries=0, **extra)

    def _unavailable(self) -> tuple[type[BaseException], ...]:
        import elastic_transport

        return (elastic_transport.TransportError,)

    def _create(self, client: Any, body: dict[str, Any]) -> None:
        from elasticsearch import BadRequestError

        try:
            client.indices.create(index=self.options.index, **body)
        except BadRequestError as exc:  # created meanwhile by another sink
            if "resource_already_exists" not in str(exc):
                raise InterfaceError(f"cannot create index {self.options.index}: {exc}") from None

    def _put_mapping(self, client: Any, index: str, properties: dict[str, Any]) -> None:
        from elasticsearch import BadRequestError

        try:
            client.indices.put_mapping(index=index, properties=properties)
        except BadRequestError as exc:
            raise InterfaceError(f"cannot add the history's mappings to index {index}: "
                                 f"{_item_reason(exc.body.get('error'))}; set "
                                 "ADSTASH_SE_INDEX_NAME to another index") from None

    def _bulk(self, client: Any, payload: bytes, require_alias: bool) -> Mapping[str, Any]:
        from elasticsearch import ApiError

        try:
            return client.bulk(  # type: ignore[no-any-return]
                operations=payload, require_alias=require_alias or None).body
        except ApiError as exc:
            if exc.status_code == 429 or exc.status_code >= 500:
                raise TargetUnavailableError(f"elasticsearch answered {exc.status_code}") from None
            raise


class OpenSearchInterface(_SearchEngine):
    name = "opensearch"

    def _connect(self) -> Any:
        from opensearchpy import OpenSearch

        logging.getLogger("opensearch").setLevel(logging.ERROR)

        auth = ((self.options.username, self.options.password or "")
                if self.options.username else None)
        return OpenSearch([self.options.url], http_auth=auth, ca_certs=self.options.ca_certs,
                          timeout=self.options.timeout, max_retries=0)

    def _unavailable(self) -> tuple[type[BaseException], ...]:
        from opensearchpy.exceptions import ConnectionError as OSConnectionError

        return (OSConnectionError,)

    def _create(self, client: Any, body: dict[str, Any]) -> None:
        from opensearchpy.exceptions import RequestError

        try:
            client.indices.create(index=self.options.index, body=body)
        except RequestError as exc:
            if "resource_already_exists" not in str(exc):
                raise InterfaceError(f"cannot create index {self.options.index}: {exc}") from None

    def _put_mapping(self, client: Any, index: str, properties: dict[str, Any]) -> None:
        from opensearchpy.exceptions import RequestError

        try:
            client.indices.put_mapping(index=index, body={"properties": properties})
        except RequestError as exc:
            raise InterfaceError(f"cannot add the history's mappings to index {index}: "
                                 f"{_item_reason(exc.info.get('error') if isinstance(exc.info, Mapping) else exc)}; "
                                 "set "
                                 "ADSTASH_SE_INDEX_NAME to another index") from None

    def _bulk(self, client: Any, payload: bytes, require_alias: bool) -> Mapping[str, Any]:
        from opensearchpy.exceptions import TransportError

        try:
            params = {"require_alias": "true"} if require_alias else None
            return client.bulk(body=payload, params=params)  # type: ignore[no-any-return]
        except TransportError as exc:
            code = exc.status_code if isinstance(exc.status_code, int) else 0
            if code == 429 or code >= 500:
                raise TargetUnavailableError(f"opensearch answered {code}") from None
            raise


class JsonFileInterface:
    """adstash's json_file interface, one JSON file per document (`{id: doc}`, condor_adstash's
    file form) in `log_dir`, named by the document id: a re-delivery in any batching rewrites
    the same files, never a second copy (the sink port's contract; condor_adstash names a
    bunch's file by the time it was written, so a re-delivered bunch is stored twice)."""

    name = "jsonfile"

    def __init__(self, options: SearchEngineOptions) -> None:
        self.dir = Path(options.log_dir)

    def index(self, docs: Sequence[Doc]) -> dict[int, str]:
        if not docs:
            return {}
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for doc_id, doc in docs:
                with atomic_file(self.dir / json_file_name(doc_id)) as f:
                    f.write(orjson.dumps({doc_id: doc}, option=orjson.OPT_INDENT_2))
        except OSError as exc:
            raise TargetUnavailableError(f"cannot write {self.dir}: {exc.strerror}") from None
        return {}

    def close(self) -> None:
        pass


def json_file_name(doc_id: str) -> str:
    """The file of one document: its id percent-encoded (one id, one name, no two ids
    sharing one), a long id cut and told apart by a digest of the whole."""
    name = quote(doc_id, safe="-_.")
    if len(name) > 200:
        name = f"{name[:150]}-{hashlib.blake2b(doc_id.encode(), digest_size=16).hexdigest()}"
    return f"adstash_{name}.json"


# name -> "module:class", imported on first use (no client library loaded unless chosen)
INTERFACES: dict[str, str] = {
    "elasticsearch": "adstash.interfaces:ElasticsearchInterface",
    "opensearch": "adstash.interfaces:OpenSearchInterface",
    "jsonfile": "adstash.interfaces:JsonFileInterface",
}


def make_interface(name: str, options: SearchEngineOptions) -> Interface:
    """The interface registered as `name`, built with `options`."""
    try:
        module, cls = INTERFACES[name].split(":")
    except KeyError:
        raise InterfaceError(f"unknown adstash interface {name!r}: one of "
                             f"{', '.join(INTERFACES)}") from None
    if name != "jsonfile":
        options.checked_url()
    built: Interface = getattr(importlib.import_module(module), cls)(options)
    return built
