"""OpenAPI for throttled views, through drf-spectacular (an optional dependency).

Set ``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "django_throttle.openapi.ThrottledAutoSchema"``,
or mix :class:`ThrottleSchemaMixin` into your own ``AutoSchema``. Every operation of a view
guarded by :class:`~django_throttle.drf.PolicyThrottle` (or routed under ``protect_credentials``,
as DRF's ``obtain_auth_token`` must be) then documents:

- a ``429`` response with ``Retry-After`` and ``X-RateLimit-*`` headers and the JSON body the
  throttle sends (``detail``, ``limit``, ``retry_after``);
- a ``503`` response with ``Retry-After`` (failing closed when Redis cannot answer);
- the ``X-RateLimit-*`` headers on its successful responses where they carry them (and the
  IETF ``RateLimit`` and ``RateLimit-Policy`` fields when ``DJANGO_THROTTLE_IETF_HEADERS`` is
  on): ``PolicyThrottle`` guards the view and ``RateLimitHeadersMiddleware`` is installed
  (:func:`sends_rate_headers`).

An operation that already documents a 429 or 503 keeps its own.
"""

from __future__ import annotations

import functools
from typing import Any

from django_throttle.conf import API_KEY_HEADERS, app_settings

# ThrottledAutoSchema is built by the module __getattr__ below.
__all__ = ["ThrottleSchemaMixin", "ThrottledAutoSchema"]  # noqa: F822

#: The middleware that adds the ``X-RateLimit-*`` headers to DRF's successful responses.
_MIDDLEWARE = "django_throttle.middleware.RateLimitHeadersMiddleware"
#: The component name of the refusal body.
BODY_COMPONENT = "ThrottledError"

_INTEGER = {"type": "integer", "minimum": 0}
_RATE_HEADERS = {
    "X-RateLimit-Limit": (
        "The request limit that applies (the tightest one); for a concurrency limit, the "
        "requests it lets run at once.",
        _INTEGER,
    ),
    "X-RateLimit-Remaining": ("Requests left before this limit denies.", _INTEGER),
    "X-RateLimit-Reset": (
        "Seconds until the limit is whole again (for a concurrency limit, until the last "
        "lease held now ends unless renewed; a slot frees sooner when a request ends).",
        _INTEGER,
    ),
}
_STRING = {"type": "string"}
_IETF_HEADERS = {
    "RateLimit": ("IETF RateLimit field: the limit's remaining quota and reset.", _STRING),
    "RateLimit-Policy": ("IETF RateLimit-Policy field: the quota policies.", _STRING),
}
_RETRY_AFTER = {"Retry-After": ("Seconds to wait before retrying.", _INTEGER)}
#: The refusal body's fields: (type, nullable, description).
_BODY_FIELDS = {
    "detail": ("string", False, "What happened, for people."),
    "limit": ("string", True, "The limit that denied the request."),
    "retry_after": ("integer", True, "Seconds to wait, as in Retry-After."),
}


def is_throttled(view: Any) -> bool:
    """Whether ``view`` runs :class:`~django_throttle.drf.PolicyThrottle` (or a subclass), or is
    routed under ``protect_credentials`` (DRF's ``obtain_auth_token``, whose own
    ``throttle_classes`` are empty: the wrapper's ``initkwargs`` name its scope)."""
    if getattr(view, "throttle_credential_scope", None):
        return True
    return _runs_policy_throttle(view)


def _runs_policy_throttle(view: Any) -> bool:
    from django_throttle.drf import PolicyThrottle

    classes = getattr(view, "throttle_classes", None) or ()
    return any(isinstance(c, type) and issubclass(c, PolicyThrottle) for c in classes)


def sends_rate_headers(view: Any) -> bool:
    """Whether ``view``'s successful responses carry the ``X-RateLimit-*`` headers:
    :class:`~django_throttle.drf.PolicyThrottle` runs there and
    ``RateLimitHeadersMiddleware``, which adds them to DRF responses, is installed. A view
    limited only by ``protect_credentials`` (DRF's ``obtain_auth_token``) sends none on an
    answered attempt, only on its 429."""
    from django.conf import settings

    middleware = getattr(settings, "MIDDLEWARE", None) or ()
    return _runs_policy_throttle(view) and _MIDDLEWARE in middleware


class ThrottleSchemaMixin:
    """Adds the throttle's responses and headers to the operations of throttled views."""

    view: Any
    registry: Any

    def _get_response_bodies(self, direction: str = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)  # type: ignore[misc]
        if direction != "response" or not is_throttled(self.view):
            return responses
        body = {"application/json": {"schema": self._body_reference()}}
        refusals = {
            "429": (
                "Too many requests: a rate limit, or a limit on requests in flight at once, "
                "denied this request.",
                _rate_headers(),
            ),
            "503": ("Rate limiting is unavailable and this endpoint fails closed.", {}),
        }
        for code, (text, headers) in refusals.items():
            headers = _headers({**_RETRY_AFTER, **headers})
            responses.setdefault(code, {"description": text, "headers": headers, "content": body})
        return responses

    def _get_response_headers_for_code(self, status_code: str, direction: str = "response") -> Any:
        headers = super()._get_response_headers_for_code(status_code, direction)  # type: ignore[misc]
        if (
            direction == "response"
            and str(status_code).startswith("2")
            and sends_rate_headers(self.view)
        ):
            headers = {**_headers(_rate_headers()), **(headers or {})}
        return headers

    def _body_reference(self) -> dict[str, Any]:
        from drf_spectacular.plumbing import ResolvedComponent

        properties = {
            name: {"type": kind, **({"nullable": True} if nullable else {}), "description": text}
            for name, (kind, nullable, text) in _BODY_FIELDS.items()
        }
        component = ResolvedComponent(  # type: ignore[no-untyped-call]
            name=BODY_COMPONENT,
            type=ResolvedComponent.SCHEMA,
            object=BODY_COMPONENT,
            schema={"type": "object", "properties": properties, "required": list(_BODY_FIELDS)},
        )
        self.registry.register_on_missing(component)
        reference: dict[str, Any] = component.ref
        return reference


def __getattr__(name: str) -> Any:
    """``ThrottledAutoSchema`` is built on first use: drf-spectacular imports DRF, which reads
    the settings, and this module must import before settings are configured."""
    if name != "ThrottledAutoSchema":
        raise AttributeError(name)
    from drf_spectacular.openapi import AutoSchema

    _register_authentication_schemes()

    class ThrottledAutoSchema(ThrottleSchemaMixin, AutoSchema):
        """drf-spectacular's ``AutoSchema`` that documents the throttle."""

        __qualname__ = "ThrottledAutoSchema"

    globals()["ThrottledAutoSchema"] = ThrottledAutoSchema
    return ThrottledAutoSchema


def _rate_headers() -> dict[str, tuple[str, dict[str, Any]]]:
    return {**_RATE_HEADERS, **(_IETF_HEADERS if app_settings.IETF_HEADERS else {})}


def _headers(spec: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {name: {"description": text, "schema": schema} for name, (text, schema) in spec.items()}


@functools.cache
def _register_authentication_schemes() -> None:
    """Describe our DRF authentication classes as the schemes they wrap (drf-spectacular
    matches its built-in extensions by exact class), and API keys as an ``apiKey`` header.
    Extensions register themselves when their class is created: once per process."""
    from drf_spectacular.authentication import BasicScheme, SessionScheme, TokenScheme
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    for base, target in (
        (BasicScheme, "ProtectedBasicAuthentication"),
        (TokenScheme, "ProtectedTokenAuthentication"),
        (SessionScheme, "ProtectedSessionAuthentication"),
    ):
        type(
            f"{target}Scheme",
            (base,),
            {"target_class": f"django_throttle.drf.{target}", "__module__": __name__},
        )

    class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
        target_class = "django_throttle.drf.ApiKeyAuthentication"
        name = "apiKeyAuth"

        def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
            header = API_KEY_HEADERS[-1]
            return {"type": "apiKey", "in": "header", "name": header}
