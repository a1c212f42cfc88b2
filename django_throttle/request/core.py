"""The one path every adapter calls: plan a request, make its backend call, answer with
headers.

**Plan** (:func:`make_plan`, plain: no backend call, no awaiting, the same for blocking and
async checks): the caller's identity, exemptions, and the tier and endpoint limits from the
compiled policy snapshot. Exempt users and addresses stop here (exempt views stop before, in
:func:`check` or the adapter), as do clients with no usable address (refused:
``conf.UNKNOWN_CLIENT``). What a rule and a tier come to is worked out once per policy version
and kept in the snapshot's store (``Policy.compiled``).

**Call**: the plan's backend calls are steps (sans I/O): generators that yield each typed
:data:`Call` they need (:class:`Hit`, :class:`Peek`, :class:`Refund`) and receive its reply, or
have its :class:`~django_throttle.backends.BackendError` raised at the ``yield``. Only the calls
differ between :func:`check` and :func:`acheck`: :func:`run` makes them blocking, :func:`arun`
awaited, through the process's circuit breaker. Counts kept while the backend was down are
pushed once it answers again.

**Reservations**: an endpoint rule's limits counted by IP address or username (rather than by
client) are counted with the client's in one call where the backend can (:class:`HitTogether`:
one server or Sentinel always, a Cluster when the keys share a slot), all or nothing across
the counters; else one more call per such counter, after the client's: all are taken, or,
when one denies, those already taken are given back (:func:`hit_groups`). Either way a
denied request consumes nothing anywhere. A rule that counts only successes or only
failures (``EndpointRule.counts``) reserves like any other, so concurrent requests never
pass its limits together; the :class:`Reservation` is left on the request and :func:`settle`
gives it back once the response shows an outcome the rule does not count (a status, or
Django's ``user_login_failed`` for it).

**Finish**: a reply the backend made becomes the decision as it is; a
:class:`~django_throttle.backends.BackendError` becomes the decision of the failure mode that
applies (open, closed or local), never an exception, counted in-process until the backend is
back, and recorded in usage. The decision is announced on :mod:`django_throttle.events`.

**Headers**: ``X-RateLimit-Limit`` is the reported limit's capacity, ``-Remaining`` whole
tokens left, ``-Reset`` whole seconds until that limit is full again. They describe enforced
limits only: a shadow rule's limits are counted and logged, never advertised. With
``DJANGO_THROTTLE_IETF_HEADERS`` the IETF ``RateLimit`` / ``RateLimit-Policy`` fields
(draft-ietf-httpapi-ratelimit-headers) are added: ``q`` is a limit's capacity and ``w`` the
seconds its bucket takes to refill (a calendar quota's nominal window: a day, 30 days for a
month; ``Limit.nominal_window``). ``X-RateLimit-Degraded`` says the backend could not answer
and the failure mode decided: ``open`` (served uncounted) or ``local`` (counted per process).
A refusal is a 429 (or the failure status) with ``Retry-After`` and a JSON body, or a page for
a browser (:func:`throttled_page`).

**Worker shedding**: before any backend call, this process refuses sheddable, then default
requests on its own when it is saturated (:func:`worker_refusal`: its busy threads,
:data:`busy`, or its event loop's lag, :class:`LagWatch`), with no I/O.

No DRF here. The adapters' entry points (:func:`check`, :func:`acheck`, :func:`settle`,
:func:`asettle`, :func:`plan`, :func:`add_headers`, :func:`throttled_response`) are promised
to every adapter unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import threading
import time
import urllib.parse
import weakref
from collections.abc import Generator, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypedDict, TypeVar, Unpack

from asgiref.sync import sync_to_async
from django.http import HttpResponse, HttpResponseBase, JsonResponse
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.utils.functional import LazyObject
from django.utils.translation import gettext, ngettext

from django_throttle import events
from django_throttle.backends import ArgumentRefused, BackendError, get_backend
from django_throttle.backends.base import Backend, NodeUnavailable, maybe_leased
from django_throttle.backends.redis import IF_DENIED
from django_throttle.backends.redis_nodes import get_breaker
from django_throttle.conf import FAILURE_STATUS, UNKNOWN_CLIENT, app_settings
from django_throttle.exemptions import is_exempt_view
from django_throttle.identity import UNIDENTIFIED, Identity, client_ip
from django_throttle.policy import live as policy_module
from django_throttle.policy.live import (
    CountedGroup,
    EndpointPolicy,
    Policy,
    Shedding,
    TierPolicy,
    exempt_client,
    import_resolver,
    request_region,
)
from django_throttle.rates import FLEET, UNLIMITED, WORKER, Algorithm, Decision, Limit, Rate
from django_throttle.redaction import log_text
from django_throttle.request import leases
from django_throttle.request.usernames import unread_username, username_counters
from django_throttle.usage import accounting as usage

T = TypeVar("T")


class CheckOptions(TypedDict, total=False):
    """The keyword arguments of :func:`check` (and :func:`acheck`): see :func:`check`."""

    scope: str | None
    limits: Sequence[Limit] | None
    cost: int | None
    failure_mode: str | None
    credential: bool
    rule_only: bool


#: What a request meets when the backend cannot answer (see ``DJANGO_THROTTLE_FAILURE_MODE``).
FAILURE_MODES = ("open", "closed", "local")


def check(request: Any, **options: Unpack[CheckOptions]) -> Decision:
    """Count ``request`` against its limits and say whether it may proceed.

    Without ``limits``, the admin policy decides: the client's tier limits plus those of the
    endpoint rule matching ``scope``, the URL route name or the path. With ``limits`` (a
    decorator's inline rate), exactly those apply. ``rule_only`` counts only the limits of
    the rule matching ``scope`` (no route or path match, no tier limits): a check before
    authentication, whose view counts the tier's limits later. A ``credential`` check
    (login, token), or any check under a credential rule (one counting failures or by
    username), meets the rule's limits counted by IP address and by username of every tier,
    whatever the caller's: they protect the account named and the server, so a signed-in
    caller or an API key holder guessing another account's password meets them.

    When the backend cannot answer, the failure mode is the first of: ``failure_mode``, the
    endpoint rule's, the tier's, the setting; a credential check (a ``credential`` endpoint,
    or any check under a credential rule) counts ``"local"`` where the setting says
    ``"open"``: an outage must neither open the door to password guessing nor lock the
    operators out of the admin.

    An allowed request whose rule counts only successes or failures leaves a
    :class:`Reservation` on ``request.throttle_reservations`` for :func:`settle`.
    """
    if not app_settings.ENABLED:
        return UNLIMITED
    match = getattr(request, "resolver_match", None)
    if match is not None and is_exempt_view(match.func):
        return UNLIMITED
    return decide(request, policy_module.current(), options)


def decide(request: Any, policy: Policy | None, options: CheckOptions) -> Decision:
    """:func:`check` for an adapter that has found its view not exempt and fetched the policy
    snapshot itself (the DRF throttle): each is decided once per request, and passed down."""
    # Timed only when someone listens (events.watching, read here without a call).
    watched = events.request_decided.receivers or events.request_throttled.receivers
    started = time.perf_counter() if watched else 0.0
    planned = make_plan(request, policy, None, **options)
    if not isinstance(planned, Plan):
        return planned
    if policy is not None and policy.shedding is not None:
        shed = _worker_shed(planned, policy.shedding, request, started)
        if shed is not None:
            return shed
    # One call (no groups counted by IP address or username): made without steps around it.
    reply = run(planned.deciding(together=True)) if planned.groups else call_backend(planned)
    if (
        started
        or isinstance(reply, BackendError)
        or planned.refunds
        or reply.shadow
        or reply.leases
        or reply.wait
    ):
        return _finished(planned, reply, request, started)
    return reply  # counted_decision's plain case: the backend's decision as it is


async def acheck(
    request: Any, *, user_loaded: bool = False, **options: Unpack[CheckOptions]
) -> Decision:
    """:func:`check` for ``async def`` views, with the same keyword arguments: the backend
    call is awaited on the event loop (``redis.asyncio``), never in a thread. Only work that
    may touch the database (reloading the policy snapshot, at most once per refresh
    interval; loading the signed-in user) and pushing counts kept while the backend was down
    run in a worker thread.

    ``request.user`` as ``AuthenticationMiddleware`` leaves it is a lazy object whose first
    read queries the database, which Django refuses on an event loop
    (``SynchronousOnlyOperation``). So the request is counted by the user Django's async
    API gives, ``await request.auser()``, as Django's own async ``login_required`` does (an
    anonymous request without a session costs no thread); the identity resolver and the
    user exemptions see that user as ``request.user``, and the view gets
    the lazy one back untouched. ``user_loaded=True`` says an authentication step already
    ran and set ``request.user`` (DRF's): it is read as it is."""
    if not app_settings.ENABLED:
        return UNLIMITED
    match = getattr(request, "resolver_match", None)
    if match is not None and is_exempt_view(match.func):
        return UNLIMITED
    # Timed only when someone listens (events.watching, read here without a call).
    watched = events.request_decided.receivers or events.request_throttled.receivers
    started = time.perf_counter() if watched else 0.0
    counted_as = None if user_loaded else await _async_user(request)
    snapshot = policy_module.fresh()
    if snapshot is None:
        # Refreshed for an inline rate too: its exemptions and API keys come from the
        # snapshot, so a revoked key or a deleted exemption must end here within the refresh
        # interval, as on every other path (at most one thread per interval).
        snapshot = await sync_to_async(policy_module.current)()
    if counted_as is not None:
        # Shown to the identity resolver and the exemptions only (planning never awaits, so
        # nothing else runs meanwhile); the view gets the request's own user back.
        own, request.user = request.user, counted_as
    try:
        planned = make_plan(request, snapshot or policy_module.last(), None, **options)
    finally:
        if counted_as is not None:
            request.user = own
    if not isinstance(planned, Plan):
        return planned
    if planned.policy is not None and planned.policy.shedding is not None:
        shed = _worker_shed(planned, planned.policy.shedding, request, started)
        if shed is not None:
            return shed
    if planned.groups:
        reply = await arun(planned.deciding(together=True))
    else:
        reply = await acall_backend(planned)
    return _finished(planned, reply, request, started)


def settle(
    request: Any, status: int, *, first: int = 0, shown: Decision | None = None
) -> Decision | None:
    """Give back the reservations left on ``request`` whose outcome (``status``, and whether
    ``user_login_failed`` fired for it) their rule does not count. Call it once the outcome
    is known; a backend error only means the tokens stay taken. ``first`` leaves the
    reservations made before that many alone (a check inside another settles its own).

    Returns ``shown`` (the decision whose headers the response gets) as it stands once the
    tokens are back: the refund's own call says what its limits hold then, so
    ``X-RateLimit-Remaining`` counts the tokens given back (see :func:`settling`)."""
    return run(settling(request, status, first, shown))


async def asettle(
    request: Any, status: int, *, first: int = 0, shown: Decision | None = None
) -> Decision | None:
    """:func:`settle` for async stacks: the refunds are awaited on the event loop."""
    return await arun(settling(request, status, first, shown))


def _worker_shed(
    planned: Plan, protection: Shedding, request: Any, started: float
) -> Decision | None:
    """The 503 of this worker's own shedder when it is saturated
    (:func:`worker_refusal`), counted denied and shed, with no backend call; ``None`` to
    go on. A credential check (a login) is never shed here: it decides who may come in."""
    if planned.credential:
        return None
    criticality = planned.endpoint.criticality if planned.endpoint is not None else "default"
    decision = worker_refusal(protection, criticality)
    if decision is None:
        return None
    usage.record_shed(planned.field, planned.client)
    if started:
        _announce(request, planned, decision, time.perf_counter() - started)
    return decision


def _finished(
    planned: Plan, reply: Decision | BackendError, request: Any, started: float
) -> Decision:
    """The decision on a planned request, from the backend's ``reply`` (``started``: see
    :func:`check`)."""
    if isinstance(reply, BackendError):
        decision = degraded_decision(planned, reply, request)
    else:
        decision = counted_decision(planned, reply, request)
    if started:
        seconds = time.perf_counter() - started
        if decision.wait:
            # A request given a turn is announced once this process takes the turn or
            # refuses it (wait_turn): a refused turn is a 429, never an "allowed".
            request.throttle_announcing = (planned, seconds)
        else:
            _announce(request, planned, decision, seconds)
    return decision


def plan(
    request: Any, identity: Identity, region: str | None = None, **options: Unpack[CheckOptions]
) -> Plan | Decision:
    """What :func:`check` with these keyword arguments would count ``request`` against, were it sent
    by ``identity``, without calling the backend: the counters in the order the check calls
    them (``client``/``limits``, then ``groups``), the cost, the tier and the rule; or the
    decision it returns without counting (exempt, nothing applies). For the operator tools,
    which must see exactly what requests meet, never work it out another way. ``region``
    explains the client as seen from that region (else the one the request shows)."""
    match = getattr(request, "resolver_match", None)
    if match is not None and is_exempt_view(match.func):
        return UNLIMITED
    return make_plan(request, policy_module.current(), identity, region=region, **options)


async def _async_user(request: Any) -> Any:
    """The user to count ``request`` by on an event loop, when ``request.user`` is a lazy
    object that may query the database (see :func:`acheck`): ``await request.auser()``.
    ``None`` when ``request.user`` can be read as it is: a plain user object (set by a
    login, a remote-user middleware or an authentication class), or a lazy one without
    Django's ``auser`` twin, which is then evaluated in a worker thread."""
    user = getattr(request, "user", None)
    if not isinstance(user, LazyObject):  # a lazy object's type() is never its target's
        return None
    auser = getattr(request, "auser", None)
    if callable(auser):
        return await auser()
    await sync_to_async(bool)(user)  # evaluates the lazy object, in a worker thread
    return None


def _announce(request: Any, planned: Plan, decision: Decision, seconds: float) -> None:
    """Tell :mod:`django_throttle.events` listeners about a decision that took ``seconds``
    (only called when one listens)."""
    outcome = usage_outcome(decision)
    about = {
        "request": request,
        "decision": decision,
        "tier": planned.tier.slug if planned.tier is not None else "",
        "endpoint": planned.endpoint.name if planned.endpoint is not None else "",
    }
    events.send(events.request_decided, check, outcome=outcome, seconds=seconds, **about)
    if outcome in (usage.DENIED, usage.SHADOW_DENIED):
        shadow = outcome == usage.SHADOW_DENIED
        events.send(events.request_throttled, check, shadow=shadow, **about)


def call_backend(call: Call) -> Any:
    """Make one backend ``call``, blocking, through the process's circuit breaker: its reply,
    or the :class:`BackendError` that stopped it. Counts kept while the backend was down, or
    the backend's own tally when a push is due, are pushed once it answers, by the process's
    pusher thread (:func:`~django_throttle.usage.accounting.push_soon`): no request waits
    for a push."""
    try:
        with get_breaker().guard():
            backend = get_backend()
            reply = call.send(backend)
    except BackendError as exc:
        leases.abandon(maybe_leased(exc))  # slots the call may have taken, given back
        return exc
    # Plain attributes, read without a call: this runs on every request.
    if usage.pending or getattr(getattr(backend, "usage_tally", None), "waiting", False):
        usage.push_soon()
    return reply


async def acall_backend(call: Call) -> Any:
    """:func:`call_backend` on an event loop: the call is awaited (``redis.asyncio``, the
    backend's async method, through the call's ``asend``), never made in a thread; pushing
    kept counts, which is blocking, is the pusher thread's (as for :func:`call_backend`)."""
    try:
        with get_breaker().guard():
            backend = get_backend()
            reply = await call.asend(backend)
    except BackendError as exc:
        leases.abandon(maybe_leased(exc))  # slots the call may have taken, given back
        return exc
    except asyncio.CancelledError as exc:  # the client went away while Redis counted
        leases.abandon(maybe_leased(exc))
        raise
    if usage.pending or getattr(getattr(backend, "usage_tally", None), "waiting", False):
        usage.push_soon()
    return reply


def run(steps: Steps[T]) -> T:
    """Make the backend calls ``steps`` yield (:func:`call_backend`): a :class:`BackendError`
    is raised into the steps at their ``yield``, any other reply sent."""
    try:
        call = next(steps)
        while True:
            reply = call_backend(call)
            call = steps.throw(reply) if isinstance(reply, BackendError) else steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(steps: Steps[T], call: Call | None = None) -> T:
    """:func:`run` on an event loop (:func:`acall_backend`), from ``call`` when the steps
    already yielded it.

    A call cancelled while awaited (the client went away: Django's ASGI handler cancels the
    view) ends the steps as a backend error there would: what their earlier calls took is
    given back (a check counted in several calls is all or nothing, cancelled or not),
    shielded from a second cancellation; then the cancellation goes on."""
    try:
        call = next(steps) if call is None else call
        while True:
            try:
                reply = await acall_backend(call)
            except asyncio.CancelledError:
                await _abandon(steps)
                raise
            call = steps.throw(reply) if isinstance(reply, BackendError) else steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _abandon(steps: Steps[Any]) -> None:
    """Finish ``steps`` whose awaited call was cancelled: the calls they make on being told
    the backend could not answer (giving back what they took) run in a task of their own."""
    try:
        call = steps.throw(BackendError("the client went away while the backend was counting"))
    except (StopIteration, BackendError):
        return  # nothing to give back
    task = asyncio.ensure_future(arun(steps, call))
    _giving_back.add(task)  # held until done, should a second cancellation drop the shield
    task.add_done_callback(_giving_back.discard)
    await asyncio.shield(task)


#: The tasks of :func:`_abandon` still giving back what a cancelled request took.
_giving_back: set[asyncio.Future[Any]] = set()


logger = logging.getLogger("django_throttle")

#: Seconds between two error lines about unidentifiable clients, per process.
UNIDENTIFIED_LOG_INTERVAL = 60.0

_FAILED_OPEN = Decision(allowed=True, limit=None, remaining=0, reset_after=0.0, failed_open=True)
_UNIDENTIFIED_DENIED = Decision(
    allowed=False, limit=None, remaining=0, reset_after=0.0, unavailable=True, unidentified=True
)
#: A closed failure mode's refusal, completed per request with the breaker's wait.
_FAILED_CLOSED = Decision(allowed=False, limit=None, remaining=0, reset_after=0.0, unavailable=True)
_UNKNOWN_CLIENT_CHOICES = {
    "allow": "serves them uncounted",
    "shared": "counts them all in one shared bucket",
}
_SHARED_UNKNOWN = Identity("ip", "unknown")
_last_unidentified_log = -UNIDENTIFIED_LOG_INTERVAL
_last_resolver_log = -UNIDENTIFIED_LOG_INTERVAL


@dataclass(slots=True)
class Plan:
    """What a request will be counted against, worked out before the backend call: the
    first group (``client``, ``limits``), the further ``groups`` (limits counted by IP
    address or username), and what the rule's counting policy may give back.

    A plan is also its first group's :data:`Call` (:meth:`send`, :meth:`asend`), so a request
    with no further groups is one call and no steps."""

    client: str
    limits: Sequence[Limit]
    cost: int
    field: str | None
    failure_mode: str | None
    credential: bool
    policy: Policy | None
    tier: TierPolicy | None
    endpoint: EndpointPolicy | None
    groups: tuple[Group, ...] = ()
    refunds: tuple[Group, ...] = ()
    #: The client's region when some limit row names it (its limits were picked for it),
    #: else ``None`` (the default limits).
    region: str | None = None

    def send(self, backend: Backend, *, usage: bool = True) -> Decision:
        """Count ``cost`` against the first group's limits, all or nothing (the backend's
        ``hit``), counted in usage under ``field``; only if it denies when further groups
        follow (the last call counts the request: see :func:`hit_groups`)."""
        field = (only_if_denied(self.field) if self.groups else self.field) if usage else None
        return backend.hit(self.client, self.limits, self.cost, usage=field)

    async def asend(self, backend: Backend) -> Decision:
        field = only_if_denied(self.field) if self.groups else self.field
        return await backend.ahit(self.client, self.limits, self.cost, usage=field)

    def deciding(self, together: bool = False) -> Steps[Decision | BackendError]:
        """The request's backend calls: the first group's (the plan itself), then the further
        ``groups``' (:func:`hit_groups`); ends with the decision, or the error that stopped
        them. ``together``: first ask the backend to count every group in one call
        (:class:`HitTogether`), as one round trip; where it cannot, it sends nothing and the
        groups are counted one call each. The in-process backend of failure mode ``local``
        is always run one call each."""
        head = (self.client, self.limits)
        if together and self.groups:
            try:
                decisions = yield HitTogether((head, *self.groups), self.cost, self.field)
            except BackendError as exc:
                return exc
            if decisions is not None:
                return together_decision(head, self.groups, decisions)
        try:
            first = yield self
        except BackendError as exc:
            return exc
        if not self.groups:
            return first  # type: ignore[no-any-return]
        return (yield from hit_groups(head, self.groups, self.cost, first, self.field))


def make_plan(
    request: Any,
    policy: Policy | None,
    identity: Identity | None = None,
    scope: str | None = None,
    limits: Sequence[Limit] | None = None,
    cost: int | None = None,
    failure_mode: str | None = None,
    credential: bool = False,
    rule_only: bool = False,
    region: str | None = None,
) -> Plan | Decision:
    """Identity, policy lookup and usage field: everything but the backend call, on the
    snapshot ``policy`` (the caller has found the view not exempt). An exempt user or
    address stops here (no backend call, no headers), except under a credential rule: its
    counters by IP address and username protect the account named, so an exempt caller
    meets them too (only them). ``region`` (the operator tools) stands for the region
    ``DJANGO_THROTTLE_REGION_SOURCE`` would read off the request."""
    if identity is None:
        try:
            identity = import_resolver(app_settings.IDENTITY_RESOLVER)(request)
        except Exception as exc:  # a project's resolver never makes a 500
            identity = resolver_failed(request, exc)
        if not isinstance(identity, Identity):
            identity = resolver_failed(request, identity)
    exempt = (
        policy is not None
        and policy.exemptions.active
        and exempt_client(identity, policy.exemptions)
    )
    if exempt and limits is not None:  # a decorator's inline limits: no credential rule
        return UNLIMITED
    if identity.kind == UNIDENTIFIED.kind:
        decision = _unidentified()
        if decision is not None:
            return decision
        identity = _SHARED_UNKNOWN
    if limits is not None:  # a decorator's inline limits: only the usage field to look up
        store: dict[Any, Any] = policy.compiled if policy is not None else {}
        field_key = ("field", scope, rule_only)
        if field_key not in store:
            store[field_key] = _inline_field(scope, rule_only)
        field = store[field_key]
        if policy is not None and policy.shedding is not None and limits and not rule_only:
            fleet = policy.shedding.fleet_limit(None)
            limits = (*limits, fleet) if fleet is not None else limits
        planned = Plan(
            identity.key,
            limits,
            1 if cost is None else cost,
            field,
            failure_mode,
            credential,
            policy,
            None,
            None,
        )
        return planned if limits else UNLIMITED
    if policy is None:
        return UNLIMITED
    tier = policy.tier_for(identity)
    match = getattr(request, "resolver_match", None)
    if rule_only:  # the rule of ``scope`` alone: no route or path match
        route, path = None, ""
    else:
        route = match.view_name if match is not None else None
        # Only rules by path read the path: without any, one entry serves every path.
        path = request.path_info if policy.by_path else ""
    tier_id = tier.id if tier is not None else None
    if policy.regions:  # some rows name regions: read the client's (in process, no I/O)
        if region is None:
            region = request_region(request)
        if region not in policy.regions:
            region = None
    else:
        region = None
    method = request.method or "GET"
    # A function view answers OPTIONS with its GET code; a class-based one (Django's View,
    # DRF's APIView, viewsets and @api_view) answers it itself, without its GET handler.
    runs_get = method == "OPTIONS" and match is not None and not _class_based(match.func)
    key = (method, scope, route, path, tier_id, rule_only, credential, region, runs_get)
    found = policy.compiled.get(key)
    if found is None:
        paths = rule_paths(request, path) if path else ()
        found = _found(policy, key, tier, paths, rule_routes(match) if route else ())
    if isinstance(found, Decision):  # no rule of a rule-only check's scope
        return found
    endpoint, limits, rule_cost, field, is_credential, own, groups = found
    if exempt:
        if not (is_credential and groups):
            return UNLIMITED
        limits, own = (), ()  # the credential counters only
    if region is not None:  # the tier as the region sees it (its limits, for the tools)
        tier = policy.in_region(tier, None, region)[0]
    planned = Plan(
        identity.key,
        limits,
        rule_cost if cost is None else cost,
        field,
        failure_mode,
        is_credential,
        policy,
        tier,
        endpoint,
        region=region,
    )
    if own:
        planned.refunds = ((identity.key, own),)
    if groups:
        return _grouped(planned, request, groups)
    return planned if limits else UNLIMITED


def _class_based(view: Any) -> bool:
    """Whether ``view`` is a class-based view's ``as_view()`` (Django's keeps the class as
    ``view_class``, DRF's viewsets as ``cls``), also under a decorator that wraps it."""
    return hasattr(view, "view_class") or hasattr(view, "cls")


def _inline_field(scope: str | None, rule_only: bool) -> str | None:
    """The usage field of a check with inline limits (no tier, no rule)."""
    return usage.field_for("", scope or "", before_authentication=rule_only)


#: Most entries :func:`_found` keeps per snapshot: a key holds the path when rules match by
#: path, and paths are chosen by clients.
MAX_COMPILED = 4096
#: Longest method plus path :func:`_found` keeps an entry for: a longer one (only a client
#: making paths up sends it) is worked out on every request, so the store stays a few
#: megabytes at most however long the paths a server accepts.
MAX_COMPILED_TEXT = 512


def rule_paths(request: Any, path: str) -> tuple[str, ...]:
    """The spellings of ``path`` (the request's ``path_info``) a path rule covers the request
    by, so a client cannot leave a rule's counter by writing the path another way its view
    answers: the path itself; without the language prefix ``i18n_patterns`` resolved it by
    (``/de/api/x/`` is ``/api/x/``); without the format suffix DRF's
    ``format_suffix_patterns`` and routers accept (``/api/x.json`` is ``/api/x``); the path
    ``reverse()`` writes for the route and the arguments it resolved to (an ``<int:pk>``
    converter reads ``/api/r/01/`` as ``/api/r/1/``), also without those prefixes; and each
    of those with a trailing slash (``re_path(r"^api/x/?$")``, DRF's
    ``trailing_slash="/?"``: ``/api/x`` is ``/api/x/``)."""
    spellings = dict.fromkeys((path,))
    match = getattr(request, "resolver_match", None)
    if match is not None:
        for spelling in (path, _reversed(request, match)):
            if spelling is not None:
                spellings[spelling] = None
                bare = _without_format(_without_language(request, spelling, match), match)
                spellings[bare] = None
    for spelling in tuple(spellings):
        if not spelling.endswith("/"):
            spellings[spelling + "/"] = None
    return tuple(spellings)


def _reversed(request: Any, match: Any) -> str | None:
    """The path (as ``path_info`` holds it) ``reverse()`` writes for the named route
    ``match`` resolved and the arguments it captured: the one spelling of those arguments,
    where the client's path may be another the route's converters read the same (``01`` for
    an ``<int:pk>`` of 1). ``None`` for a route that captured nothing (its path is the one
    spelling), an unnamed route, and a path that does not resolve back to the same route and
    arguments (a name given to two routes, a ``re_path`` reverse cannot write): a rule of
    another route's path must never apply, so the path the client wrote is then the only
    one."""
    if not match.url_name or not (match.args or match.kwargs):
        return None
    from django.urls import get_script_prefix, resolve, reverse

    urlconf = getattr(request, "urlconf", None)
    try:
        url = reverse(match.view_name, urlconf=urlconf, args=match.args, kwargs=match.kwargs)
        prefix = get_script_prefix()
        if url.startswith(prefix):
            url = "/" + url[len(prefix) :]
        url = urllib.parse.unquote(url)
        back = resolve(url, urlconf=urlconf)
    except Exception:  # NoReverseMatch, Resolver404, a converter refusing the value
        return None
    same = (back.route, back.view_name, back.args, back.kwargs)
    return url if same == (match.route, match.view_name, match.args, match.kwargs) else None


def rule_routes(match: Any) -> tuple[str, ...]:
    """The names a route rule covers the request's URL route by, most specific first: its
    view name (``outer:v1:items``); the same without each outer instance namespace in turn
    (``v1:items``); its app namespaces as ``include()`` or ``app_name`` gave them
    (``api:items``), likewise; and its URL name alone (``items``, in any namespace). A route
    without a name is known by its view name only."""
    url_name = match.url_name
    if not url_name:
        return (match.view_name,)
    names = dict.fromkeys((match.view_name,))
    for chain in (match.namespaces, match.app_names):
        for start in range(len(chain)):
            names[":".join((*chain[start:], url_name))] = None
    names[url_name] = None
    return tuple(names)


def _without_language(request: Any, path: str, match: Any) -> str:
    """``path`` without the language prefix the URL conf's ``i18n_patterns`` resolved it by."""
    from django.conf import settings
    from django.conf.urls.i18n import is_language_prefix_patterns_used
    from django.utils.translation import get_language_from_path

    if not settings.USE_I18N:
        return path
    urlconf = getattr(request, "urlconf", None) or settings.ROOT_URLCONF
    if not is_language_prefix_patterns_used(urlconf)[0]:
        return path
    language = get_language_from_path(path)
    if not language or not str(match.route).startswith(f"{language}/"):
        return path
    prefix = path[: len(language) + 1]  # "/de", as the client wrote it
    return path[len(prefix) :] or "/"


def _without_format(path: str, match: Any) -> str:
    """``path`` without the format suffix DRF's ``format_suffix_patterns`` (and routers)
    resolved it by: ``.json`` in ``/api/x.json`` or ``/api/x.json/``."""
    from django.conf import settings

    drf = getattr(settings, "REST_FRAMEWORK", None) or {}
    name = drf.get("FORMAT_SUFFIX_KWARG", "format")
    captured = getattr(match, "captured_kwargs", None) or {}
    suffix = captured.get(name)
    if not isinstance(suffix, str) or not suffix:
        return path
    for end in (f".{suffix}", f".{suffix}/"):
        if path.endswith(end) and len(path) > len(end):
            return path[: -len(end)]
    return path


_Found = tuple[
    EndpointPolicy | None,
    tuple[Limit, ...],
    int,
    str | None,
    bool,
    tuple[Limit, ...],
    tuple[CountedGroup, ...],
]


def _found(
    policy: Policy,
    key: tuple[Any, ...],
    tier: TierPolicy | None,
    paths: tuple[str, ...] = (),
    routes: tuple[str, ...] = (),
) -> _Found | Decision:
    """What a request meets under ``policy`` for ``key`` (method, scope, route, path, tier
    id, rule only, credential, region, whether the method runs the view's GET code; ``tier``
    the tier that id names; ``paths`` the spellings of the path rules match,
    :func:`rule_paths`; ``routes`` the names route rules match, :func:`rule_routes`): its
    rule, its limits, the rule's cost, its usage field, whether it is a credential check,
    what the rule may give back, and the limits counted by IP address or username. Kept in
    the snapshot's own store, so it is worked out once per policy version."""
    method, scope, route, path, _tier_id, rule_only, credential, region, runs_get = key
    endpoint = policy.match(method, scope, routes or route, paths or path, runs_get)
    if region is not None:
        tier, endpoint = policy.in_region(tier, endpoint, region)
    found: _Found | Decision
    if rule_only and endpoint is None:
        found = UNLIMITED
    else:
        limits = policy.limits_for(tier, endpoint)
        own: tuple[Limit, ...] = ()
        groups: tuple[CountedGroup, ...] = ()
        if endpoint is not None:
            if rule_only and tier is not None:
                limits = endpoint.rule_limits_by_tier.get(tier.id, ())
            if tier is not None and endpoint.counts != "all":
                own = endpoint.rule_limits_by_tier.get(tier.id, ())
            groups = policy.groups_for(tier, endpoint, credential)
        field = usage.field_for(
            tier.slug if tier is not None else "",
            (endpoint.name if endpoint is not None else "") or scope or "",
            before_authentication=rule_only,
        )
        # A check under a credential rule is a credential check whichever adapter makes it:
        # it meets every tier's counters, and is never served uncounted (see failure_mode).
        is_credential = credential or (endpoint is not None and endpoint.credential)
        cost = endpoint.cost if endpoint is not None else 1
        fleet = policy.shedding.fleet_limit(endpoint) if policy.shedding is not None else None
        if fleet is not None and not rule_only:
            # The fleet's in-flight capacity, in the same call (a check before
            # authentication is not a request of its own: its request is checked again).
            limits = (*limits, fleet)
        found = (endpoint, limits, cost, field, is_credential, own, groups)
    if len(policy.compiled) < MAX_COMPILED and len(method) + len(path) <= MAX_COMPILED_TEXT:
        policy.compiled[key] = found
    return found


def _grouped(
    planned: Plan, request: Any, groups: tuple[tuple[str, tuple[Limit, ...]], ...]
) -> Plan | Decision:
    """``planned`` with the rule's limits counted by IP address or username added: one group
    per distinct counter, the client's first. A counter equal to the client's (an anonymous
    client's IP address) joins its group, so the call count stays as low as it can."""
    calls: dict[str, list[Limit]] = {planned.client: list(planned.limits)}
    refunds = {planned.client: [limit for _, own in planned.refunds for limit in own]}
    for counted_by, counted in groups:
        if counted_by == "ip":
            address = client_ip(request.META)
            keys: tuple[str, ...] = () if address is None else (Identity("ip", address).key,)
        else:
            keys = username_counters(request)  # none: nothing presented
        for key in keys:
            calls.setdefault(key, []).extend(counted)
            refunds.setdefault(key, []).extend(counted)
    found = [(key, tuple(limits)) for key, limits in calls.items() if limits]
    if not found:
        return UNLIMITED
    (planned.client, planned.limits), *rest = found
    planned.groups = tuple(rest)
    if planned.endpoint is not None and planned.endpoint.counts != "all":
        planned.refunds = tuple((key, tuple(limits)) for key, limits in refunds.items() if limits)
    return planned


def resolver_failed(request: Any, problem: object) -> Identity:
    """The identity of a request the project's ``DJANGO_THROTTLE_IDENTITY_RESOLVER`` failed
    on (it cannot be imported, it raised ``problem``, or it returned ``problem``, which is no
    :class:`Identity`): the default resolver's (API key, user or address), so the request is
    still counted under its tier instead of becoming a 500, and an ERROR at most once a
    minute per process names the setting and what it must return."""
    global _last_resolver_log
    identity = policy_module.resolve_identity(request)  # what it raises is no resolver's fault
    now = time.monotonic()
    if now - _last_resolver_log >= UNIDENTIFIED_LOG_INTERVAL:
        _last_resolver_log = now
        failure = (
            f"raised {type(problem).__name__}"
            if isinstance(problem, BaseException)
            else f"returned {type(problem).__name__}, not an Identity"
        )
        logger.error(
            "DJANGO_THROTTLE_IDENTITY_RESOLVER %s %s, so requests are counted by the default "
            "resolver (API key, user or address) instead: make it return "
            "django_throttle.identity.Identity(kind, value) for every request (see manage.py "
            "check). (Logged at most once a minute.)",
            log_text(str(app_settings.IDENTITY_RESOLVER)),
            failure,
            exc_info=problem if isinstance(problem, BaseException) else None,
        )
    return identity


def _unidentified() -> Decision | None:
    """Apply ``conf.UNKNOWN_CLIENT`` to a request with no usable address: the
    decision to return, or ``None`` to count it in the one shared bucket."""
    global _last_unidentified_log
    choice = UNKNOWN_CLIENT
    now = time.monotonic()
    if now - _last_unidentified_log >= UNIDENTIFIED_LOG_INTERVAL:
        _last_unidentified_log = now
        logger.error(
            "A request has no usable client address (REMOTE_ADDR is empty or not an IP), so it "
            "cannot be rate limited per client and is refused (%s). Behind a proxy that "
            "connects over a Unix socket, set DJANGO_THROTTLE_TRUSTED_PROXIES to the proxy count "
            "so the address comes from X-Forwarded-For. (Logged at most once a minute.)",
            _UNKNOWN_CLIENT_CHOICES.get(choice, "503"),
        )
    if choice == "allow":
        return _FAILED_OPEN
    if choice == "shared":
        return None
    return _UNIDENTIFIED_DENIED


def counted_decision(
    planned: Plan, decision: Decision, request: Any, local: bool = False
) -> Decision:
    """The decision the backend made, as it is; an allowed request whose rule may give its
    tokens back leaves its :class:`Reservation` on ``request.throttle_reservations``
    (``local``: taken from the in-process backend, given back there); one that took
    concurrency slots keeps them on the request (:func:`.leases.hold`) until its response
    ends."""
    if decision.shadow:
        logger.info(
            "shadow rule %r would deny %s",
            planned.endpoint.name if planned.endpoint is not None else "",
            log_text(planned.client),
        )
    reservation = None
    if planned.refunds and decision.allowed and planned.endpoint is not None:
        counts = planned.endpoint.counts
        if counts == "failures":
            watch_login_failures()
        refunds = charged(planned.refunds, decision.spared)
        own = next((limits for key, limits in planned.refunds if key == planned.client), ())
        looked = (planned.client, tuple(limit for limit in planned.limits if limit not in own))
        reservation = Reservation(
            counts,
            planned.cost,
            refunds,
            decision.taken,
            local,
            looked=looked,
            limits=decision.limits,
        )
        with _reserving:
            reservations = getattr(request, "throttle_reservations", ())
            request.throttle_reservations = [*reservations, reservation]
    if decision.leases:
        leases.hold(request, ((planned.client, planned.limits), *planned.groups), decision, local)
    if decision.wait:
        # What the request took, given back should it not wait for its turn after all.
        groups = charged(((planned.client, planned.limits), *planned.groups), decision.spared)
        turn = Reservation(
            "none", planned.cost, groups, decision.taken, local, planned.field, reservation
        )
        request.throttle_turn = turn
    return decision


#: Most requests of one process sleeping for their turn at once (a delaying limit, in a
#: blocking view): beyond it a request that would wait is refused at once (what it took
#: given back), so waiting never takes every thread of a worker.
MAX_WAITING = 4
#: The same for ``async def`` views, which wait without a thread: bounds only the memory.
MAX_AWAITING = 1000
#: Requests of this process waiting now, blocking and async.
_waiting = threading.BoundedSemaphore(MAX_WAITING)
_awaiting = threading.BoundedSemaphore(MAX_AWAITING)
#: Says how long a delaying limit held the request back, in seconds (3 decimals).
DELAYED_HEADER = "X-RateLimit-Delayed"


def wait_turn(request: Any, decision: Decision) -> Decision:
    """Sleep until the turn a delaying limit reserved for ``request`` (``decision.wait``),
    then return ``decision``; when :data:`MAX_WAITING` requests of this process wait
    already, give back what the request took and return a refusal instead (``Retry-After``:
    the wait it would have had)."""
    if not decision.wait:
        return decision
    if leases.ended(request):
        run(_skip_turn(request))
        _announce_turn(request, decision)  # as one cancelled while it waits
        return _gone(decision)
    if not _waiting.acquire(blocking=False):
        turn = getattr(request, "throttle_turn", None)
        run(_skip_turn(request))
        leases.release(request)
        state = None
        if turn is not None:
            looking = _state_after(turn)
            state = run_locally(looking) if turn.local else run(looking)
        return _announce_turn(request, _refused_turn(turn, decision, state))
    _announce_turn(request, decision)
    try:
        time.sleep(decision.wait)
    finally:
        _waiting.release()
    turn = getattr(request, "throttle_turn", None)
    state = None
    if turn is not None:
        looking = _state_after(turn)
        state = run_locally(looking) if turn.local else run(looking)
    return _waited(request, decision, state)


async def await_turn(request: Any, decision: Decision, holds_a_thread: bool = False) -> Decision:
    """:func:`wait_turn` on the event loop (no thread held; the cap is
    :data:`MAX_AWAITING`). A request cancelled while it waits (the client went away) gives
    back what it took: its turn goes to the next request. ``holds_a_thread``: the caller
    awaits this from a thread that stays blocked until it ends (adrf checks throttles in a
    worker thread), so it takes one of the blocking views' :data:`MAX_WAITING` places, which
    bound the threads a process holds asleep."""
    if not decision.wait:
        return decision
    if leases.ended(request):
        await arun(_skip_turn(request))
        _announce_turn(request, decision)  # as one cancelled while it waits
        return _gone(decision)
    places = _waiting if holds_a_thread else _awaiting
    if not places.acquire(blocking=False):
        turn = getattr(request, "throttle_turn", None)
        await arun(_skip_turn(request))
        await leases.arelease(request)
        state = None
        if turn is not None:
            looking = _state_after(turn)
            state = run_locally(looking) if turn.local else await arun(looking)
        return _announce_turn(request, _refused_turn(turn, decision, state))
    _announce_turn(request, decision)
    try:
        await asyncio.sleep(decision.wait)
    except asyncio.CancelledError:
        await arun(_skip_turn(request))
        await leases.arelease(request)
        raise
    finally:
        places.release()
    turn = getattr(request, "throttle_turn", None)
    state = None
    if turn is not None:
        looking = _state_after(turn)
        state = run_locally(looking) if turn.local else await arun(looking)
    return _waited(request, decision, state)


def _announce_turn(request: Any, decision: Decision) -> Decision:
    """Announce ``decision``, what became of a request given a turn (served after its wait,
    or refused because this process's places for waiting requests were taken), with the
    time its check took (see :func:`_finished`); return it."""
    pending = getattr(request, "throttle_announcing", None)
    if pending is not None:
        request.throttle_announcing = None
        _announce(request, pending[0], decision, pending[1])
    return decision


def _gone(decision: Decision) -> Decision:
    """The refusal, never sent, of a request cancelled before its check in a worker thread
    was done, whose turn was given back for the next request: adrf checks there, and a
    cancellation cannot stop a thread (see :func:`~django_throttle.request.leases.end`), so
    no view will run for it. Counted allowed, not delayed, as a request cancelled while it
    awaits its turn."""
    return replace(decision, allowed=False, retry_after=decision.wait, wait=0.0, leases=())


def _waited(request: Any, decision: Decision, state: Decision | None = None) -> Decision:
    """Count the wait ``request`` had in its tier and endpoint's usage (the dashboard's
    delayed requests and mean wait); return ``decision`` as it stands now that its turn
    came: its headers say what the limits hold when the response is sent (``state``, looked
    at after the wait, see :func:`_state_after`), not when it was decided: the limit earned
    tokens back meanwhile, so ``X-RateLimit-Remaining`` is what a request sent now really
    gets, and ``X-RateLimit-Reset`` is counted from now. Without ``state`` (the backend
    could not be looked at), the limit is full again its wait sooner than it was when
    decided, and the remaining is as decided (never more than there is)."""
    turn: Reservation | None = getattr(request, "throttle_turn", None)
    if turn is not None:
        usage.record_delay(turn.field, decision.wait, local=turn.local)
    if state is not None and state.limit is not None:
        return replace(
            decision, limit=state.limit, remaining=state.remaining, reset_after=state.reset_after
        )
    return replace(decision, reset_after=max(0.0, decision.reset_after - decision.wait))


def _refused_turn(
    turn: Reservation | None, decision: Decision, state: Decision | None = None
) -> Decision:
    """The refusal of a request given a ``turn`` that this process will not wait for:
    counted denied in usage (the backend counted it allowed). Its headers say what holds
    once its tokens are back (``state``, see :func:`_state_after`; without it, as the
    counting call left them); ``Retry-After`` is the wait it would have had."""
    if turn is not None:
        # The backend counted the request with its last group's client; a local decision
        # with the plan's own (see degraded_decision).
        client = turn.groups[0 if turn.local else -1][0]
        usage.record_refused_turn(turn.field, client, local=turn.local)
    if state is not None and state.limit is not None:
        decision = replace(
            decision, limit=state.limit, remaining=state.remaining, reset_after=state.reset_after
        )
    return replace(decision, allowed=False, retry_after=decision.wait, wait=0.0, leases=())


def _state_after(turn: Reservation) -> Steps[Decision | None]:
    """The limits of ``turn`` as they are once its tokens were given back: each group looked
    at (nothing taken), the most restrictive as :func:`_reported` picks it; ``None`` when one
    cannot be looked at. One more backend call, made only for a request refused because this
    process's places for waiting requests are taken."""
    seen: list[Decision] = []
    for client, limits in turn.groups:
        try:
            seen.append((yield Peek(client, limits, 0)))
        except BackendError:
            return None
    return min(seen, key=_restrictive) if seen else None


def _skip_turn(request: Any) -> Steps[None]:
    """Give back the tokens ``request``'s check took, its turn among them (its slots are the
    caller's to give back)."""
    turn: Reservation | None = getattr(request, "throttle_turn", None)
    if turn is None:
        return
    request.throttle_turn = None
    if turn.settled is not None:  # its tokens come back with the turn's, not again later
        with _reserving:
            reservations = getattr(request, "throttle_reservations", None) or []
            request.throttle_reservations = [r for r in reservations if r is not turn.settled]
    refunds = _give_back(turn.groups, turn.cost, dict(turn.taken), "a turn of")
    if turn.local:
        run_locally(refunds)
    else:
        yield from refunds


def degraded_decision(planned: Plan, error: BackendError, request: Any) -> Decision:
    """The decision when the backend could not answer (``error``), by failure mode (see
    :func:`failure_mode`), counted in-process until the backend is back. A refused call
    (:class:`ArgumentRefused`: the backend answered, refusing one of our arguments, a bug
    logged by the breaker) is counted in-process where the mode would serve it uncounted:
    whatever provoked it must not slip past the limits. Fail-closed's ``Retry-After`` is
    when the breaker that stopped the call lets one through: the process's, or one Cluster
    node's (:class:`NodeUnavailable`).

    ``local`` counts exactly what the backend would have: the same steps
    (:meth:`Plan.deciding`: the client's limits, then those by IP address and username,
    all or nothing), on the in-process backend; a rule that counts only failures or
    successes leaves its reservation there.

    The breaker logs when it opens and closes; a line per failed request would flood the log
    exactly when the operator needs it. The mode is only worked out here, off the healthy
    path."""
    mode = failure_mode(planned)
    if isinstance(error, ArgumentRefused) and mode == "open":
        mode = "local"
    decision: Decision | BackendError = _FAILED_OPEN
    if mode == "local":
        decision = run_locally(planned.deciding(), keep=planned.credential)
        if not isinstance(decision, BackendError):
            decision = counted_decision(planned, replace(decision, local=True), request, local=True)
    if mode == "closed" or isinstance(decision, BackendError):
        if isinstance(error, NodeUnavailable):
            wait = error.retry_after
        else:
            wait = get_breaker().retry_after()
        decision = replace(_FAILED_CLOSED, retry_after=wait, limits=tuple(planned.limits))
    usage.record_degraded(planned.field, planned.client, usage_outcome(decision))
    return decision


def failure_mode(planned: Plan) -> str:
    """What ``planned`` meets while the backend cannot answer: the check's own
    ``failure_mode``, else what the policy says for its tier and rule
    (:meth:`~django_throttle.policy.live.Policy.failure_mode_for`: a credential check
    counts in-process where the setting would serve it uncounted)."""
    return Policy.failure_mode_for(
        planned.tier, planned.endpoint, planned.credential, planned.failure_mode
    )


def usage_outcome(decision: Decision) -> str:
    """The usage column of a decision: a request served although a shadow limit would have
    denied it is ``shadow_denied``, as the backend counts it (failure mode ``local`` decides
    in process with the same limits, shadow ones included)."""
    if decision.unavailable:
        return usage.FAILED_CLOSED
    if decision.failed_open:
        return usage.FAILED_OPEN
    if not decision.allowed:
        return usage.DENIED
    return usage.SHADOW_DENIED if decision.shadow else usage.ALLOWED


#: (client, limits): what one backend call counts.
Group = tuple[str, Sequence[Limit]]


@dataclass(frozen=True, slots=True)
class Hit:
    """Count ``cost`` against every limit of ``client``, all or nothing (the backend's
    ``hit``), the decision counted in usage under ``usage`` (``None``: not counted)."""

    client: str
    limits: Sequence[Limit]
    cost: int
    usage: str | None

    def send(self, backend: Backend, *, usage: bool = True) -> Decision:
        return backend.hit(self.client, self.limits, self.cost, usage=self.usage if usage else None)

    async def asend(self, backend: Backend) -> Decision:
        return await backend.ahit(self.client, self.limits, self.cost, usage=self.usage)


@dataclass(frozen=True, slots=True)
class HitTogether:
    """Count ``cost`` against every group's limits in one backend call, all or nothing
    across them (the backend's ``hit_together``): each group's decision, or ``None`` when
    the backend cannot (nothing counted: the groups are then counted one call each)."""

    groups: tuple[Group, ...]
    cost: int
    usage: str | None

    def send(self, backend: Backend, *, usage: bool = True) -> list[Decision] | None:
        return backend.hit_together(self.groups, self.cost, usage=self.usage if usage else None)

    async def asend(self, backend: Backend) -> list[Decision] | None:
        return await backend.ahit_together(self.groups, self.cost, usage=self.usage)


@dataclass(frozen=True, slots=True)
class RefundTogether:
    """Give ``cost`` back to every group's limits in one backend call (the backend's
    ``refund_together``), each as of the instant ``taken_at`` names for it: ``False`` when
    the backend cannot (nothing given back: each group is then refunded on its own). With
    ``looked`` (each group's limits given nothing back), the call also reports each group's
    limits once the tokens are back: those reports, a list."""

    groups: tuple[Group, ...]
    cost: int
    taken_at: tuple[int | None, ...]
    looked: tuple[Sequence[Limit], ...] | None = None

    def send(self, backend: Backend, *, usage: bool = True) -> bool | list[Decision]:
        return backend.refund_together(
            self.groups, self.cost, looked=self.looked, taken_at=self.taken_at
        )

    async def asend(self, backend: Backend) -> bool | list[Decision]:
        return await backend.arefund_together(
            self.groups, self.cost, looked=self.looked, taken_at=self.taken_at
        )


@dataclass(frozen=True, slots=True)
class Peek:
    """Whether ``cost`` would pass ``client``'s limits, nothing taken (the backend's ``peek``)."""

    client: str
    limits: Sequence[Limit]
    cost: int

    def send(self, backend: Backend, *, usage: bool = True) -> Decision:
        return backend.peek(self.client, self.limits, cost=self.cost)

    async def asend(self, backend: Backend) -> Decision:
        return await backend.apeek(self.client, self.limits, cost=self.cost)


@dataclass(frozen=True, slots=True)
class Refund:
    """Give ``cost`` back to ``client``'s limits, as of the instant the tokens were taken
    (``taken_at``; the backend's ``refund``). With ``looked`` (more of ``client``'s limits,
    given nothing back), the call also reports every one of them once the tokens are back:
    that report, or ``None`` when the backend cannot look in the same step."""

    client: str
    limits: Sequence[Limit]
    cost: int
    taken_at: int | None
    looked: Sequence[Limit] | None = None

    def send(self, backend: Backend, *, usage: bool = True) -> Decision | None:
        return backend.refund(
            self.client, self.limits, self.cost, looked=self.looked, taken_at=self.taken_at
        )

    async def asend(self, backend: Backend) -> Decision | None:
        return await backend.arefund(
            self.client, self.limits, self.cost, looked=self.looked, taken_at=self.taken_at
        )


@dataclass(frozen=True, slots=True)
class Release:
    """Give back the concurrency slots ``client``'s call took under ``lease`` (the
    backend's ``release``)."""

    client: str
    limits: Sequence[Limit]
    lease: str

    def send(self, backend: Backend, *, usage: bool = True) -> int:
        return backend.release(self.client, self.limits, self.lease)

    async def asend(self, backend: Backend) -> int:
        return await backend.arelease(self.client, self.limits, self.lease)


#: One backend call, as a typed value: the runners call its ``send`` (blocking) or await its
#: ``asend``, which call the backend's method by name in the code, so mypy and "find
#: usages" see every call.
Call = Hit | HitTogether | Peek | Refund | RefundTogether | Release | Plan
#: Steps that make backend calls and end with a ``T`` (see the module docstring).
Steps = Generator[Call, Any, T]

#: Set on the (Django) request when ``user_login_failed`` fires for it.
FAILED_ATTRIBUTE = "throttle_login_failed"
#: Set on the (Django) request when ``user_logged_in`` fires for it: the signed-in account's
#: username (``get_username()``), or ``True`` for a user object that has none.
LOGGED_IN_ATTRIBUTE = "throttle_logged_in"
#: The request whose login view a login guard is running (in this thread or task, and in the
#: threads ``sync_to_async`` runs for it): a ``user_login_failed`` sent with no request (a
#: view calling ``authenticate(username=…, password=…)``) is that request's.
_guarded: ContextVar[Any] = ContextVar("django_throttle_guarded_request", default=None)


@contextlib.contextmanager
def guarding(request: Any) -> Iterator[None]:
    """While a login guard runs ``request``'s view: a failed ``authenticate()`` called
    without the request counts as that request's failure."""
    token = _guarded.set(request)
    try:
        yield
    finally:
        _guarded.reset(token)


#: Orders the changes to a request's reservations across threads: adrf's worker thread
#: may add one (its throttle, run on after the client went away) while the event loop's
#: headers middleware settles the cancelled request's.
_reserving = threading.Lock()
#: Where a sync DRF view leaves the status it answered (:func:`record_outcome`).
OUTCOME_ATTRIBUTE = "throttle_outcome"
#: Set on a request whose async (adrf) view runs a sync handler in a worker thread, which
#: runs on when the client goes away (:func:`record_outcome`).
HANDLER_THREAD_ATTRIBUTE = "throttle_handler_in_thread"
#: Set on a request once its async (adrf) view's ``async def`` handler started
#: (:func:`record_outcome`): cancelled after that, it is settled as :data:`CLIENT_GONE`.
VIEW_STARTED_ATTRIBUTE = "throttle_view_started"
#: The status an ``async def`` view cancelled while it ran (its client went away under
#: ASGI) is settled with, nginx's "client closed request": a failure (4xx), whatever it
#: would have answered, so a rule counting failures keeps its tokens and one counting
#: successes gives them back. Its work may have run: what it awaited in a worker thread
#: (``sync_to_async``; ``acheck_password`` hashes in one) runs on, which a cancellation cannot
#: stop. Settled as a 500 (neither), its tokens came back, and a client hanging up at once
#: guessed a one-time code (or had the server hash a password) without limit. A request
#: cancelled before its view ran (while its check counted, or adrf's throttle decided) gives
#: its tokens back: nothing ran.
CLIENT_GONE = 499


def record_outcome(view: Any, request: Any) -> None:
    """Have the DRF view instance ``view`` leave the status it answers on ``request`` (the
    Django request): under ASGI a sync view runs on in its thread when its client goes away,
    and the headers middleware, cancelled, settles its reservations with what it answered
    once it ended, as ``@throttle`` settles a sync view (its response never reaches the
    middleware). Through ``finalize_response``, which DRF calls on every response the view
    makes, an exception it handles included."""
    finalize = view.finalize_response

    def finalize_response(drf_request: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = finalize(drf_request, response, *args, **kwargs)
        with contextlib.suppress(AttributeError):  # a request that takes no attributes
            setattr(request, OUTCOME_ATTRIBUTE, response.status_code)
        return response

    view.finalize_response = finalize_response
    _record_handler_outcome(view, request)


def _record_handler_outcome(view: Any, request: Any) -> None:
    """For an async view (adrf's) whose handler for ``request``'s method is a plain ``def``
    (a sync action of a ``ViewSet`` with ``async def`` ones beside): adrf runs it with
    ``sync_to_async``, in the request's thread-sensitive thread, where it runs on when the
    client goes away, and its ``finalize_response`` (awaited after it) never runs. Say so on
    the request (:data:`HANDLER_THREAD_ATTRIBUTE`: the headers middleware waits for that
    thread, as for a sync view) and have the handler itself leave the status it answers, or
    the one its exception is answered with (a DRF ``APIException``'s ``status_code``). An
    ``async def`` handler says when it starts instead (:func:`_record_start`)."""
    if getattr(view, "view_is_async", False) is not True:
        return
    method = str(getattr(request, "method", "") or "").lower()
    handler = getattr(view, method, None) if method else None
    if handler is None:
        return
    if asyncio.iscoroutinefunction(handler):
        _record_start(view, method, handler, request)
        return

    @functools.wraps(handler)
    def answering(*args: Any, **kwargs: Any) -> Any:
        try:
            response = handler(*args, **kwargs)
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            status = status if isinstance(status, int) else raised_status(exc)
            with contextlib.suppress(AttributeError):
                setattr(request, OUTCOME_ATTRIBUTE, status)
            raise
        with contextlib.suppress(AttributeError):
            setattr(request, OUTCOME_ATTRIBUTE, response.status_code)
        return response

    with contextlib.suppress(AttributeError):
        setattr(view, method, answering)
        setattr(request, HANDLER_THREAD_ATTRIBUTE, True)


def _record_start(view: Any, method: str, handler: Any, request: Any) -> None:
    """For an async (adrf) view's ``async def`` handler: say on ``request`` that it started
    (:data:`VIEW_STARTED_ATTRIBUTE`), so that the headers middleware settles a request
    cancelled after that as :data:`CLIENT_GONE`, and one cancelled before (while adrf's
    ``initial()`` still ran in its worker thread) as nothing ran."""

    @functools.wraps(handler)
    async def starting(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(AttributeError):
            setattr(request, VIEW_STARTED_ATTRIBUTE, True)
        return await handler(*args, **kwargs)

    with contextlib.suppress(AttributeError):
        setattr(view, method, starting)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Tokens an allowed request took from its rule's limits, which :func:`settling` gives
    back when the outcome is one the rule does not count (``counts``: "success" or
    "failures"). Left on the request in ``throttle_reservations``."""

    counts: str
    cost: int
    groups: tuple[Group, ...]
    #: (client, instant) of each call that took the tokens (``Decision.taken``): the refund
    #: gives back what this request took, not what a later one did.
    taken: tuple[tuple[str, int], ...] = ()
    #: Taken from the in-process backend (failure mode ``local``): given back there too.
    local: bool = False
    #: The usage field the request is counted under (a turn's wait is counted there).
    field: str | None = None
    #: A turn's: the reservation its check left for :func:`settling`, whose tokens giving
    #: the turn back returns too (so it is taken off the request then: never given twice).
    settled: Reservation | None = None
    #: The limits of the check's first call that are not given back (the tier's beside the
    #: rule's), with its client: looked at in the refund's own call, so the headers report
    #: every limit of the decision as it stands once the tokens are back.
    looked: Group | None = None
    #: ``Decision.limits`` of the check that made it: which decision its refund reports on.
    limits: tuple[Limit, ...] = ()


@functools.cache
def watch_login_failures() -> None:
    """Connect the ``user_login_failed`` and ``user_logged_in`` receivers (once per
    process). Called on first need rather than in ``AppConfig.ready()``, so a site that
    counts no failures pays nothing."""
    from django.contrib.auth.signals import user_logged_in, user_login_failed

    user_login_failed.connect(_login_failed, dispatch_uid="django_throttle.login_failed")
    user_logged_in.connect(_logged_in, dispatch_uid="django_throttle.logged_in")


def _logged_in(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    """Mark the request of a real sign-in (``django.contrib.auth.login``) with the account
    signed in to: the only proof that earns the browser a device cookie (a 200 or 302 alone
    proves nothing), and the account that cookie is for (not the name the form presented,
    which may fold to another account's counter)."""
    if user is None or request is None:
        return
    get_username = getattr(user, "get_username", None)
    account = get_username() if callable(get_username) else None
    target = getattr(request, "_request", request)
    with contextlib.suppress(AttributeError):  # a request object that takes no attributes
        # A username field that is no text (a number) is known by its text, as a form sends it.
        setattr(target, LOGGED_IN_ATTRIBUTE, True if account is None else str(account))


def _login_failed(sender: Any, credentials: Any = None, request: Any = None, **kwargs: Any) -> None:
    """Mark the request of a failed ``authenticate()``: the one it was given, else the one
    whose login view is running (see :func:`guarding`), so that a view calling
    ``authenticate()`` without the request and answering 200 is still counted."""
    target = request if request is not None else _guarded.get()
    _mark(target, FAILED_ATTRIBUTE)
    if target is not None:
        _warn_unread(getattr(target, "_request", target), credentials)


#: Paths already logged by :func:`_warn_unread` (bounded: paths are chosen by clients).
_unread_paths: set[str] = set()
MAX_UNREAD_PATHS = 64


def _warn_unread(request: Any, credentials: Any) -> None:
    """Log (once per path) a failed login whose username the check could not read: limits
    counted by username never hold for that view."""
    key = unread_username(request, credentials)
    if key is None:
        return
    path = str(getattr(request, "path", ""))
    if path in _unread_paths or len(_unread_paths) >= MAX_UNREAD_PATHS:
        return
    _unread_paths.add(path)
    logger.warning(
        "A failed login at %s was counted under no username: authenticate() was given one "
        "(as %s) from a field the limiter does not read, so limits counted by username never "
        "hold there. Name the view's field: protect_credentials(view, username_field='…').",
        log_text(path),
        log_text(key),
    )


def _mark(request: Any, attribute: str) -> None:
    if request is None:
        return
    # DRF's serializers pass DRF's Request; the flag belongs on the Django request.
    target = getattr(request, "_request", request)
    with contextlib.suppress(AttributeError):  # a request object that takes no attributes
        setattr(target, attribute, True)


def login_failed(request: Any) -> bool:
    """Whether ``user_login_failed`` fired for ``request`` (once watching started)."""
    return bool(getattr(request, FAILED_ATTRIBUTE, False))


def counted(counts: str, status: int, login_failed: bool = False) -> bool:
    """Whether a finished request keeps its reservation under a rule's ``counts``: every
    request for "all"; status below 400 for "success"; status 400-499, or a failed login
    during the request, for "failures" (a login form re-rendered with 200 is a failure)."""
    if counts == "success":
        return status < 400 and not login_failed
    if counts == "failures":
        return login_failed or 400 <= status < 500
    return True


def raised_status(exc: BaseException) -> int:
    """The status Django answers a view's exception with: 404 for ``Http404``, 403 for
    ``PermissionDenied``, 400 for ``BadRequest`` and ``SuspiciousOperation``, else 500. A
    login view that refuses a wrong password by raising ``PermissionDenied`` failed, and its
    attempt is counted as one."""
    from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
    from django.http import Http404
    from django.http.multipartparser import MultiPartParserError

    if isinstance(exc, Http404):
        return 404
    if isinstance(exc, PermissionDenied):
        return 403
    bad = (BadRequest, SuspiciousOperation, MultiPartParserError)
    return 400 if isinstance(exc, bad) else 500


def settling(
    request: Any, status: int, first: int = 0, shown: Decision | None = None
) -> Steps[Decision | None]:
    """Give back the reservations left on ``request`` whose outcome (``status``, and whether
    ``user_login_failed`` fired for it) their rule does not count; those reservations are
    used up. A backend error only means the tokens stay taken. ``first`` leaves the
    reservations made before that many alone (a check inside another settles its own).

    Ends with ``shown`` (the allowed decision whose headers the response gets) as it stands
    once the tokens are back: when a reservation given back is that decision's, its refund
    calls also look at every limit of the decision, in the same calls (no round trip
    more), and the reported limit, remaining and reset are theirs. Where that would take
    one more call (see :func:`_give_back`), or a call failed, ``shown`` stays as decided."""
    with _reserving:  # taken off the request once: never given back twice
        reservations: list[Reservation] | None = getattr(request, "throttle_reservations", None)
        if not reservations or len(reservations) <= first:
            return shown
        request.throttle_reservations, reservations = reservations[:first], reservations[first:]
    failed = login_failed(request)
    for reservation in reservations:
        if not counted(reservation.counts, status, failed):
            reports = (
                shown is not None
                and shown.allowed
                and reservation.looked is not None
                and shown.limits == reservation.limits
            )
            refunds = _give_back(
                reservation.groups,
                reservation.cost,
                dict(reservation.taken),
                "a reservation of",
                together=not reservation.local,
                looked=reservation.looked if reports else None,
                local=reservation.local,
            )
            if reservation.local:
                seen = run_locally(refunds)
            else:
                seen = yield from refunds
            if seen is not None and shown is not None:
                shown = replace(
                    shown, limit=seen.limit, remaining=seen.remaining, reset_after=seen.reset_after
                )
    return shown


def run_locally(steps: Steps[T], keep: bool = False) -> T:
    """Make the calls ``steps`` yield on the process's in-process backend (failure mode
    ``local``), blocking: it answers from memory, so an event loop may call it too. Usage is
    not counted there (the request path records degraded decisions itself).

    ``keep`` (a credential check) keeps every counter it counts in the bounded store
    (:meth:`~django_throttle.backends.memory.MemoryBackend.keep`): forgetting a login's
    counters, spent or not, would give their attempts back; the store keeps counters that
    deny itself."""
    from django_throttle.backends import get_local_backend

    backend = get_local_backend()
    try:
        call = next(steps)
        while True:
            try:
                reply = call.send(backend, usage=False)
            except BackendError as exc:
                call = steps.throw(exc)
                continue
            if keep and isinstance(call, Hit | Plan):
                backend.keep(call.client, call.limits)
            call = steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def hit_groups(
    head: Group, groups: Sequence[Group], cost: int, first: Decision, field: str | None = None
) -> Steps[Decision | BackendError]:
    """Count the ``groups`` after ``head`` (already counted, with ``first`` the decision);
    on a denial give back what was taken (a denied request consumes nothing anywhere). A
    backend error stops the counting: what was taken is given back, and the error is the
    result.

    The request is counted once in the usage report, under ``field``: every call but the
    last counts it only if it denies (:func:`only_if_denied`; the head's call too), the last
    call counts whatever it decides. When ``first`` is a denial, nothing more is taken: the
    groups are only looked at, for the longest wait (:func:`longest_wait`)."""
    if not first.allowed:
        denied = yield from longest_wait(first, groups, cost)
        return _reported(head, groups, [denied])
    taken: list[Group] = [head]
    decisions = [first]
    try:
        for n, (client, limits) in enumerate(groups, 1):
            usage = field if n == len(groups) else only_if_denied(field)
            decision = yield Hit(client, limits, cost, usage)
            if not decision.allowed:
                yield from _give_back(
                    charged(taken, _spared(decisions)),
                    cost,
                    _taken_at(decisions),
                    "tokens taken from",
                )
                yield from _let_go(taken, decisions)
                denied = yield from longest_wait(decision, groups[n:], cost)
                return _reported(head, groups, [denied])
            taken.append((client, limits))
            decisions.append(decision)
    except BackendError as exc:
        yield from _give_back(
            charged(taken, _spared(decisions)), cost, _taken_at(decisions), "tokens taken from"
        )
        yield from _let_go(taken, decisions)
        return exc
    return _reported(head, groups, decisions)


def together_decision(head: Group, groups: Sequence[Group], decisions: list[Decision]) -> Decision:
    """The decision :func:`hit_groups` makes, from the decisions of every group counted in
    one call (``head`` and ``groups`` in order): when some denied (nothing was taken), the
    denial with the longest wait, the first of those that wait as long (as
    :func:`longest_wait` picks it); else the most restrictive of all."""
    denied = [decision for decision in decisions if not decision.allowed]
    if denied:
        worst = denied[0]
        for decision in denied[1:]:
            if decision.retry_after > worst.retry_after:
                worst = decision
        return _reported(head, groups, [worst])
    return _reported(head, groups, decisions)


def longest_wait(denied: Decision, rest: Sequence[Group], cost: int) -> Steps[Decision]:
    """The denial to report when ``denied`` stopped a request before the groups in ``rest``
    were counted: of ``denied`` and those groups' own denials (looked at, nothing taken),
    the one with the longest wait. ``Retry-After`` promises that the retry passes, so it
    must cover every counter that refuses now, not only the first one asked; the groups
    that allowed only fill up while the client waits. A group that cannot be looked at
    leaves the denial as it is: the request is refused either way."""
    worst = denied
    for client, limits in rest:
        try:
            decision = yield Peek(client, limits, cost)
        except BackendError:
            break
        if not decision.allowed and decision.retry_after > worst.retry_after:
            worst = decision
    return worst


def only_if_denied(field: str | None) -> str | None:
    """``field`` marked to be counted only when the call denies (``None`` stays ``None``)."""
    return None if not field else IF_DENIED + field


def _taken_at(decisions: list[Decision]) -> dict[str, int]:
    return dict(pair for decision in decisions for pair in decision.taken)


def _spared(decisions: list[Decision]) -> tuple[tuple[str, Limit], ...]:
    return tuple(pair for decision in decisions for pair in decision.spared)


def charged(groups: Sequence[Group], spared: tuple[tuple[str, Limit], ...]) -> tuple[Group, ...]:
    """``groups`` without the shadow limits their hit left unchanged (``Decision.spared``):
    what a refund of that hit gives back to. A group left with no limit is dropped."""
    if not spared:
        return tuple(groups)
    left = (
        (client, tuple(limit for limit in limits if (client, limit) not in spared))
        for client, limits in groups
    )
    return tuple((client, limits) for client, limits in left if limits)


def _give_back(
    groups: Sequence[Group],
    cost: int,
    at: dict[str, int],
    what: str,
    together: bool = False,
    looked: Group | None = None,
    local: bool = False,
) -> Steps[Decision | None]:
    """Refund ``cost`` to each group, each to the instant ``at`` names for its client; a
    refund the backend cannot make is logged (``what`` the client's tokens are) and left.
    ``together``: every group in one call (:class:`RefundTogether`) where the backend can
    make it, else one call each.

    ``looked`` (a client and limits of its given nothing back): the calls also look at
    those and at every limit they give back to, and the steps end with what the headers
    report once the tokens are back (the most restrictive of the calls' reports); else, or
    when a call failed or a limit could not be looked at, ``None``. Given one call each,
    ``looked``'s limits are looked at only beside a refund of its client's, or in a call of
    their own when the backend is in the process (``local``, or ``memory://``): one more
    round trip to Redis costs more than the figure is worth."""
    groups = tuple(groups)
    looks: tuple[Sequence[Limit], ...] | None = None
    if looked is not None:
        client, extra = looked
        looks = tuple(extra if key == client else () for key, _limits in groups)
        if extra and all(key != client for key, _limits in groups):
            groups, looks = (*groups, (client, ())), (*looks, extra)
    if together and len(groups) > 1:
        taken = tuple(at.get(client) for client, _limits in groups)
        try:
            done = yield RefundTogether(groups, cost, taken, looks)
        except BackendError as exc:
            clients = ", ".join(log_text(client) for client, _limits in groups)
            logger.warning("%s %s could not be given back: %s", what, clients, exc)
            return None
        if done:
            return _most_restrictive(done) if isinstance(done, list) else None
    seen: list[Decision | None] = []
    for n, (client, limits) in enumerate(groups):
        also = looks[n] if looks is not None else None
        if not limits and not (local or _in_process()):
            seen.append(None)  # only looked at: a call of its own (see above)
            continue
        try:
            seen.append((yield Refund(client, limits, cost, at.get(client), also)))
        except BackendError as exc:
            logger.warning("%s %s could not be given back: %s", what, log_text(client), exc)
            seen.append(None)
    return _most_restrictive(seen) if looks is not None else None


def _most_restrictive(seen: Sequence[Decision | None]) -> Decision | None:
    """What the headers report of the refunds' looks (one per call): the most restrictive,
    as :func:`_reported` picks it; ``None`` when one is missing or none reports a limit."""
    if not seen or any(decision is None for decision in seen):
        return None
    worst = min((d for d in seen if d is not None), key=_restrictive)
    return worst if worst.limit is not None else None


def _in_process() -> bool:
    """Whether the backend counts in this process (``memory://``): a call costs no round
    trip."""
    return not get_backend().blocking


def _let_go(groups: Sequence[Group], decisions: list[Decision]) -> Steps[None]:
    """Give back the concurrency slots ``decisions`` took (of ``groups``' calls, in order):
    a request denied by a later call holds none; one the backend cannot release ends with
    its lease."""
    limits = dict(groups)
    for decision in decisions:
        for client, lease in decision.leases:
            try:
                yield Release(client, limits[client], lease)
            except BackendError as exc:
                logger.warning(
                    "A concurrency slot of %s was not given back: %s", log_text(client), exc
                )


def _reported(head: Group, groups: Sequence[Group], decisions: list[Decision]) -> Decision:
    """The most restrictive of the groups' decisions (a denial; else the fewest tokens
    left), listing every limit that applied."""
    worst = min(decisions, key=_restrictive)
    every = tuple(head[1]) + tuple(limit for _client, limits in groups for limit in limits)
    shadow = any(d.shadow for d in decisions)
    taken = tuple(pair for d in decisions for pair in d.taken) if worst.allowed else ()
    spared = _spared(decisions) if worst.allowed else ()
    held = tuple(pair for d in decisions for pair in d.leases) if worst.allowed else ()
    wait = max(d.wait for d in decisions) if worst.allowed else 0.0  # each call's turn
    return dataclasses.replace(
        worst, limits=every, shadow=shadow, taken=taken, leases=held, wait=wait, spared=spared
    )


def _restrictive(decision: Decision) -> tuple[bool, bool, int, float]:
    """Sorts the most restrictive decision first: a denial; else the fewest tokens left."""
    return (decision.allowed, decision.limit is None, decision.remaining, -decision.reset_after)


def whole_seconds(seconds: float) -> int:
    """Round up to whole seconds, forgiving nothing: backends report waits free of float
    noise (an exact 3600 s arrives as 3600.0 s), so waiting the rounded value is never short."""
    return max(0, math.ceil(seconds))


def retry_after_seconds(seconds: float) -> int:
    """``Retry-After`` in whole seconds: rounded up with no tolerance (a retry after it must
    succeed, so it is never short, not even by a microsecond), and at least 1."""
    return max(1, whole_seconds(seconds))


#: A concurrency limit's algorithm, compared without an attribute lookup per header.
CONCURRENCY = Algorithm.CONCURRENCY
#: Says the backend could not answer and the failure mode decided (see the module docstring).
DEGRADED_HEADER = "X-RateLimit-Degraded"
#: Set on the (Django) request to the failure mode of a check made before the view whose
#: decision is not the request's (a DRF authentication class's credential check): the headers
#: middleware says so in :data:`DEGRADED_HEADER` whatever the response.
DEGRADED_ATTRIBUTE = "throttle_degraded"


def degraded_mode(decision: Decision) -> str | None:
    """The failure mode that decided (``open``: served uncounted; ``local``: counted per
    process), or ``None`` when the backend answered."""
    if decision.failed_open:
        return "open"
    return "local" if decision.local else None


class HeaderMap(Protocol):
    """Where headers are added: a response's ``headers`` or a ``dict``."""

    def setdefault(self, key: str, value: str, /) -> object: ...


def add_headers(headers: HeaderMap, decision: Decision | None) -> None:
    """Add every header ``decision`` implies to ``headers`` (a response's, through Django's
    public ``response.headers``, whose ``setdefault`` validates each name and value), without
    overwriting ones already set; nothing for ``None`` or when no enforced limit applied."""
    if decision is None:
        return
    if decision.failed_open or decision.local:
        headers.setdefault(DEGRADED_HEADER, "open" if decision.failed_open else "local")
    if decision.unavailable:
        if not decision.unidentified:
            headers.setdefault("Retry-After", str(retry_after_seconds(decision.retry_after)))
        return
    limit = decision.limit
    if limit is None or limit.shadow:
        return
    if limit.shared:
        limit = _as_met(limit)
    reset = max(0, math.ceil(decision.reset_after))  # whole_seconds
    headers.setdefault("X-RateLimit-Limit", str(limit.burst))  # its capacity
    headers.setdefault("X-RateLimit-Remaining", str(decision.remaining))
    headers.setdefault("X-RateLimit-Reset", str(reset))
    if not decision.allowed:
        headers.setdefault("Retry-After", str(retry_after_seconds(decision.retry_after)))
    elif decision.wait:
        headers.setdefault(DELAYED_HEADER, f"{decision.wait:.3f}")
    if app_settings.IETF_HEADERS:
        # The client's quotas: not shadow limits, nor the load shedder's fleet capacity,
        # unless the fleet is what refused the request: ``RateLimit`` then names it, and
        # every policy it names must be listed.
        shed = limit.id == FLEET
        enforced = [
            _as_met(item)
            for item in decision.limits
            if not item.shadow and (item.id != FLEET or shed)
        ] or [limit]
        headers.setdefault(
            "RateLimit-Policy",
            ", ".join(
                f'"{item.id}";q={item.capacity};w={whole_seconds(item.nominal_window)}'
                # The draft's quota unit for requests in flight (its default is "requests").
                + (';qu="concurrent-requests"' if item.algorithm == CONCURRENCY else "")
                for item in enforced
            ),
        )
        headers.setdefault("RateLimit", f'"{limit.id}";r={decision.remaining};t={reset}')


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """Every header the decision implies, as a dict (empty when no enforced limit applied)."""
    headers: dict[str, str] = {}
    add_headers(headers, decision)
    return headers


def _as_met(limit: Limit) -> Limit:
    """``limit`` as the client meets it: a shared limit's shard's share (the remaining count
    is of that share, so the capacity shown must be too). Worked out once per limit and
    policy version, in the snapshot's store (a change of the URL's ``?shards=`` drops the
    snapshot)."""
    if not limit.shared:
        return limit
    policy = policy_module.last()
    store: dict[Any, Any] = policy.compiled if policy is not None else {}
    met: Limit | None = store.get(("shared", limit))
    if met is None:
        from django_throttle.backends.base import per_shard

        met = store["shared", limit] = per_shard(limit, app_settings.key_shards)
    return met


def throttled_status(decision: Decision) -> int:
    """429 for a limit the client exceeded; 503 (``conf.FAILURE_STATUS``) when the limiter
    itself could not decide, or when the service sheds the request to protect itself
    (:attr:`~django_throttle.rates.Decision.shed`): neither is the client's fault."""
    return FAILURE_STATUS if decision.unavailable or decision.shed else 429


def in_flight(decision: Decision) -> bool:
    """Refused by a client's concurrency limit (its requests in flight), not by a rate: the
    refusal says so, since its wait is no time a slot is known to free."""
    limit = decision.limit
    refused = not decision.allowed and not decision.shed  # shed: the fleet's slots, not its own
    return refused and limit is not None and limit.algorithm == CONCURRENCY


def throttled_body(decision: Decision) -> dict[str, Any]:
    """The JSON body of a refusal: what was exceeded (or why nothing could be decided) and
    when to retry."""
    if decision.unidentified:
        return {
            "detail": gettext(
                "The server could not determine the client address, so the request cannot "
                "be rate limited and was refused. This is a server configuration problem."
            ),
            "limit": None,
            "retry_after": None,
        }
    wait = retry_after_seconds(decision.retry_after)
    limit = None
    if decision.unavailable:
        detail = ngettext(
            "Rate limiting is temporarily unavailable. Try again in %(wait)d second.",
            "Rate limiting is temporarily unavailable. Try again in %(wait)d seconds.",
            wait,
        )
    elif decision.shed:
        detail = ngettext(
            "The service is busy. Try again in %(wait)d second.",
            "The service is busy. Try again in %(wait)d seconds.",
            wait,
        )
    elif in_flight(decision):
        # No clock says when a slot frees: "expected available" would promise what the
        # retry may not get (another request may still run then).
        detail = ngettext(
            "Too many requests in progress at once. Try again in %(wait)d second, once one "
            "of them has ended.",
            "Too many requests in progress at once. Try again in %(wait)d seconds, once one "
            "of them has ended.",
            wait,
        )
        limit = decision.limit.name if decision.limit is not None else None
    else:
        detail = ngettext(
            "Request was throttled. Expected available in %(wait)d second.",
            "Request was throttled. Expected available in %(wait)d seconds.",
            wait,
        )
        limit = decision.limit.name if decision.limit is not None else None
    return {"detail": detail % {"wait": wait}, "limit": limit, "retry_after": wait}


#: How DRF's ``JSONRenderer`` writes JSON by default (``COMPACT_JSON``, ``UNICODE_JSON``): plain
#: views send a 429 body byte for byte like a DRF view's.
DRF_JSON: dict[str, Any] = {"separators": (",", ":"), "ensure_ascii": False}


def throttled_response(decision: Decision, request: Any = None) -> HttpResponseBase:
    """The refusal: 429 (or the failure status) with ``Retry-After`` and the rate-limit
    headers; its body a small JSON object, or, for a request whose ``Accept`` prefers
    ``text/html`` (a browser), a page saying the same in words
    (:func:`throttled_page`), with ``Vary: Accept`` on both. What
    ``DJANGO_THROTTLE_DENIED_RESPONSE`` builds wins, with the same headers added where it did
    not set them. A callable or template that fails is logged and the JSON response is sent
    instead: a refusal must never become a 500."""
    if request is not None:
        request.throttle_refusal = decision  # for the django.request log (signals.RefusalLog)
    factory = app_settings.DENIED_RESPONSE
    response = None if factory is None else _custom_response(factory, request, decision)
    if response is None:
        response = _default_response(decision, request)
    add_headers(response.headers, decision)
    return response


def _default_response(decision: Decision, request: Any) -> HttpResponseBase:
    status = throttled_status(decision)
    response: HttpResponseBase | None = None
    if wants_html(request):
        wait = None if decision.unidentified else retry_after_seconds(decision.retry_after)
        response = throttled_page(request, decision, status, wait)
    if response is None:
        response = JsonResponse(throttled_body(decision), status=status, json_dumps_params=DRF_JSON)
    patch_vary_headers(response, ("Accept",))
    return response


def _custom_response(path: str, request: Any, decision: Decision) -> HttpResponseBase | None:
    from django.utils.module_loading import import_string

    try:
        response = import_string(path)(request, decision)
        if not isinstance(response, HttpResponseBase):
            raise TypeError(f"it returned {type(response).__name__!r}, not an HttpResponse")
    except Exception:
        logger.exception("DJANGO_THROTTLE_DENIED_RESPONSE %s failed; sending the default", path)
        return None
    return response


# -- the refusal as a page -------------------------------------------------------------------
# A request whose ``Accept`` prefers ``text/html`` to JSON (a browser) gets the 429 or 503
# explained in words (what happened, how long to wait) instead of a JSON body it would show
# raw. API clients (``application/json``, ``*/*``, no ``Accept``) are never sent HTML. The page
# is the template ``django_throttle/throttled.html``, which a project overrides by putting its
# own under that name in a template directory found first. It extends nothing, so it renders
# outside the admin and with no project template. It is rendered without the request's context
# processors (a processor may query the database, which an async view may not do, and a refusal
# must stay cheap); its context names the request, the decision and the words.

#: The template of the page; override it in a project's templates.
THROTTLED_TEMPLATE = "django_throttle/throttled.html"

#: Offered in this order, so a tie (``*/*``, no ``Accept`` at all) goes to JSON.
_OFFERED = ("application/json", "text/html")


def wants_html(request: Any) -> bool:
    """Whether ``request`` prefers ``text/html`` to JSON by its ``Accept`` header (Django's
    ``HttpRequest.get_preferred_type``: quality first, then the more specific type)."""
    preferred = getattr(request, "get_preferred_type", None)
    return preferred is not None and preferred(_OFFERED) == "text/html"


def human_wait(seconds: int) -> str:
    """A wait in words, in the largest unit it fills, rounded up: "1 second", "2 minutes",
    "3 hours", "2 days" (a browser's reader must not come back too early)."""
    if seconds < 60:
        return ngettext("%(count)d second", "%(count)d seconds", seconds) % {"count": seconds}
    if seconds <= 3600:
        count = math.ceil(seconds / 60)
        return ngettext("%(count)d minute", "%(count)d minutes", count) % {"count": count}
    if seconds <= 86400:
        count = math.ceil(seconds / 3600)
        return ngettext("%(count)d hour", "%(count)d hours", count) % {"count": count}
    count = math.ceil(seconds / 86400)
    return ngettext("%(count)d day", "%(count)d days", count) % {"count": count}


def throttled_page(
    request: Any, decision: Decision, status: int, wait: int | None
) -> HttpResponse | None:
    """The page for ``decision`` answered with ``status``, or ``None`` when the template
    could not be rendered (logged; the caller sends its JSON instead: a refusal never
    becomes a 500). ``wait`` is the ``Retry-After`` in seconds (``None``: none is sent)."""
    context = {
        "request": request,
        "decision": decision,
        "status": status,
        "unavailable": decision.unavailable,
        "unidentified": decision.unidentified,
        "in_flight": in_flight(decision),
        "limit": None if decision.limit is None else decision.limit.name,
        "retry_after": wait,
        "wait": None if wait is None else human_wait(wait),
    }
    try:
        content = render_to_string(THROTTLED_TEMPLATE, context)
    except Exception:
        logger.exception("The template %s failed; sending the JSON refusal", THROTTLED_TEMPLATE)
        return None
    return HttpResponse(content, status=status)


# -- the worker shedder ----------------------------------------------------------------------
# This process sheds sheddable, then default requests on its own when it is saturated, before
# asking Redis anything (Stripe's "worker utilization load shedder"). Two signs of saturation,
# each set in the admin's Service protection:
#
# - Busy threads (WSGI, or sync views): :data:`busy`, counted by
#   :class:`~django_throttle.middleware.RateLimitHeadersMiddleware` around every request: the
#   requests this process is serving. Beyond the criticality's share of ``worker_capacity``
#   (its threads), a request is shed.
# - Event loop lag (ASGI): a small task on each running loop (:class:`LagWatch`, started by the
#   middleware's async path through :func:`watch_loop`) wakes every :data:`LAG_TICK` and notes
#   how late it woke; the lag it reports decays by half each :data:`LAG_HALF_LIFE`, so a loop
#   that was blocked is seen as blocked for about a second afterwards, not for one tick.
#   Sheddable requests are shed beyond ``worker_lag``, default ones beyond twice it.
#
# Critical requests are never shed by a worker. A shed request gets 503 with ``Retry-After: 1``
# (:data:`~django_throttle.rates.WORKER`, see :attr:`~django_throttle.rates.Decision.shed`) and
# no backend call: the worker protects Redis too.

#: Seconds between two wake-ups of a loop's lag watch.
LAG_TICK = 0.05
#: Seconds for the lag a watch reports to halve once the loop keeps time again.
LAG_HALF_LIFE = 0.25


class Busy:
    """Requests this process is serving now (``count``, those the middleware saw start and
    not yet end), changed under ``lock``. The middleware changes it inline, without a call:
    it runs on every request."""

    count = 0
    lock = threading.Lock()


busy = Busy()


class LagWatch:
    """How late one event loop runs: a task that sleeps :data:`LAG_TICK` and notes the overshoot."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._lag = 0.0
        self._at = time.monotonic()
        self.task = loop.create_task(self._run(), name="django-throttle-lag")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_TICK)
            late = max(0.0, loop.time() - before - LAG_TICK)
            self._lag, self._at = max(late, self.lag()), time.monotonic()

    def lag(self) -> float:
        """Seconds the loop ran late lately (decaying by half each :data:`LAG_HALF_LIFE`)."""
        return float(self._lag * 0.5 ** ((time.monotonic() - self._at) / LAG_HALF_LIFE))


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LagWatch] = (
    weakref.WeakKeyDictionary()
)


def watch_loop() -> None:
    """Watch the running loop's lag (once per loop; the middleware's async path calls it).
    The watch is forgotten when its task ends (the loop cancels it as it finishes): its task
    holds the loop, so a watch kept after would keep every loop that ever served a request
    (one per ``async_to_sync`` call) alive for the life of the process."""
    loop = asyncio.get_running_loop()
    if loop not in _watches:
        watch = _watches[loop] = LagWatch(loop)
        watch.task.add_done_callback(lambda _task: _watches.pop(loop, None))


def loop_lag() -> float | None:
    """The running loop's lag in seconds, ``None`` outside a watched loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    found = _watches.get(loop)
    return None if found is None else found.lag()


def worker_refusal(shedding: Shedding | None, criticality: str) -> Decision | None:
    """The 503 a request of ``criticality`` gets when this worker is saturated, else
    ``None``. Reads two numbers kept in process: no I/O."""
    if shedding is None or criticality == "critical":
        return None
    capacity, most_lag = shedding.worker_capacity, shedding.worker_lag
    if capacity is not None:
        room = max(1, capacity * shedding.shares.get(criticality, 100) // 100)
        if busy.count > room:
            return _worker_decision(criticality, room)
    if most_lag is not None:
        late = loop_lag()
        if late is not None and late > most_lag * (1 if criticality == "sheddable" else 2):
            return _worker_decision(criticality, capacity or 1)
    return None


def _worker_decision(criticality: str, room: int) -> Decision:
    limit = Limit.build(WORKER, Rate(room, 1), algorithm=Algorithm.CONCURRENCY, name=criticality)
    return Decision(
        allowed=False, limit=limit, remaining=0, reset_after=1.0, retry_after=1.0, limits=(limit,)
    )
