"""Test clients that send from a chosen address over ASGI."""

from __future__ import annotations

from typing import Any

from django.test import AsyncClient


class AddressedAsyncClient(AsyncClient):
    """``AsyncClient`` sending from ``address``: an ASGI request's address is its scope's
    ``client``, and ``AsyncClient(REMOTE_ADDR=...)`` or a ``REMOTE_ADDR=`` keyword only adds a
    header (the request still comes from 127.0.0.1, so "fresh addresses" share one counter)."""

    def __init__(self, address: str, **defaults: Any) -> None:
        super().__init__(**defaults)
        self.address = address

    def _base_scope(self, **request: Any) -> dict[str, Any]:
        scope: dict[str, Any] = super()._base_scope(**request)  # type: ignore[misc]
        scope["client"] = [self.address, 40000]
        return scope
