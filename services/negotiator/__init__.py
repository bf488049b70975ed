"""The negotiator: HTCondor's matchmaking as a pure function of a cycle snapshot.

`negotiate(CycleInput, NegotiatorConfig) -> CycleResult` runs one negotiation cycle (floor
round, group loop, pie spins, per-submitter matchmaking with autocluster caching and column
evaluation). It imports no I/O: the service that feeds it from the log lives elsewhere.
"""
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
