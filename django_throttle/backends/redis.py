"""Redis backend: every limit of a request checked in one EVALSHA, on the server's clock.

Keys are ``<prefix>:{<client digest>}:<limit id>``: one hash tag per client, so all keys of one
call share a Redis Cluster slot. Scripts ship as ``.lua`` files in this package and run by
EVALSHA; on NOSCRIPT (the script did not run) they are sent once more with EVAL, which carries
the source. Nothing else is ever replayed, because a call that timed out may already have
counted: the clients this module builds have retries off, short timeouts and a bounded pool,
and every failure (redis-py's errors, socket errors, a garbled reply) surfaces as
:class:`BackendError`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from django_throttle.backends.base import DIGEST_CHARS, Backend, BackendError, decision_from
from django_throttle.conf import app_settings
from django_throttle.rates import Algorithm, Decision, Limit

#: Lua files making up the counting script, in load order: shared prelude, algorithms, driver.
SCRIPT_FILES = ("prelude.lua", *(f"{a.value}.lua" for a in Algorithm), "driver.lua")
#: The same definitions with the retime driver (after a limit changed, see ``retime``).
RETIME_FILES = (*SCRIPT_FILES[:-1], "retime.lua")
#: A stalled Redis must cost a request tens of milliseconds, not redis-py's default 5 s x 10.
DEFAULT_CLIENT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 0.05,
    "socket_timeout": 0.05,
    "max_connections": 64,
}
#: Options of a borrowed cache connection that would undo the bounds above; retries are
#: always off whatever the settings say, because a replayed call may count twice.
_NOT_BORROWED = ("retry", "retry_on_timeout", "retry_on_error", "timeout", "max_connections")
#: The policy version key outlives any sane gap between edits; missing simply means "reload".
POLICY_VERSION_TTL = 30 * 86400
#: Keys asked of each SCAN step, and so at most this many per retime script call.
RETIME_BATCH = 1000
_FLAGS = (0, 1)
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def load_script(files: Sequence[str] = SCRIPT_FILES) -> str:
    """A script's source, assembled from the package's ``.lua`` files."""
    folder = resources.files("django_throttle.backends") / "lua"
    return "\n".join((folder / name).read_text(encoding="utf-8") for name in files)


class Script:
    """One Lua script, called as ``script(keys, args)``.

    EVALSHA first; on NOSCRIPT, EVAL with the source, which loads it for the next EVALSHA.
    redis-py's ``register_script`` reloads with SCRIPT LOAD and then runs EVALSHA again, which
    fails when the cache is flushed in between (a failover, ``SCRIPT FLUSH``); EVAL cannot.
    """

    def __init__(self, client: redis.Redis, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self.client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return self.client.eval(self.source, len(keys), *keys, *args)


def build_client() -> redis.Redis:
    """A client with short timeouts, no retries and a bounded pool.

    It connects to ``DJANGO_THROTTLE_REDIS_URL``, else to the Redis of the cache named by
    ``DJANGO_THROTTLE_CACHE_ALIAS`` (its first ``LOCATION``, the primary, with its password and
    pool options) — never through the cache's own client, which has no timeouts.
    ``DJANGO_THROTTLE_REDIS_OPTIONS`` overrides any option except retries.
    """
    url = app_settings.REDIS_URL
    borrowed: dict[str, Any] = {}
    if url is None:
        url, borrowed = cache_connection(app_settings.CACHE_ALIAS)
        for name in _NOT_BORROWED:
            borrowed.pop(name, None)
    options = {**borrowed, **DEFAULT_CLIENT_OPTIONS, **app_settings.REDIS_OPTIONS}
    options.pop("retry_on_timeout", None)
    options.pop("retry_on_error", None)
    options["retry"] = Retry(NoBackoff(), 0)
    # How long a request may wait for a free pooled connection before failing over.
    options.setdefault("timeout", options.get("socket_connect_timeout", 0.05))
    return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, **options))


def cache_connection(alias: str) -> tuple[str, dict[str, Any]]:
    """The primary URL and connection options of a django-redis (or Django ``RedisCache``)
    cache, read from ``CACHES[alias]``."""
    config: dict[str, Any] = settings.CACHES.get(alias) or {}
    backend = str(config.get("BACKEND", ""))
    options: dict[str, Any] = dict(config.get("OPTIONS") or {})
    location = config.get("LOCATION") or ""
    urls = location.split(",") if isinstance(location, str) else list(location)
    url = str(urls[0]).strip() if urls else ""
    hint = (
        f"CACHES[DJANGO_THROTTLE_CACHE_ALIAS = {alias!r}] is not a Redis cache with a redis:// "
        "LOCATION the throttle can connect to: set DJANGO_THROTTLE_REDIS_URL."
    )
    if not url.startswith(("redis://", "rediss://", "unix://")) or "SENTINELS" in options:
        raise ImproperlyConfigured(hint)
    if backend.startswith("django_redis."):
        kwargs = dict(options.get("CONNECTION_POOL_KWARGS") or {})
        for option, kwarg in (("USERNAME", "username"), ("PASSWORD", "password")):
            if options.get(option):
                kwargs[kwarg] = options[option]
        return url, kwargs
    if backend == "django.core.cache.backends.redis.RedisCache":
        for name in ("pool_class", "parser_class", "serializer"):
            options.pop(name, None)
        return url, options
    raise ImproperlyConfigured(hint)


class RedisBackend(Backend):
    """Counts in Redis (single server or anything speaking its protocol with EVALSHA).

    A ``client`` passed in is used as it is: give it short timeouts and no retries.
    """

    def __init__(self, client: redis.Redis | None = None) -> None:
        self._owns_client = client is None
        self.client = client if client is not None else build_client()
        self.prefix = app_settings.KEY_PREFIX
        self._script = Script(self.client, load_script())
        self._retime_script = Script(self.client, load_script(RETIME_FILES))
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

    def retime(self, limits: Sequence[Limit], *, now: float | None = None) -> int:
        """SCAN each limit's keys (never KEYS: no long server stall) and re-time them in
        batches, one small script call per batch.

        Not Cluster-ready yet: one batch mixes slots; on a cluster, scan each primary and
        group a batch's keys by slot.
        """
        touched = 0
        when = "" if now is None else repr(now * 1e6)
        for limit in limits:
            pattern = "{}:{{{}}}:{}".format(
                _GLOB_SPECIAL.sub(r"\\\1", self.prefix),
                "?" * DIGEST_CHARS,
                _GLOB_SPECIAL.sub(r"\\\1", limit.id),
            )
            args = (limit.algorithm.value, limit.burst, repr(limit.rate.interval * 1e6), when)
            cursor = 0
            while True:
                cursor, keys = self._run(
                    self.client.scan, cursor=cursor, match=pattern, count=RETIME_BATCH
                )
                if keys:
                    touched += int(self._run(self._retime_script, keys, args))
                if not cursor:
                    break
        return touched

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
        try:
            allowed, index, remaining, reset_us, retry_us, shadow = self._script(keys, args)
            if allowed not in _FLAGS or shadow not in _FLAGS or not 0 <= index <= len(limits):
                raise ValueError(f"unexpected reply {[allowed, index, shadow]!r}")
            return decision_from(
                limits, allowed == 1, index - 1, remaining, reset_us, retry_us, shadow == 1
            )
        except Exception as exc:  # anything out of redis-py: see _run
            raise BackendError(f"{type(exc).__name__}: {exc}") from exc

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
    def _run(func: Any, *args: Any, **kwargs: Any) -> Any:
        """Call into redis-py; whatever it raises is a :class:`BackendError`. Besides its own
        errors and socket errors, its parsers raise plain ValueError, AttributeError or
        IndexError on a garbled reply: all backend failures, never a 500."""
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            raise BackendError(f"{type(exc).__name__}: {exc}") from exc
