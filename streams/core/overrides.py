"""A fold's config with its log's `config.changed` overrides, memoized.

Why a memo: every fold rebuilds its config from the settings when an override changes, and a
log that toggles a knob back and forth (a what-if, a rollback) would otherwise rebuild every
fold's config at each change. Knobs are read through `schemas.config` (`Knobs`, `knob_*`),
the one typed path; this module only remembers the results.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Overridable", "Effective"]


class Overridable(Protocol):
    """A fold's config: a copy with `config.changed` overrides layered over its settings."""

    def with_overrides(self, overrides: Mapping[str, str]) -> Any: ...


C = TypeVar("C", bound=Overridable)
#: configs with overrides, by (id of the config, overrides), shared by every state. The
#: config is kept in the value, so its id cannot be reused.
_OVERRIDDEN: dict[tuple[int, frozenset[tuple[str, str]]], tuple[Any, Any]] = {}


class Effective(Generic[C]):
    """A fold's config with its log's `config.changed` overrides, as one state last asked for
    it (the hot path: same config, same overrides); else from the shared memo."""

    __slots__ = ("_base", "_overrides", "_value")

    def __init__(self) -> None:
        self._base: C | None = None
        self._overrides: dict[str, str] = {}
        self._value: C | None = None

    def get(self, cfg: C, overrides: dict[str, str]) -> C:
        value = self._value
        if value is None or self._base is not cfg or self._overrides != overrides:
            key = (id(cfg), frozenset(overrides.items()))
            found = _OVERRIDDEN.get(key)
            if found is None or found[0] is not cfg:
                if len(_OVERRIDDEN) >= 256:
                    _OVERRIDDEN.clear()
                found = _OVERRIDDEN[key] = (cfg, cfg.with_overrides(overrides))
            value = self._value = found[1]
            self._base, self._overrides = cfg, dict(overrides)
        return value
