"""A policy document from a ``REST_FRAMEWORK`` setting's throttles (``manage.py throttle_policy
from-drf``), so a project moving from DRF's throttles starts with the limits it had.

Reads the setting's values only: no rows, no DRF import. The document goes through
:func:`django_throttle.policy.files.import_policy` like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django_throttle.policy.text import FORMAT_VERSION, PolicyFileError
from django_throttle.rates import MAX_LOG_COUNT, Algorithm

_USER = "rest_framework.throttling.UserRateThrottle"


def from_drf(rest_framework: Mapping[str, Any]) -> dict[str, Any]:
    """A policy document doing what a ``REST_FRAMEWORK`` setting's throttles do.

    ``anon`` becomes the rate of an ``anonymous`` tier (the default for anonymous clients),
    ``user`` that of an ``authenticated`` tier (the default for users) and, when
    ``UserRateThrottle`` is a default class, of the anonymous tier too (DRF's user throttle
    counts anonymous clients by IP); every other rate becomes an endpoint rule matching that
    DRF ``throttle_scope`` (``ScopedRateThrottle``) with the rate for both tiers. DRF counts
    with a sliding window log, so the limits use it too. Raises :class:`PolicyFileError` for a
    rate DRF itself could not read, and when the setting holds no rate at all (the document
    would only take limits away).
    """
    rates = dict(rest_framework.get("DEFAULT_THROTTLE_RATES") or {})
    classes = [str(c) for c in rest_framework.get("DEFAULT_THROTTLE_CLASSES") or ()]
    if not any(rate is not None for rate in rates.values()):
        # Converting nothing would give both tiers no limits: applied, it would delete the
        # anonymous tier's limits and hand the authenticated default to an unlimited tier.
        raise PolicyFileError(
            [
                "REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] holds no rates, so there is nothing "
                "to convert (applied, it would remove every limit of the default tiers)"
            ]
        )
    converted = {scope: _drf_limit(rate) for scope, rate in rates.items() if rate is not None}
    problems = [
        f"DEFAULT_THROTTLE_RATES[{scope!r}]: {rates[scope]!r} is not a DRF rate such as '100/day'"
        for scope, limit in converted.items()
        if limit is None
    ]
    if problems:
        raise PolicyFileError(problems)
    limits = {scope: limit for scope, limit in converted.items() if limit is not None}
    anonymous = [limits["anon"]] if "anon" in limits else []
    if "user" in limits and _USER in classes:
        anonymous.append(limits["user"])  # DRF's user throttle counts anonymous clients by IP
    authenticated = [limits["user"]] if "user" in limits else []
    tiers = [
        _tier("anonymous", "AnonRateThrottle", "anon", "is_default_anonymous", anonymous),
        _tier(
            "authenticated", "UserRateThrottle", "user", "is_default_authenticated", authenticated
        ),
    ]
    rules = [
        {
            "name": scope,
            "match_type": "scope",
            "pattern": scope,
            "limits": [{"tier": slug, **limit} for slug in ("anonymous", "authenticated")],
        }
        for scope, limit in sorted(limits.items())
        if scope not in ("anon", "user")
    ]
    return {"version": FORMAT_VERSION, "tiers": tiers, "rules": rules}


def _tier(
    slug: str, throttle: str, scope: str, default: str, limits: list[dict[str, Any]]
) -> dict[str, Any]:
    """A default tier's entry, ``default`` the flag making it one, from DRF's ``throttle``."""
    return {
        "slug": slug,
        "name": slug.capitalize(),
        "description": f"From DRF's {throttle} (DEFAULT_THROTTLE_RATES[{scope!r}]).",
        default: True,
        "limits": limits,
    }


def _drf_limit(rate: Any) -> dict[str, Any] | None:
    """DRF's reading of ``rate`` as a limit row, or ``None`` where DRF would fail."""
    try:
        count_text, period = str(rate).split("/")
        count = int(count_text)
    except ValueError:
        return None
    unit = period[:1]  # DRF reads only the first letter ("100/day", "5/minute")
    if unit not in ("s", "m", "h", "d") or count < 1:
        return None
    # DRF keeps every request's time in a list, a sliding window log; beyond the log's
    # largest count the sliding window counter stands in.
    log = count <= MAX_LOG_COUNT
    algorithm = Algorithm.SLIDING_LOG if log else Algorithm.SLIDING_COUNTER
    return {"rate": f"{count}/{unit}", "algorithm": str(algorithm)}
