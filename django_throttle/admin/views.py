"""Pages the admin adds under "Usage counts": the dashboard, the client inspector (with
"explain" and "reset"). :mod:`django_throttle.admin` mounts them; each checks its own
permission: viewing usage counts to look, changing tiers to reset. What they show comes from
the inspection and usage modules, the ones ``manage.py`` commands read too.

The dashboard shows requests per time bucket by outcome, overall, per tier and per endpoint,
over the last hour or day, drawn as stacked bars (:func:`timeline`). Each request is counted
once in the overall, tier and endpoint charts, under the tier that served it. Checks made
before authentication (a credential rule's check of a login or an ``Authorization`` header,
which the request's tier then checks again) are a series of their own, charted per rule in
:attr:`Timeline.before_authentication`. Minutes the rollup copied come from ``UsageCount``
total rows; later minutes come from the backend's live counts (the same split as ``manage.py
throttle_usage``). Nothing is written.

The charts are inline SVG drawn on the server (:func:`stacked_bars`): no JavaScript, no CDN,
nothing to download. Colours come from CSS classes (``dt-allowed`` ...) and the axes use the
admin's own colour variables, so a chart follows the admin's light and dark themes. Every bar
carries a ``<title>`` (the browser's tooltip: the time and each count) and every chart its
totals as ``data-*`` attributes, so people and tests read the same numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html import escape
from itertools import count
from typing import Any, NamedTuple

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.decorators import permission_required
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_throttle.admin.base import AppAdmin, stored_time
from django_throttle.backends import BackendError, get_backend
from django_throttle.backends.adaptive_store import AdaptiveStore
from django_throttle.backends.redis_nodes import get_breaker
from django_throttle.backends.usage_store import UsageStore
from django_throttle.conf import app_settings
from django_throttle.inspection.budget import ReadBudget, SlowRead
from django_throttle.inspection.clients import (
    BadAddress,
    BadRegion,
    checked_address,
    checked_region,
    counters,
    explain,
    inspect,
    reset_ceilings,
    reset_counters,
    shared_limits,
)
from django_throttle.inspection.subjects import Subject, UnknownClient, parse_client
from django_throttle.models import UsageCount
from django_throttle.models.fields import HTTP_METHODS
from django_throttle.policy import live as policy_module
from django_throttle.redaction import plain_text
from django_throttle.request.core import throttled_status
from django_throttle.usage import accounting
from django_throttle.usage.names import client_names
from django_throttle.usage.reports import (
    NO_ENDPOINT,
    NO_TIER,
    newest_stored,
    report,
    stored_through,
)

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
    budget = ReadBudget()
    data = timeline(window, budget)
    # A Redis that did not answer the timeline is not asked again by this page: each other
    # section shows that error at once, instead of waiting out a socket timeout of its own
    # (four timeouts for one page, with a hung Redis). Not on a Redis Cluster, whose other
    # reads may be on primaries that answer (its health lists each primary's answer). A
    # Redis that answers slowly is read until the page's budget is spent (ReadBudget), on
    # any topology; a cluster's health is read all the same, as it tells which primary is slow.
    clustered = bool(getattr(get_backend(), "on_cluster", False))
    unanswered = "" if clustered else data.unread
    slow = "" if unanswered else budget.exhausted()
    health = _health() if clustered else _health(unanswered or slow, slow=bool(slow))
    factors = load_factors(window, unanswered or budget.exhausted())
    return model_admin.render_page(
        request,
        "dashboard",
        _("Rate limiting dashboard"),
        window=window,
        windows=list(WINDOWS),
        timeline=data,
        outcomes=[(name, LABELS[name], data.overall.totals[name]) for name in CHARTED],
        health=health,
        load_factors=factors,
        **_most_limited(window, unanswered, budget),
    )


def load_factors(window: str, unanswered: str = "") -> dict[str, Any]:
    """Each tier's automatic factor over the window (the adaptive controller's history: one
    backend read) as a line chart, with its load factor and floor; only tiers whose limits
    are or were scaled in the window. ``error``: the history could not be read (not read
    when ``unanswered`` says why the backend did not answer this page)."""
    from django_throttle.models import Tier

    if unanswered:
        return {"charts": [], "error": unanswered}

    span, _step = WINDOWS[window]
    now = math.floor(time.time() / 60)
    first = now - span + 1
    store = AdaptiveStore.of(get_backend())
    history: dict[int, list[tuple[int, float]]] = {}
    current: dict[int, float] = {}
    if store is not None:
        try:
            history, current = store.history(first), store.factors()
        except BackendError as exc:
            # No chart: each would draw a factor of 100 % that nothing read.
            return {"charts": [], "error": plain_text(f"{type(exc).__name__}: {exc}")}
    starts = [datetime.fromtimestamp((first + i) * 60, tz=UTC) for i in range(span)]
    charts = []
    for tier in Tier.objects.order_by("priority", "name"):
        points = history.get(tier.pk, [])
        automatic = current.get(tier.pk, 1.0)
        if tier.load_factor == 100 and automatic >= 1.0 and all(f >= 1.0 for _, f in points):
            continue
        series, value = [], points[0][1] if points else automatic
        by_minute = dict(points)
        for minute in range(first, now + 1):
            value = by_minute.get(minute, value)
            series.append(value)
        charts.append(
            {
                "title": tier.name,
                "load_factor": tier.load_factor,
                "min_factor": tier.min_factor,
                "automatic": round(automatic * 100),
                "svg": factor_line(str(tier.name), starts, series),
            }
        )
    return {"charts": charts, "error": ""}


def _most_limited(
    window: str, unanswered: str = "", budget: ReadBudget | None = None
) -> dict[str, Any]:
    """The clients denied most, each with who it is (:func:`client_names`), which of their
    figures are estimates (folded: see ``Report.estimated_fields``), and ``limited_error``:
    why the backend could not be read (then the list is the database's minutes only, each
    count a lower bound: not "no client was limited", which nobody knows). ``unanswered``:
    the backend did not answer this page; the database's minutes only, at once. Once the
    page's ``budget`` is spent, its reads are not made either."""
    span, _step = WINDOWS[window]
    since = datetime.now(tz=UTC) - timedelta(minutes=span - 1)
    with closing(accounting.get_store()) as store:
        reader = _Unanswered(store, unanswered, budget) if unanswered or budget else store
        result = report(since, "client", None, reader)  # type: ignore[arg-type]
    error = result.unread
    limited = [row for row in result.rows if row.denied or row.shadow_denied]
    limited = sorted(limited, key=lambda row: (-row.denied, -row.shadow_denied, row.key))
    names = client_names(row.key for row in limited[:TOP_LIMITED])
    return {
        "limited": [{"row": row, "client": names[row.key]} for row in limited[:TOP_LIMITED]],
        "estimated": result.estimated_fields,
        "limited_error": error,
    }


class _Unanswered:
    """A usage store whose backend did not answer this page: its figures (``top_size``...)
    are the store's, every read fails at once with the error the page met (``error``), or
    with :class:`SlowRead` once the page's ``budget`` is spent."""

    def __init__(self, store: UsageStore, error: str, budget: ReadBudget | None = None) -> None:
        self._store, self._error, self._budget = store, error, budget

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if not callable(value):
            return value

        def unanswered(*args: Any, **kwargs: Any) -> Any:
            if self._error:
                raise BackendError(self._error)
            if self._budget is not None:
                self._budget.check()
            return value(*args, **kwargs)

        return unanswered


def _health(unanswered: str = "", slow: bool = False) -> dict[str, Any]:
    """Whether the backend answers (and how fast), the breaker, and the policy snapshot; on a
    Redis Cluster, each primary's answer and breaker too. ``unanswered``: why the backend did
    not answer this page (then it is not asked again); ``slow``: it answered, but too slowly
    for the page to ask it more (``unanswered`` says so)."""
    breaker, snapshot = get_breaker(), policy_module.last()
    started, error = time.perf_counter(), unanswered
    if not error:
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
        "backend": app_settings.backend_path.rsplit(".", 1)[-1],
        "reachable": not error,
        "error": error,
        #: Not asked: the page's budget for Redis was spent (it answers, slowly).
        "slow": slow,
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
    #: The region the client is seen from (``None``: the one its requests show).
    region: str | None = None

    @classmethod
    def read(cls, data: QueryDict) -> _Query:
        text, username, address, region = (
            data.get(name, "").strip() for name in ("client", "username", "ip", "region")
        )
        return cls(text, username or None, address or None, region or None)

    def subject(self) -> Subject:
        """The client named; a bad address is an error too, not "none". Raises
        :class:`UnknownClient`, :class:`BadAddress` for an address that is no IP address, or
        :class:`BadRegion` for a region that is no code."""
        subject = parse_client(self.client_text)
        checked_address(self.address)
        checked_region(self.region)
        return subject

    @property
    def url(self) -> str:
        """The inspector, showing this client again."""
        query = {
            "client": self.client_text,
            "username": self.username,
            "ip": self.address,
            "region": self.region,
        }
        encoded = urlencode({name: value for name, value in query.items() if value})
        return f"{reverse(INSPECT)}?{encoded}" if encoded else reverse(INSPECT)


def address_error(exc: BadAddress) -> str:
    """The inspector's error for an address that is no IP address: it names the address
    field (the client may be fine)."""
    return _("From address: %(reason)s.") % {"reason": exc}


def region_error(exc: BadRegion) -> str:
    """The inspector's error for a region that is no code: it names the region field (the
    client may be fine)."""
    return _("From region: %(reason)s.") % {"reason": exc}


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
        budget = ReadBudget()  # the explanation's reads share it (see ReadBudget)
        try:
            subject = query.subject()
            context["inspection"] = inspect(
                subject, query.username, query.address, query.region, budget
            )
            if path:
                context["explanation"] = explain(
                    subject,
                    method,
                    path,
                    address=query.address,
                    username=query.username,
                    region=query.region,
                    budget=budget,
                )
                # 503 for a request the service sheds, as the server answers it.
                decision = context["explanation"].decision
                if decision is not None:
                    context["denied_status"] = throttled_status(decision)
        except BadAddress as exc:  # an UnknownClient too
            context["error"] = address_error(exc)
        except UnknownClient as exc:
            context["error"] = _("Unknown client: %(reason)s.") % {"reason": exc}
        except BadRegion as exc:
            context["error"] = region_error(exc)
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
    except BadAddress as exc:  # an UnknownClient too
        return _back(request, reverse(INSPECT), address_error(exc), messages.ERROR)
    except UnknownClient as exc:
        error = _("Unknown client: %(reason)s.") % {"reason": exc}
        return _back(request, reverse(INSPECT), error, messages.ERROR)
    except BadRegion as exc:
        return _back(request, reverse(INSPECT), region_error(exc), messages.ERROR)
    except BackendError as exc:
        return _back(request, reverse(INSPECT), backend_failed(request, exc), messages.ERROR)
    try:
        if request.method == "POST":
            done = reset_counters(
                subject, username=query.username, address=query.address, region=query.region
            )
            log_reset(request, subject, [counter.limit for counter, held in done if held])
            return _back(request, query.url, reset_done(subject.label, done))
        found = [
            c
            for c in counters(subject, query.username, query.address, checked_region(query.region))
            if not c.limit.shared
        ]
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
        ((_limit, held),) = reset_ceilings([limit_id])
    except BackendError as exc:
        return _back(request, query.url, backend_failed(request, exc), messages.ERROR)
    if not held:
        done = _("Nothing to reset: no key shard held state of the shared limit %(limit)s.")
        return _back(request, query.url, done % {"limit": name})
    _log(request, None, name, f"Reset the shared limit {name} in every key shard")
    done = _("Reset the shared limit %(limit)s for every client.") % {"limit": name}
    return _back(request, query.url, done)


def reset_done(client: str, found: Sequence[tuple[Any, bool]]) -> str:
    """What a reset of ``client`` did, in words: how many of the ``found`` counters (each
    with whether it held state) were cleared; a whole bucket holds none."""
    cleared = sum(held for _counter, held in found)
    if not found:
        return _("Nothing to reset for %(client)s: no limits apply to it.") % {"client": client}
    if not cleared:
        return _(
            "Nothing to reset for %(client)s: none of its %(count)d counter(s) held anything."
        ) % {
            "client": client,
            "count": len(found),
        }
    return _("Cleared %(cleared)d of the %(count)d counter(s) of %(client)s.") % {
        "cleared": cleared,
        "count": len(found),
        "client": client,
    }


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


# The dashboard's figures and charts, read from the usage counts.


#: Window name → (minutes shown, minutes per bar).
WINDOWS = {"hour": (60, 1), "day": (1440, 15)}
#: Outcomes drawn, bottom to top (the others are rare and in the usage report).
CHARTED = ("allowed", "denied", "shadow_denied")
#: What each outcome is called in the legend and tooltips.
LABELS = {"allowed": "allowed", "denied": "denied", "shadow_denied": "shadow would-deny"}
#: What a chart reports beside its bars: the measures, and the requests the backend failed
#: (served uncounted or refused by the failure mode), which no limit decided.
_BESIDE = (*accounting.MEASURES, accounting.FAILED_OPEN, accounting.FAILED_CLOSED)
#: What a chart sums per bar: the charted outcomes, and what it reports beside them.
_SUMMED = (*CHARTED, *_BESIDE)
#: Charts drawn per tier or endpoint; the quieter ones are summed into one "(other)" chart.
MAX_CHARTS = 12
OTHER = "(other)"

#: (tier, endpoint) -> outcome -> per-bar counts
_Cells = dict[tuple[str, str], dict[str, list[int]]]

WIDTH, HEIGHT = 720, 170
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 8, 22


@dataclass
class Chart:
    """Counts per bar (starting at ``starts``) for each charted outcome, their totals, and
    the chart drawn."""

    title: str
    starts: list[datetime]
    bars: dict[str, list[int]]
    #: Per bar, each of :data:`~.accounting.MEASURES`: requests served after waiting their
    #: turn, their waits summed (ms), and requests shed (503); and the requests the backend
    #: failed, served uncounted (``failed_open``) or refused (``failed_closed``).
    measures: dict[str, list[int]] = field(default_factory=dict)

    @property
    def totals(self) -> dict[str, int]:
        return {outcome: sum(series) for outcome, series in self.bars.items()}

    @property
    def delayed(self) -> int:
        """Requests served after waiting their turn (a delaying limit): part of allowed."""
        return sum(self.measures.get(accounting.DELAYED, ()))

    @property
    def shed(self) -> int:
        """Requests refused with 503 to protect the service: part of denied."""
        return sum(self.measures.get(accounting.SHED, ()))

    @property
    def failed_open(self) -> int:
        """Requests served uncounted because the backend failed (failure mode open)."""
        return sum(self.measures.get(accounting.FAILED_OPEN, ()))

    @property
    def failed_closed(self) -> int:
        """Requests refused (503) because the backend failed (failure mode closed)."""
        return sum(self.measures.get(accounting.FAILED_CLOSED, ()))

    @property
    def mean_wait(self) -> float:
        """Their mean wait, in seconds (0 when none waited)."""
        waited = sum(self.measures.get(accounting.WAITED_MS, ()))
        return waited / 1000 / self.delayed if self.delayed else 0.0

    @property
    def svg(self) -> SafeString:
        return stacked_bars(self.title, self.starts, self.bars, self.measures)


@dataclass
class Timeline:
    """The window's charts. ``partial``: some minute of the window could not be read
    (backend down), so counts are partial. ``before_authentication``: checks before
    authentication, per endpoint rule (not in the other charts)."""

    overall: Chart
    by_tier: list[Chart]
    by_endpoint: list[Chart]
    partial: bool
    before_authentication: list[Chart]
    #: Why the backend could not be read (plain text), when it could not.
    unread: str = ""


def timeline(window: str, budget: ReadBudget | None = None) -> Timeline:
    """Per-bar counts for ``window`` (a key of :data:`WINDOWS`) ending with the current minute;
    the backend's reads stop once ``budget`` (the page's) is spent, the counts then partial."""
    with closing(accounting.get_store()) as store:  # the client it reads on closed after
        reader = _Unanswered(store, "", budget) if budget is not None else store
        return _timeline(window, reader)  # type: ignore[arg-type]


def _timeline(window: str, store: UsageStore) -> Timeline:
    """Minutes up to the one the database holds last (the watermark, else its newest row, as
    :func:`~django_throttle.usage.reports.report` splits them) from ``UsageCount`` rows, later
    ones from the backend. A backend that does not answer its first (short) call is not read
    again: the page shows the database's minutes, marked partial, at once."""
    span, step = WINDOWS[window]
    partial, unread = False, ""
    try:
        now = store.now_minute()
        split = stored_through(store)
    except BackendError as exc:
        now, split, partial = math.floor(time.time() / 60), newest_stored(), True
        unread = _why(exc)
    first = now - span + 1
    first -= first % step  # bars start on whole steps (xx:00, xx:15 ...)
    bars = (now - first) // step + 1
    cells: _Cells = {}

    def add(minute: int, tier: str, endpoint: str, values: Iterable[int]) -> None:
        index = (minute - first) // step
        if 0 <= index < bars:
            row = cells.setdefault((tier, endpoint), {o: [0] * bars for o in _SUMMED})
            for outcome, n in zip(accounting.COLUMNS, values, strict=False):
                if outcome in row:
                    row[outcome][index] += n

    if split is not None and split >= first:
        # One row per minute, tier and endpoint (the table's unique constraint): nothing to sum.
        rows = UsageCount.objects.filter(
            client=accounting.ALL,
            window_start__gte=stored_time(first * 60),
            window_start__lte=stored_time(split * 60),
        ).values_list("window_start", "tier", "endpoint", *accounting.COLUMNS)
        for start, tier, endpoint, *values in rows:
            add(_minute(start), tier, endpoint, values)
    live: dict[int, Any] = {}
    if not partial:
        live_from = first if split is None else max(first, split + 1)
        try:
            live = store.read(range(live_from, now + 1), totals=True, clients=False)
        except BackendError as exc:
            partial, unread = True, _why(exc)
    for minute, counts in live.items():
        for usage_field, values in counts.totals.items():
            add(minute, *accounting.split_field(usage_field), values)

    served = {key: row for key, row in cells.items() if key[0] != accounting.BEFORE_AUTHENTICATION}
    checks = {key: row for key, row in cells.items() if key[0] == accounting.BEFORE_AUTHENTICATION}
    starts = [stored_time((first + i * step) * 60) for i in range(bars)]
    return Timeline(
        overall=_sum(_("All requests"), served.values(), starts),
        by_tier=_charts(served, 0, starts, NO_TIER),
        by_endpoint=_charts(served, 1, starts, NO_ENDPOINT),
        partial=partial,
        before_authentication=_charts(checks, 1, starts, NO_ENDPOINT),
        unread=unread,
    )


def _why(exc: BackendError) -> str:
    """Why the backend was not read, as the page says it: the error, or the page's spent
    budget in words (a read not made raised no error of Redis's)."""
    return str(exc) if isinstance(exc, SlowRead) else plain_text(f"{type(exc).__name__}: {exc}")


def _charts(cells: _Cells, part: int, starts: list[datetime], blank: str) -> list[Chart]:
    """One chart per tier (``part`` 0) or endpoint (1), busiest first, the quietest summed."""
    grouped: dict[str, list[dict[str, list[int]]]] = {}
    for key, row in cells.items():
        grouped.setdefault(plain_text(key[part]) or blank, []).append(row)
    charts = sorted(
        (_sum(name, rows, starts) for name, rows in grouped.items()),
        key=lambda chart: (-sum(chart.totals.values()), chart.title),
    )
    if len(charts) > MAX_CHARTS:
        rest = charts[MAX_CHARTS - 1 :]
        counts = [{**chart.bars, **chart.measures} for chart in rest]
        merged = _sum(f"{OTHER}: {len(rest)} more", counts, starts)
        charts = [*charts[: MAX_CHARTS - 1], merged]
    return charts


def _sum(title: str, rows: Iterable[dict[str, list[int]]], starts: list[datetime]) -> Chart:
    """One chart of ``rows`` added up bar by bar (zero bars when there are none)."""
    rows, zero = list(rows), [0] * len(starts)
    sums = {o: list(map(sum, zip(zero, *(row[o] for row in rows), strict=True))) for o in _SUMMED}
    measures = {o: sums.pop(o) for o in _BESIDE}
    return Chart(title, starts, sums, measures)


def _minute(value: datetime) -> int:
    value = timezone.make_aware(value) if timezone.is_naive(value) else value
    return math.floor(value.timestamp() / 60)


# --- drawing ----------------------------------------------------------------------------------


def stacked_bars(
    title: str,
    starts: Sequence[datetime],
    bars: dict[str, list[int]],
    measures: dict[str, list[int]] | None = None,
) -> SafeString:
    """One chart: a bar per start time (labelled hours and minutes), the outcomes stacked in
    ``bars`` order; a bar's tooltip also says how many of its requests were delayed (and their
    mean wait) or shed (``measures``: per bar, :data:`~.accounting.MEASURES`)."""
    top = _nice_ceiling(max(map(sum, zip(*bars.values(), strict=True)), default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(starts), 1)
    bar_w = max(slot * 0.8, 1.0)
    measures = measures or {}
    delayed = measures.get(accounting.DELAYED) or [0] * len(starts)
    waited = measures.get(accounting.WAITED_MS) or [0] * len(starts)
    shed = measures.get(accounting.SHED) or [0] * len(starts)
    totals = {**bars, accounting.DELAYED: delayed, accounting.WAITED_MS: waited, "shed": shed}
    data = " ".join(f'data-{name.replace("_", "-")}="{sum(n)}"' for name, n in totals.items())
    parts = [
        f'<svg class="dt-chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" data-title="{escape(title)}" {data} '
        f'preserveAspectRatio="none" xmlns="http://www.w3.org/2000/svg">'
    ]
    _grid(parts, plot_h, top, {tick: f"{tick:,}" for tick in (0, top // 2, top)})
    label_every = max(1, len(starts) // 6)
    for i, start in enumerate(starts):
        x = LEFT + i * slot + (slot - bar_w) / 2
        y: float = TOP + plot_h
        tip = [start.strftime("%H:%M")]
        for name, series in bars.items():
            tip.append(f"{LABELS.get(name, name)} {series[i]:,}")
            if name == accounting.ALLOWED and delayed[i]:
                mean = waited[i] / 1000 / delayed[i]
                tip[-1] += f" ({delayed[i]:,} delayed, mean wait {mean:.2f} s)"
            if name == accounting.DENIED and shed[i]:
                tip[-1] += f" ({shed[i]:,} shed: 503)"
            if series[i]:
                h = plot_h * series[i] / top
                y -= h
                parts.append(
                    f'<rect class="dt-{name.replace("_", "-")}" x="{x:.1f}" y="{y:.1f}" '
                    f'width="{bar_w:.1f}" height="{h:.1f}"/>'
                )
        _slot_tip(parts, i, slot, plot_h, ", ".join(tip), tip[0] if i % label_every == 0 else "")
    parts.append("</svg>")
    return mark_safe("".join(parts))  # numbers and escaped text only


def factor_line(title: str, starts: Sequence[datetime], factors: Sequence[float]) -> SafeString:
    """One tier's automatic factor per minute (0 to 100 %) as a step line, in the bar charts'
    frame and colours; each minute's tooltip says its time and factor."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(starts), 1)
    parts = [
        f'<svg class="dt-chart dt-factors" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" data-title="{escape(title)}" '
        f'data-last="{round(100 * factors[-1]) if factors else 100}" '
        f'preserveAspectRatio="none" xmlns="http://www.w3.org/2000/svg">'
    ]
    _grid(parts, plot_h, 100, {tick: f"{tick}%" for tick in (0, 50, 100)})
    points = []
    for i, factor in enumerate(factors):
        y = TOP + plot_h - plot_h * min(1.0, max(0.0, factor))
        points.append(f"{LEFT + i * slot:.1f},{y:.1f} {LEFT + (i + 1) * slot:.1f},{y:.1f}")
    parts.append(f'<polyline class="dt-factor" fill="none" points="{" ".join(points)}"/>')
    label_every = max(1, len(starts) // 6)
    for i, (start, factor) in enumerate(zip(starts, factors, strict=False)):
        label = start.strftime("%H:%M")
        tip = f"{label}: {factor:.0%}"
        _slot_tip(parts, i, slot, plot_h, tip, label if i % label_every == 0 else "")
    parts.append("</svg>")
    return mark_safe("".join(parts))  # numbers and escaped text only


def _grid(parts: list[str], plot_h: float, top: float, ticks: dict[int, str]) -> None:
    """A chart's horizontal grid lines, at each tick of a scale from 0 to ``top``, labelled
    on the left (``ticks``: tick → label)."""
    for tick, label in ticks.items():
        y = TOP + plot_h - plot_h * tick / top
        parts.append(
            f'<line class="dt-grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="dt-axis" x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">'
            f"{label}</text>"
        )


def _slot_tip(parts: list[str], i: int, slot: float, plot_h: float, tip: str, label: str) -> None:
    """A transparent full-height target over the ``i``-th slot of a chart, so every slot,
    even an empty one, has the tooltip ``tip``; and ``label`` under the slot, if any."""
    parts.append(
        f'<rect class="dt-hit" x="{LEFT + i * slot:.1f}" y="{TOP}" width="{slot:.1f}" '
        f'height="{plot_h}"><title>{escape(tip)}</title></rect>'
    )
    if label:
        parts.append(
            f'<text class="dt-axis" x="{LEFT + (i + 0.5) * slot:.1f}" y="{HEIGHT - 6}" '
            f'text-anchor="middle">{escape(label)}</text>'
        )


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2 or 5 times a power of ten that is at least ``value`` (at least 2,
    so the middle tick is a whole number)."""
    steps: Iterator[int] = (step * 10**power for power in count() for step in (1, 2, 5))
    return max(2, next(step for step in steps if step >= value))
