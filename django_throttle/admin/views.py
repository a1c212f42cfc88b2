"""Pages the admin adds under "Usage counts": the dashboard, the client inspector (with
"explain" and "reset"). :mod:`django_throttle.admin` mounts them; each checks its own
permission: viewing usage counts to look, changing tiers to reset. What they show comes from
the inspection and usage modules, the ones ``manage.py`` commands read too."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.decorators import permission_required
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from django_throttle.admin.base import AppAdmin
from django_throttle.admin.dashboard import CHARTED, LABELS, WINDOWS, timeline
from django_throttle.backends import BackendError, get_backend
from django_throttle.backends.breaker import get_breaker
from django_throttle.conf import app_settings
from django_throttle.inspection.clients import counters, inspect
from django_throttle.inspection.explanations import explain
from django_throttle.inspection.resets import reset_ceilings, reset_counters, shared_limits
from django_throttle.inspection.subjects import Subject, UnknownClient, parse_client
from django_throttle.models import UsageCount
from django_throttle.models.fields import HTTP_METHODS
from django_throttle.plain import plain_text
from django_throttle.policy import live as policy_module
from django_throttle.usage.names import client_names
from django_throttle.usage.reports import Report, report

#: Clients listed under "most limited".
TOP_LIMITED = 20
INSPECT = "admin:django_throttle_usagecount_inspect"
#: Resetting a client's counters, or a shared limit, takes the permission to change tiers.
RESET_PERMISSION = "django_throttle.change_tier"


def dashboard(request: HttpRequest, model_admin: AppAdmin) -> HttpResponse:
    """Requests per minute by outcome (overall, per tier, per endpoint; each request once,
    under the tier that served it), checks before authentication per rule, the most limited
    clients (named, linked to their user or API key, estimates marked ``≈``) and the
    backend's health. Needs the "view usage count" permission."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    window = request.GET.get("window", "hour")
    window = window if window in WINDOWS else "hour"
    data = timeline(window)
    return model_admin.render_page(
        request,
        "dashboard",
        _("Rate limiting dashboard"),
        window=window,
        windows=list(WINDOWS),
        timeline=data,
        outcomes=[(name, LABELS[name], data.overall.totals[name]) for name in CHARTED],
        health=_health(),
        **_most_limited(window),
    )


def _most_limited(window: str) -> dict[str, Any]:
    """The clients denied most, each with who it is (:func:`client_names`), and which of
    their figures are estimates (sampled or folded: see ``Report.estimated_fields``)."""
    span, _step = WINDOWS[window]
    since = datetime.now(tz=UTC) - timedelta(minutes=span - 1)
    try:
        result = report(since, "client", None)
    except BackendError:
        result = Report(rows=[])
    limited = [row for row in result.rows if row.denied or row.shadow_denied]
    limited = sorted(limited, key=lambda row: (-row.denied, -row.shadow_denied, row.key))
    names = client_names(row.key for row in limited[:TOP_LIMITED])
    return {
        "limited": [{"row": row, "client": names[row.key]} for row in limited[:TOP_LIMITED]],
        "estimated": result.estimated_fields,
        "sample": result.sample,
    }


def _health() -> dict[str, Any]:
    """Whether the backend answers (and how fast), the breaker, and the policy snapshot; on a
    Redis Cluster, each primary's answer and breaker too."""
    breaker, snapshot = get_breaker(), policy_module.last()
    started, error = time.perf_counter(), ""
    try:
        get_backend().get_policy_version()  # the smallest call that reaches the backend
    except BackendError as exc:
        error = plain_text(f"{type(exc).__name__}: {exc}")
    primaries: list[Any] = []
    health_of = getattr(get_backend(), "primaries_health", None)
    if callable(health_of):
        try:
            primaries = health_of()
        except BackendError as exc:
            error = error or plain_text(f"{type(exc).__name__}: {exc}")
    compiled_at = None if snapshot is None else snapshot.compiled_at
    failed_at = breaker.last_error_at
    return {
        "backend": app_settings.BACKEND.rsplit(".", 1)[-1],
        "reachable": not error,
        "error": error,
        "latency_ms": None if error else (time.perf_counter() - started) * 1e3,
        "breaker": breaker,
        "last_error": plain_text(breaker.last_error or ""),
        "last_error_at": None if failed_at is None else datetime.fromtimestamp(failed_at, tz=UTC),
        "policy_age": max(0.0, policy_module.clock() - compiled_at) if compiled_at else None,
        "tiers": None if snapshot is None else len(snapshot.tiers),
        "primaries": primaries,
    }


# --- the inspector ----------------------------------------------------------------------------


class _Query(NamedTuple):
    """The inspector's client as typed, the username it presents and the address it comes
    from (the last two ``None`` when blank), kept from page to page."""

    client_text: str
    username: str | None
    address: str | None

    @classmethod
    def read(cls, data: QueryDict) -> _Query:
        text, username, address = (
            data.get(name, "").strip() for name in ("client", "username", "ip")
        )
        return cls(text, username or None, address or None)

    def subject(self) -> Subject:
        """The client named; a bad address is an error too, not "none". Raises
        :class:`UnknownClient`."""
        subject = parse_client(self.client_text)
        if self.address:
            parse_client(f"ip:{self.address}")
        return subject

    @property
    def url(self) -> str:
        """The inspector, showing this client again."""
        query = {"client": self.client_text, "username": self.username, "ip": self.address}
        encoded = urlencode({name: value for name, value in query.items() if value})
        return f"{reverse(INSPECT)}?{encoded}" if encoded else reverse(INSPECT)


def inspector(request: HttpRequest, model_admin: AppAdmin) -> HttpResponse:
    """One client's tier (and why) and every counter its requests meet (by client, by IP
    address, by username; shared ceilings marked), an "explain" form for a request it might
    send, and a button to reset its counters (confirmed on a second page)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    query = _Query.read(request.GET)
    method = request.GET.get("method", "GET").strip().upper()
    method = method if method in HTTP_METHODS else "GET"
    path = request.GET.get("path", "").strip()
    context: dict[str, Any] = {}
    if query.client_text:
        try:
            subject = query.subject()
            context["inspection"] = inspect(subject, query.username, query.address)
            if path:
                context["explanation"] = explain(
                    subject, method, path, address=query.address, username=query.username
                )
        except UnknownClient as exc:
            context["error"] = _("Unknown client: %(reason)s.") % {"reason": exc}
        except BackendError as exc:
            context["error"] = backend_failed(request, exc)
    return model_admin.render_page(
        request,
        "inspector",
        _("Inspect a client"),
        method=method,
        path=path,
        methods=HTTP_METHODS,
        can_reset=request.user.has_perm(RESET_PERMISSION),
        **query._asdict(),
        **context,
    )


@permission_required(RESET_PERMISSION, raise_exception=True)
def reset_client(request: HttpRequest, model_admin: AppAdmin) -> HttpResponse:
    """Confirm (GET), then clear (POST, CSRF-checked) every counter of one client (by
    client, by its address, by its username; never a shared ceiling), recorded in the admin
    history. Needs the permission to change tiers."""
    data = request.POST if request.method == "POST" else request.GET
    query = _Query.read(data)
    if data.get("ceiling"):
        return _reset_ceiling(request, model_admin, data["ceiling"].strip(), query)
    try:
        subject = query.subject()  # a username:#<digest> label reads the usage counts
    except UnknownClient as exc:
        error = _("Unknown client: %(reason)s.") % {"reason": exc}
        return _back(request, reverse(INSPECT), error, messages.ERROR)
    except BackendError as exc:
        return _back(request, reverse(INSPECT), backend_failed(request, exc), messages.ERROR)
    try:
        if request.method == "POST":
            found = reset_counters(subject, username=query.username, address=query.address)
            log_reset(request, subject, [counter.limit for counter in found])
            done = _("Reset %(count)d bucket(s) of %(client)s.")
            return _back(request, query.url, done % {"count": len(found), "client": subject.label})
        found = [c for c in counters(subject, query.username, query.address) if not c.limit.shared]
    except BackendError as exc:
        return _back(request, query.url, backend_failed(request, exc), messages.ERROR)
    title = _("Reset the buckets of %(client)s?") % {"client": subject.label}
    return model_admin.render_page(
        request,
        "reset_confirmation",
        title,
        subject=subject,
        counters=found,
        back=query.url,
        **query._asdict(),
    )


def _reset_ceiling(
    request: HttpRequest, model_admin: AppAdmin, limit_id: str, query: _Query
) -> HttpResponse:
    """Confirm (GET), then refill (POST) one shared limit in every key shard: a ceiling's
    own reset, recorded in the admin history (resetting a client never touches it)."""
    limit = shared_limits().get(limit_id)
    if limit is None:
        error = _("%(id)r is not a shared limit.") % {"id": limit_id}
        return _back(request, reverse(INSPECT), error, messages.ERROR)
    name = limit.name or limit.id
    if request.method != "POST":
        title = _("Reset the shared limit %(limit)s?") % {"limit": name}
        return model_admin.render_page(
            request, "reset_confirmation", title, ceiling=limit, back=query.url, **query._asdict()
        )
    try:
        reset_ceilings([limit_id])
    except BackendError as exc:
        return _back(request, query.url, backend_failed(request, exc), messages.ERROR)
    _log(request, None, name, f"Reset the shared limit {name} in every key shard")
    done = _("Reset the shared limit %(limit)s for every client.") % {"limit": name}
    return _back(request, query.url, done)


def backend_failed(request: HttpRequest, exc: BackendError) -> str:
    """What to tell the operator when the backend failed them: a reset (a POST) or a read."""
    if request.method == "POST":
        return _("The backend could not reset: %(error)s") % {"error": exc}
    return _("The backend could not be read: %(error)s") % {"error": exc}


def _back(request: HttpRequest, url: str, text: str, level: int = messages.SUCCESS) -> HttpResponse:
    """Back to ``url``, with ``text`` shown there."""
    messages.add_message(request, level, text)
    return HttpResponseRedirect(url)


def log_reset(request: HttpRequest, subject: Subject, limits: list[Any]) -> None:
    """An admin history entry: against the user or API key when there is one, else under
    usage counts with the client's name."""
    names = ", ".join(limit.name or limit.id for limit in limits) or "none"
    message = f"Reset the rate limit buckets of {subject.client}: {names}"
    _log(request, subject.user or subject.api_key, subject.label, message)


def _log(request: HttpRequest, target: Model | None, name: str, message: str) -> None:
    content_type = ContentType.objects.get_for_model(target or UsageCount, for_concrete_model=False)
    LogEntry.objects.create(
        user_id=request.user.pk or 0,
        content_type=content_type,
        object_id=None if target is None else str(target.pk),
        object_repr=name[:200],
        action_flag=CHANGE,
        change_message=message,
    )
