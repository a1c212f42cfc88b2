"""Pages the admin adds under "Usage counts": the dashboard, the client inspector (with
"explain" and "reset"). :mod:`django_throttle.admin` mounts them; each checks its own
permission: viewing usage counts to look, changing tiers to reset."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext as _

from django_throttle.admin.charts import LABELS, stacked_bars
from django_throttle.admin.dashboard import CHARTED, WINDOWS, Timeline, timeline
from django_throttle.backends import BackendError
from django_throttle.backends.breaker import get_breaker
from django_throttle.conf import app_settings
from django_throttle.plain import plain_text
from django_throttle.policy import live as policy_module
from django_throttle.usage.names import client_names
from django_throttle.usage.reports import report

__all__ = ["dashboard", "inspector", "reset_client"]

#: Clients listed under "most limited".
TOP_LIMITED = 20


def dashboard(request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> HttpResponse:
    """Requests per minute by outcome (overall, per tier, per endpoint; each request once,
    under the tier that served it), checks before authentication per rule, the most limited
    clients (named, linked to their user or API key, estimates marked ``≈``) and the
    backend's health. Needs the "view usage count" permission."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    window = request.GET.get("window", "hour")
    if window not in WINDOWS:
        window = "hour"
    data = timeline(window)
    fmt = "%H:%M"
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Rate limiting dashboard"),
        "opts": model_admin.model._meta,
        "window": window,
        "windows": list(WINDOWS),
        "timeline": data,
        "outcomes": [(name, LABELS[name], data.overall.totals.get(name, 0)) for name in CHARTED],
        "overall": stacked_bars(_("All requests"), data.starts, data.overall.bars, time_format=fmt),
        "tier_charts": _charts(data, data.by_tier, fmt),
        "endpoint_charts": _charts(data, data.by_endpoint, fmt),
        "before_authentication_charts": _charts(data, data.before_authentication, fmt),
        **_most_limited(window),
        "inspect_url": reverse("admin:django_throttle_usagecount_inspect"),
        "health": _health(),
    }
    return TemplateResponse(request, "admin/django_throttle/dashboard.html", context)


def _charts(data: Timeline, charts: list[Any], fmt: str) -> list[dict[str, Any]]:
    return [
        {
            "title": chart.title,
            "totals": chart.totals,
            "svg": stacked_bars(chart.title, data.starts, chart.bars, time_format=fmt),
        }
        for chart in charts
    ]


def _most_limited(window: str) -> dict[str, Any]:
    """The clients denied most, each with who it is (:func:`client_names`), and which of
    their figures are estimates (sampled or folded: see ``Report.estimated_fields``)."""
    span, _step = WINDOWS[window]
    since = datetime.now(tz=UTC) - timedelta(minutes=span - 1)
    try:
        result = report(since, "client", None)
    except BackendError:
        return {"limited": [], "estimated": (), "sample": 1}
    limited = [row for row in result.rows if row.denied or row.shadow_denied]
    limited.sort(key=lambda row: (-row.denied, -row.shadow_denied, row.key))
    limited = limited[:TOP_LIMITED]
    names = client_names(row.key for row in limited)
    return {
        "limited": [{"row": row, "client": names[row.key]} for row in limited],
        "estimated": result.estimated_fields,
        "sample": result.sample,
    }


def _health() -> dict[str, Any]:
    """Whether the backend answers (and how fast), the breaker, and the policy snapshot."""
    from django_throttle.backends import get_backend

    breaker = get_breaker()
    started = time.perf_counter()
    error = ""
    try:
        version = get_backend().get_policy_version()
        latency_ms: float | None = (time.perf_counter() - started) * 1e3
    except BackendError as exc:
        version, latency_ms, error = None, None, plain_text(f"{type(exc).__name__}: {exc}")
    snapshot = policy_module.last()
    return {
        "backend": app_settings.BACKEND.rsplit(".", 1)[-1],
        "reachable": not error,
        "error": error,
        "latency_ms": latency_ms,
        "breaker": breaker.state,
        "breaker_opened": breaker.opened,
        "last_error": plain_text(breaker.last_error) if breaker.last_error else "",
        "last_error_at": (
            datetime.fromtimestamp(breaker.last_error_at, tz=UTC)
            if breaker.last_error_at is not None
            else None
        ),
        "policy_version": version,
        "policy_age": (
            None
            if snapshot is None or not snapshot.compiled_at
            else max(0.0, policy_module.clock() - snapshot.compiled_at)
        ),
        "tiers": None if snapshot is None else len(snapshot.tiers),
    }


# --- the inspector ----------------------------------------------------------------------------


def inspector(request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> HttpResponse:
    """One client's tier (and why) and every counter its requests meet (by client, by IP
    address, by username; shared ceilings marked), an "explain" form for a request it might
    send, and a button to reset its counters (confirmed on a second page)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    from django_throttle.inspection.clients import inspect
    from django_throttle.inspection.explanations import explain
    from django_throttle.inspection.subjects import UnknownClient, parse_client
    from django_throttle.models.fields import HTTP_METHODS

    text = request.GET.get("client", "").strip()
    method = request.GET.get("method", "GET").strip().upper()
    if method not in HTTP_METHODS:
        method = "GET"
    path = request.GET.get("path", "").strip()
    username = request.GET.get("username", "").strip() or None
    address = request.GET.get("ip", "").strip() or None
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "title": _("Inspect a client"),
        "opts": model_admin.model._meta,
        "client_text": text,
        "method": method,
        "path": path,
        "username": username or "",
        "address": address or "",
        "methods": HTTP_METHODS,
        "can_reset": _can_reset(request),
    }
    if text:
        try:
            subject = parse_client(text)
            if address is not None:
                parse_client(f"ip:{address}")  # a bad address is an error, not "none"
            context["inspection"] = inspect(subject, username, address)
            if path:
                context["explanation"] = explain(
                    subject, method, path, address=address, username=username
                )
        except UnknownClient as exc:
            context["error"] = _("Unknown client: %(reason)s.") % {"reason": exc}
        except BackendError as exc:
            context["error"] = _("The backend could not be read: %(error)s") % {"error": exc}
    return TemplateResponse(request, "admin/django_throttle/inspector.html", context)


def reset_client(request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> HttpResponse:
    """Confirm (GET), then clear (POST, CSRF-checked) every counter of one client (by
    client, by its address, by its username; never a shared ceiling), recorded in the admin
    history. Needs the permission to change tiers."""
    from django.contrib import messages
    from django.http import HttpResponseRedirect
    from django.utils.http import urlencode

    from django_throttle.inspection.clients import counters
    from django_throttle.inspection.resets import reset_counters
    from django_throttle.inspection.subjects import UnknownClient, parse_client

    if not _can_reset(request):
        raise PermissionDenied
    data = request.POST if request.method == "POST" else request.GET
    if data.get("ceiling"):
        return _reset_ceiling(request, model_admin, data.get("ceiling", "").strip())
    text = data.get("client", "").strip()
    username = data.get("username", "").strip() or None
    address = data.get("ip", "").strip() or None
    inspect_url = reverse("admin:django_throttle_usagecount_inspect")
    try:
        subject = parse_client(text)
        if address is not None:
            parse_client(f"ip:{address}")
    except UnknownClient as exc:
        messages.error(request, _("Unknown client: %(reason)s.") % {"reason": exc})
        return HttpResponseRedirect(inspect_url)
    query = {"client": text, "username": username or "", "ip": address or ""}
    back = f"{inspect_url}?{urlencode({k: v for k, v in query.items() if v})}"
    if request.method == "POST":
        try:
            found = reset_counters(subject, username=username, address=address)
        except BackendError as exc:
            messages.error(request, _("The backend could not reset: %(error)s") % {"error": exc})
            return HttpResponseRedirect(back)
        log_reset(request, subject, [counter.limit for counter in found])
        messages.success(
            request,
            _("Reset %(count)d bucket(s) of %(client)s.")
            % {"count": len(found), "client": subject.label},
        )
        return HttpResponseRedirect(back)
    try:
        found = [c for c in counters(subject, username, address) if not c.limit.shared]
    except BackendError as exc:
        messages.error(request, _("The backend could not be read: %(error)s") % {"error": exc})
        return HttpResponseRedirect(back)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Reset the buckets of %(client)s?") % {"client": subject.label},
        "opts": model_admin.model._meta,
        "subject": subject,
        "client_text": text,
        "username": username or "",
        "address": address or "",
        "counters": found,
        "back": back,
    }
    return TemplateResponse(request, "admin/django_throttle/reset_confirmation.html", context)


def _reset_ceiling(
    request: HttpRequest, model_admin: admin.ModelAdmin[Any], limit_id: str
) -> HttpResponse:
    """Confirm (GET), then refill (POST) one shared limit in every key shard: a ceiling's
    own reset, recorded in the admin history (resetting a client never touches it)."""
    from django.contrib import messages
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType
    from django.http import HttpResponseRedirect
    from django.utils.http import urlencode

    from django_throttle.inspection.resets import reset_ceilings, shared_limits
    from django_throttle.models import UsageCount

    data = request.POST if request.method == "POST" else request.GET
    client = data.get("client", "").strip()
    inspect_url = reverse("admin:django_throttle_usagecount_inspect")
    back = f"{inspect_url}?{urlencode({'client': client})}" if client else inspect_url
    limit = shared_limits().get(limit_id)
    if limit is None:
        messages.error(request, _("%(id)r is not a shared limit.") % {"id": limit_id})
        return HttpResponseRedirect(inspect_url)
    if request.method == "POST":
        try:
            reset_ceilings([limit_id])
        except BackendError as exc:
            messages.error(request, _("The backend could not reset: %(error)s") % {"error": exc})
            return HttpResponseRedirect(back)
        LogEntry.objects.create(
            user_id=request.user.pk or 0,
            content_type=ContentType.objects.get_for_model(UsageCount),
            object_id=None,
            object_repr=(limit.name or limit.id)[:200],
            action_flag=CHANGE,
            change_message=f"Reset the shared limit {limit.name or limit.id} in every key shard",
        )
        messages.success(
            request,
            _("Reset the shared limit %(limit)s for every client.")
            % {"limit": limit.name or limit.id},
        )
        return HttpResponseRedirect(back)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Reset the shared limit %(limit)s?") % {"limit": limit.name or limit.id},
        "opts": model_admin.model._meta,
        "ceiling": limit,
        "client_text": client,
        "back": back,
    }
    return TemplateResponse(request, "admin/django_throttle/reset_confirmation.html", context)


def _can_reset(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    return bool(user is not None and user.has_perm("django_throttle.change_tier"))


def log_reset(request: HttpRequest, subject: Any, limits: list[Any]) -> None:
    """An admin history entry: against the user or API key when there is one, else under
    usage counts with the client's name."""
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    from django_throttle.models import UsageCount

    target = subject.user or subject.api_key
    content_type = ContentType.objects.get_for_model(target or UsageCount, for_concrete_model=False)
    names = ", ".join(limit.name or limit.id for limit in limits) or "none"
    LogEntry.objects.create(
        user_id=request.user.pk or 0,
        content_type=content_type,
        object_id=None if target is None else str(target.pk),
        object_repr=subject.label[:200],
        action_flag=CHANGE,
        change_message=f"Reset the rate limit buckets of {subject.client}: {names}",
    )
