"""Redis backend: every limit of a request checked in one EVALSHA, on the server's clock.

Keys are ``<prefix>:{<client digest>}:<limit id>``: one hash tag per client, so all keys of one
call share a Redis Cluster slot. Scripts ship as ``.lua`` files in this package and run through
redis-py's ``register_script`` (EVALSHA; on NOSCRIPT it loads the script and runs it once).
Nothing else is ever replayed, because a call that timed out may already have counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_throttle.backends.base import Backend, BackendError, decision_from
from django_throttle.conf import app_settings
from django_throttle.rates import Algorithm, Decision, Limit

logger = logging.getLogger("django_throttle.backends.redis")

#: Lua files making up the one script, in load order: shared prelude, algorithms, driver.
SCRIPT_FILES = ("prelude.lua", *(f"{a.value}.lua" for a in Algorithm), "driver.lua")
#: A stalled Redis must cost a request tens of milliseconds, not redis-py's default 5 s x 10.
DEFAULT_CLIENT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 0.05,
    "socket_timeout": 0.05,
    "max_connections": 64,
}
#: The policy version key outlives any sane gap between edits; missing simply means "reload".
POLICY_VERSION_TTL = 30 * 86400


def load_script() -> str:
    """The counting script's source, assembled from the package's ``.lua`` files."""
    folder = resources.files("django_throttle.backends") / "lua"
    return "\n".join((folder / name).read_text(encoding="utf-8") for name in SCRIPT_FILES)


def build_client() -> redis.Redis:
    """A client with short timeouts and no retries, from ``DJANGO_THROTTLE_REDIS_URL``, or the
    django-redis connection of ``DJANGO_THROTTLE_CACHE_ALIAS`` when no URL is set."""
    url = app_settings.REDIS_URL
    if url is None:
        from django_redis import get_redis_connection

        alias = app_settings.CACHE_ALIAS
        try:
            return get_redis_connection(alias)  # type: ignore[no-any-return]
        except (NotImplementedError, KeyError, AttributeError) as exc:
            raise ImproperlyConfigured(
                "Set DJANGO_THROTTLE_REDIS_URL, or make CACHES[DJANGO_THROTTLE_CACHE_ALIAS = "
                f"{alias!r}] a django-redis cache."
            ) from exc
    options = {**DEFAULT_CLIENT_OPTIONS, **app_settings.REDIS_OPTIONS}
    options.setdefault("retry", Retry(NoBackoff(), 0))
    # How long a request may wait for a free pooled connection before failing over.
    options.setdefault("timeout", options.get("socket_connect_timeout", 0.05))
    return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, **options))


class RedisBackend(Backend):
    """Counts in Redis (single server or anything speaking its protocol with EVALSHA)."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self._owns_client = client is None and app_settings.REDIS_URL is not None
        self.client = client if client is not None else build_client()
        self.prefix = app_settings.KEY_PREFIX
        self._script = self.client.register_script(load_script())
        self._version_key = f"{self.prefix}:policy-version"
        self._encodings: dict[int, tuple[Sequence[Limit], tuple[str, ...], tuple[Any, ...]]] = {}

    def key(self, client: str, limit: Limit) -> str:
        return self._tag(client) + limit.id

    def _tag(self, client: str) -> str:
        """The key prefix all of one client's counters share: one Cluster hash slot."""
        return f"{self.prefix}:{{{self.digest(client)}}}:"

    def hit(
        self, client: str, limits: Sequence[Limit], cost: int = 1, *, now: float | None = None
    ) -> Decision:
        return self._call(client, limits, cost, now, "hit")

    def peek(self, client: str, limits: Sequence[Limit], *, now: float | None = None) -> Decision:
        return self._call(client, limits, 0, now, "peek")

    def reset(self, client: str, limits: Sequence[Limit]) -> None:
        if limits:
            self._run(self.client.delete, *(self.key(client, limit) for limit in limits))

    def get_policy_version(self) -> str | None:
        value = self._run(self.client.get, self._version_key)
        return None if value is None else value.decode() if isinstance(value, bytes) else value

    def bump_policy_version(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(self._version_key)
        pipe.expire(self._version_key, POLICY_VERSION_TTL)
        self._run(pipe.execute)

    def close(self) -> None:
        if self._owns_client:
            self.client.connection_pool.disconnect()

    def _call(
        self, client: str, limits: Sequence[Limit], cost: int, now: float | None, mode: str
    ) -> Decision:
        tag = self._tag(client)
        suffixes, limit_args = self._encoded(limits)
        keys = [tag + suffix for suffix in suffixes]
        args = ("" if now is None else repr(now * 1e6), cost, mode, *limit_args)
        allowed, index, remaining, reset_us, retry_us, shadow = self._run(self._script, keys, args)
        return decision_from(
            limits, allowed == 1, index - 1, remaining, reset_us, retry_us, shadow == 1
        )

    def _encoded(self, limits: Sequence[Limit]) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """Key suffixes and script arguments of a limit list, cached by the list's identity:
        the policy snapshot hands out the same tuple for every request of a tier/endpoint."""
        cached = self._encodings.get(id(limits))
        if cached is not None and cached[0] is limits:
            return cached[1], cached[2]
        suffixes = tuple(limit.id for limit in limits)
        args: tuple[Any, ...] = ()
        for limit in limits:
            args += (
                limit.algorithm.value,
                limit.burst,
                repr(limit.rate.interval * 1e6),
                "1" if limit.shadow else "0",
            )
        if len(self._encodings) >= 4096:  # bounded: policy reloads leave old tuples behind
            self._encodings.clear()
        self._encodings[id(limits)] = (limits, suffixes, args)
        return suffixes, args

    @staticmethod
    def _run(func: Any, *args: Any) -> Any:
        try:
            return func(*args)
        except redis.RedisError as exc:
            raise BackendError(f"{type(exc).__name__}: {exc}") from exc
