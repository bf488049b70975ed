"""IDTOKENS authentication (HTCondor's TOKEN method): JWTs signed with the pool signing key."""
from __future__ import annotations

from typing import Any

from services.admin import Identity
from services.collector.cedar import Channel


class TokenAuthenticator:
    """The server side of IDTOKENS."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.available = False

    async def authenticate(self, channel: Channel) -> tuple[Identity | None, str]:
        return None, "IDTOKENS is not implemented yet"
