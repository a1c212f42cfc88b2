"""The worker shedder: this process sheds sheddable, then default requests on its own when it
is saturated, before asking Redis anything (Stripe's "worker utilization load shedder").

Two signs of saturation, each set in the admin's Service protection:

- **Busy threads** (WSGI, or sync views): :data:`busy`, counted by
  :class:`~django_throttle.middleware.RateLimitHeadersMiddleware` around every request: the
  requests this process is serving. Beyond the criticality's share of
  ``worker_capacity`` (its threads), a request is shed.
- **Event loop lag** (ASGI): a small task on each running loop (:class:`LagWatch`, started by
  the middleware's async path) wakes every :data:`TICK` and notes how late it woke; the lag
  it reports decays by half each :data:`HALF_LIFE`, so a loop that was blocked is seen as
  blocked for about a second afterwards, not for one tick. Sheddable requests are shed beyond
  ``worker_lag``, default ones beyond twice it.

Critical requests are never shed by a worker. A shed request gets 503 with ``Retry-After: 1``
(:data:`~django_throttle.rates.WORKER`, see :attr:`~django_throttle.rates.Decision.shed`) and
no backend call: the worker protects Redis too.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref

from django_throttle.policy.live import Shedding
from django_throttle.rates import WORKER, Algorithm, Decision, Limit, Rate

#: Seconds between two wake-ups of a loop's lag watch.
TICK = 0.05
#: Seconds for the lag a watch reports to halve once the loop keeps time again.
HALF_LIFE = 0.25


class Busy:
    """Requests this process is serving now (``count``, those the middleware saw start and
    not yet end), changed under ``lock``. The middleware changes it inline, without a call:
    it runs on every request."""

    count = 0
    lock = threading.Lock()


busy = Busy()


class LagWatch:
    """How late one event loop runs: a task that sleeps :data:`TICK` and notes the overshoot."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._lag = 0.0
        self._at = time.monotonic()
        self.task = loop.create_task(self._run(), name="django-throttle-lag")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK)
            late = max(0.0, loop.time() - before - TICK)
            self._lag, self._at = max(late, self.lag()), time.monotonic()

    def lag(self) -> float:
        """Seconds the loop ran late lately (decaying by half each :data:`HALF_LIFE`)."""
        return float(self._lag * 0.5 ** ((time.monotonic() - self._at) / HALF_LIFE))


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LagWatch] = (
    weakref.WeakKeyDictionary()
)


def watch_loop() -> None:
    """Watch the running loop's lag (once per loop; the middleware's async path calls it)."""
    loop = asyncio.get_running_loop()
    if loop not in _watches:
        _watches[loop] = LagWatch(loop)


def lag() -> float | None:
    """The running loop's lag in seconds, ``None`` outside a watched loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    found = _watches.get(loop)
    return None if found is None else found.lag()


def refusal(shedding: Shedding | None, criticality: str) -> Decision | None:
    """The 503 a request of ``criticality`` gets when this worker is saturated, else
    ``None``. Reads two numbers kept in process: no I/O."""
    if shedding is None or criticality == "critical":
        return None
    capacity, most_lag = shedding.worker_capacity, shedding.worker_lag
    if capacity is not None:
        room = max(1, capacity * shedding.shares.get(criticality, 100) // 100)
        if busy.count > room:
            return _shed(criticality, room)
    if most_lag is not None:
        late = lag()
        if late is not None and late > most_lag * (1 if criticality == "sheddable" else 2):
            return _shed(criticality, capacity or 1)
    return None


def _shed(criticality: str, room: int) -> Decision:
    limit = Limit.build(WORKER, Rate(room, 1), algorithm=Algorithm.CONCURRENCY, name=criticality)
    return Decision(
        allowed=False, limit=limit, remaining=0, reset_after=1.0, retry_after=1.0, limits=(limit,)
    )
