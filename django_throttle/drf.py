"""Django REST framework adapter: the only module that imports ``rest_framework``.

Use ``django_throttle.drf.PolicyThrottle`` in ``DEFAULT_THROTTLE_CLASSES`` or a view's
``throttle_classes``; a view's ``throttle_scope`` selects endpoint rules of type "scope".
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import Throttled
from rest_framework.request import Request

from django_throttle import core
from django_throttle.headers import throttled_body
from django_throttle.rates import Decision

__all__ = ["PolicyThrottle", "PolicyThrottled"]


class PolicyThrottled(Throttled):
    """429 whose body names the limit; DRF adds ``Retry-After`` from ``wait``."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(wait=decision.retry_after_header)
        self.detail = throttled_body(decision)


class PolicyThrottle:
    """Apply the admin-managed policy (tier limits + endpoint rules) to a DRF view.

    It implements DRF's throttle interface (``allow_request`` and ``wait``) without subclassing
    ``rest_framework.throttling.BaseThrottle``: importing that module reads DRF's settings at
    class definition (DRF #6030), and this module must import before settings are configured.

    A denial raises :class:`PolicyThrottled` directly so the 429 body can name the limit;
    :meth:`wait` still returns the seconds to wait, as DRF's throttles do. The decision is left
    on the Django request for :class:`~django_throttle.middleware.RateLimitHeadersMiddleware`.
    """

    decision: Decision | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        # DRF has authenticated by now and copied the user onto the Django request; reading the
        # Django request directly skips DRF's attribute proxy on every lookup.
        http_request = request._request
        if getattr(http_request, "user", None) is not request.user:
            http_request.user = request.user
        decision = core.check(http_request, scope=getattr(view, "throttle_scope", None))
        self.decision = decision
        http_request.throttle_decision = decision  # type: ignore[attr-defined]
        if decision.allowed:
            return True
        raise PolicyThrottled(decision)

    def wait(self) -> float | None:
        if self.decision is None or self.decision.allowed:
            return None
        return self.decision.retry_after
