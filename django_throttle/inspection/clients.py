"""What an operator reads about one client: which tier and why, and the live state of every
counter its requests meet (read without consuming). Used by ``manage.py throttle_inspect``,
``throttle_explain``, ``throttle_reset`` and the admin's inspector; what a request would get
is :mod:`django_throttle.inspection.explanations`, clearing counters
:mod:`django_throttle.inspection.resets`.

The counters come from the request path itself
(:mod:`django_throttle.inspection.probes` builds the client's requests and asks
:func:`django_throttle.request.core.plan`), so counters by IP address and by
username are seen as requests meet them. These run off the request path, so they may query the
database (to say *why* a client is in a tier).

A shared limit (a ceiling over every client of a key shard) is listed, marked as shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.utils.translation import gettext as _

from django_throttle.backends import get_backend
from django_throttle.backends.base import per_shard
from django_throttle.conf import app_settings
from django_throttle.identity import client_ip
from django_throttle.inspection.probes import (
    Counter,
    Probe,
    every_counter,
    login_counters,
    login_probe,
)
from django_throttle.inspection.subjects import Subject, UnknownClient, tier_and_reason
from django_throttle.policy.live import current
from django_throttle.policy.snapshot import TierPolicy
from django_throttle.rates import Decision, Limit


@dataclass(frozen=True)
class Bucket:
    """One counter's live state. ``where`` says where the limit comes from (the tier, or an
    endpoint rule), ``counted_by`` whose counter it is (``"this client"``, ``"IP …"``,
    ``"username …"``), ``client`` the counter's key; ``state`` is the peek."""

    limit: Limit
    where: str
    state: Decision
    counted_by: str = "this client"
    client: str = ""

    @property
    def shared(self) -> bool:
        """A ceiling shared by every client of a key shard, not this client's own."""
        return self.limit.shared

    @property
    def capacity(self) -> int:
        """What the bucket holds: for a shared limit, its key shard's share."""
        return per_shard(self.limit, app_settings.KEY_SHARDS).capacity


@dataclass(frozen=True)
class Inspection:
    subject: Subject
    tier: TierPolicy | None
    reason: str
    buckets: list[Bucket] = field(default_factory=list)
    username: str | None = None


def probe(subject: Subject, address: str | None, username: str | None) -> Probe:
    """Who sends the client's requests: from ``address`` (an IP client's own by default),
    presenting ``username`` (a user's own username by default). A counter by username is
    probed by an anonymous login presenting that username."""
    if subject.by_username:
        if address is not None and client_ip({"REMOTE_ADDR": address}) is None:
            raise UnknownClient(_("%(value)r is not an IP address") % {"value": address})
        return login_probe(address, subject.username)
    if address is None:
        address = subject.address
    elif client_ip({"REMOTE_ADDR": address}) is None:
        raise UnknownClient(_("%(value)r is not an IP address") % {"value": address})
    if username is None and subject.user is not None:
        username = subject.user.get_username()
    return Probe(subject.identity, subject.user, address, username)


def counters(
    subject: Subject, username: str | None = None, address: str | None = None
) -> list[Counter]:
    """Every counter the client's requests meet (see :func:`probes.every_counter`); for a
    counter by username, its limits alone (whoever presents it, from wherever)."""
    if subject.by_username:
        return login_counters(subject.client, subject.username, current())
    return every_counter(probe(subject, address, username), current())


def inspect(
    subject: Subject, username: str | None = None, address: str | None = None
) -> Inspection:
    """The client's tier, why, and the state of every counter its requests meet, read
    without consuming: its tier's and rules' limits, counters by its IP address and by its
    username (a user's own; ``username`` for another client), and shared ceilings."""
    snapshot = current()
    tier, reason = tier_and_reason(subject, snapshot)
    if subject.by_username:
        found = login_counters(subject.client, subject.username, snapshot)
        return Inspection(subject, tier, reason, buckets(found), subject.username)
    who = probe(subject, address, username)
    return Inspection(subject, tier, reason, buckets(every_counter(who, snapshot)), who.username)


def buckets(found: Sequence[Counter]) -> list[Bucket]:
    """Each counter's live state, read without consuming."""
    backend = get_backend()
    return [
        Bucket(c.limit, c.where, backend.peek(c.client, [c.limit]), c.counted_by, c.client)
        for c in found
    ]
