"""The region a request comes from (``DJANGO_THROTTLE_REGION_SOURCE``), for the limits that
name regions: a trusted edge's header, or the client address's country in a GeoIP2 database.

A header is believed only from a proxy ``TRUSTED_PROXIES`` trusts; anything else (no header,
an untrusted sender, a value that is no region code, an address the database does not know,
a database that cannot be opened) is no region, and the client meets the default limits. The
GeoIP2 database (Django's :class:`~django.contrib.gis.geoip2.GeoIP2`, its ``GEOIP_PATH``) is
opened once per process; a system check names one that cannot be opened. Nothing here raises
into a request, queries the database or calls Redis.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from django.conf import settings

from django_throttle.conf import REGION_GEOIP, app_settings
from django_throttle.identity import client_ip, from_trusted_proxy, region_code

logger = logging.getLogger("django_throttle.policy")


class CountryReader(Protocol):
    """What is read of a GeoIP2 database (Django's ``GeoIP2`` has it)."""

    def country_code(self, query: str) -> str | None: ...


def request_region(request: Any) -> str | None:
    """The region code of ``request`` by ``REGION_SOURCE``, else ``None``."""
    source = app_settings.region_source
    if source is None:
        return None
    meta = request.META
    kind, header = source
    if kind == REGION_GEOIP:
        address = client_ip(meta)
        return None if address is None else address_region(address)
    if not from_trusted_proxy(meta):
        return None
    return region_code(meta.get(header))


def address_region(address: str) -> str | None:
    """The country code of ``address`` (an address, or the ``/64`` network the limiter
    counts an IPv6 client by) in the GeoIP2 database, else ``None``."""
    reader = geoip()
    if reader is None:
        return None
    try:
        return region_code(reader.country_code(address.partition("/")[0]))
    except Exception:  # an address the database does not know; a damaged database
        return None


_lock = threading.Lock()
#: The process's database, by the ``GEOIP_PATH`` it was opened from (``None``: could not be).
_opened: dict[str, CountryReader | None] = {}


def geoip() -> CountryReader | None:
    """The GeoIP2 database of ``GEOIP_PATH``, opened once per process and path; ``None``
    when it cannot be opened (logged once)."""
    path = str(getattr(settings, "GEOIP_PATH", "") or "")
    if path in _opened:
        return _opened[path]
    with _lock:
        if path not in _opened:
            reader, problem = open_geoip()
            if problem:
                logger.error(
                    "Regions by GeoIP2: %s; every client meets the default limits.", problem
                )
            _opened[path] = reader
    return _opened[path]


def open_geoip() -> tuple[CountryReader | None, str]:
    """Django's ``GeoIP2`` on ``GEOIP_PATH``, or ``None`` and why it cannot be opened."""
    try:
        from django.contrib.gis.geoip2 import GeoIP2
    except Exception as exc:  # the geoip2 package is missing
        return None, f"django.contrib.gis.geoip2 cannot be imported ({exc})"
    try:
        return GeoIP2(), ""
    except Exception as exc:
        return None, f"the GeoIP2 database of GEOIP_PATH cannot be opened ({exc})"


def forget() -> None:
    """Open the database again on next use (tests; a new ``GEOIP_PATH``)."""
    with _lock:
        _opened.clear()
