"""How long one admin page may spend reading Redis (:class:`ReadBudget`).

Each Redis-reading page of the admin (the dashboard, the inspector and its "explain") makes
its reads one after another, and a Redis that is slow but answering makes each of them wait
for its reply, just under the socket timeout: measured with ``tests/faultproxy.py`` delaying
each reply 1.6 s at ``socket_timeout=2``, the dashboard took 14.4 s, the inspector 4.8 s and
its "explain" 9.7 s (0.4 s at ``socket_timeout=0.5``: 3.7 s, 1.2 s and 2.0 s). A page now
starts no more reads once its reads have taken longer than its budget: what it has read is
shown, marked partial, and each section not read says so ("not read: Redis answered slowly
(3.2 s)"); the same delays now cost the dashboard 3.2 s, the inspector 3.2 s and "explain"
3.2 s; 1.2 s each at 0.5. The policy's version check is one of the page's reads: once the
budget is spent it is not made, and the page says the policy shown is the last one read
(:func:`~django_throttle.inspection.clients.budgeted_policy`; "explain" made it outside the
budget, due again a second after the inspection's, 4.8 s). A write the operator asked for (a
reset) is never skipped. ``manage.py`` commands have no budget: a script waits for its
answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from django.utils.translation import gettext as _

from django_throttle.backends import BackendError

#: The least budget, whatever the socket timeout: a healthy Redis answers a page's reads in
#: milliseconds, even a distant one, so the package's own 50 ms timeout must not cut them.
FLOOR = 1.0


class SlowRead(BackendError):
    """A read a page did not make: its budget was spent (the message says so, in words)."""


def socket_timeout() -> float | None:
    """The configured socket timeout of the Redis client (``None``: not known, as with the
    in-process backend): ``DJANGO_THROTTLE_REDIS_OPTIONS`` or the package's default, a
    ``socket_timeout`` in the URL's query winning as it does in redis-py."""
    from django_throttle.backends.redis_clients import client_options

    try:
        url, options = client_options()
    except Exception:  # no Redis configured (the in-process backend): no timeout to read
        return None
    value = parse_qs(urlsplit(url).query).get("socket_timeout", [options.get("socket_timeout")])
    try:
        return float(value[0]) if value[0] is not None else None
    except (TypeError, ValueError):
        return None


class ReadBudget:
    """One page's time for Redis reads, counted from when the page starts (Redis's replies
    are nearly all of it: its database reads take milliseconds).

    The budget is one socket timeout, at least :data:`FLOOR` (1 s): once the page's reads
    have taken longer, it starts none more, and the read in flight ends within one more
    socket timeout, so a page spends at most about two socket timeouts on Redis, however
    many sections and counters it reads. One socket timeout is what the operator already
    accepts for one read to fail; a Redis that takes that long for the page's first reads is
    too slow for the rest to be worth the wait, and the page says so rather than hanging.
    """

    def __init__(
        self, seconds: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if seconds is None:
            seconds = max(socket_timeout() or 0.0, FLOOR)
        self.seconds, self._clock = seconds, clock
        self._started = clock()

    @property
    def spent(self) -> float:
        """Seconds since the page started reading."""
        return self._clock() - self._started

    def exhausted(self) -> str:
        """Empty while the page may read on; once its budget is spent, why a section is not
        read, in words (translated)."""
        spent = self.spent
        if spent <= self.seconds:
            return ""
        return _("not read: Redis answered slowly (%(seconds).1f s)") % {"seconds": spent}

    def check(self) -> None:
        """Raise :class:`SlowRead` once the budget is spent (before a read)."""
        why = self.exhausted()
        if why:
            raise SlowRead(why)
