"""The negotiator: HTCondor's matchmaking as a pure function of a cycle snapshot.

`negotiate(CycleInput, NegotiatorConfig) -> CycleResult` runs one negotiation cycle (floor
round, group loop, pie spins, per-submitter matchmaking with autocluster caching and column
evaluation). It imports no I/O: the service that feeds it from the log lives elsewhere.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.negotiator.errors import InvalidInputError, NegotiatorError
    from services.negotiator.matchmaker import negotiate, to_payloads
    from services.negotiator.model import (
        AutoclusterRejection,
        CycleInput,
        CycleResult,
        DynamicSlot,
        GroupInput,
        MatchRecord,
        NegotiatorConfig,
        SubmitterInput,
        SubmitterStats,
    )

__all__ = [
    "AutoclusterRejection", "CycleInput", "CycleResult", "DynamicSlot", "GroupInput",
    "InvalidInputError", "MatchRecord", "NegotiatorConfig", "NegotiatorError", "SubmitterInput",
    "SubmitterStats", "negotiate", "to_payloads",
]

#: Where each name lives: loaded on first use (PEP 562), so a command that only needs a
#: submodule (`shard`: every query command) does not import the matchmaker (0.15 s).
_HOME = {**dict.fromkeys(("InvalidInputError", "NegotiatorError"), "errors"),
         **dict.fromkeys(("negotiate", "to_payloads"), "matchmaker")}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_HOME.get(name, 'model')}")
    return getattr(module, name)
