"""The Lua scripts and how they are called: each script assembled from the package's ``.lua``
files (one file per algorithm, a prelude, a driver per job), what a failed counting call
means (:func:`failure`), and how the commands that are not counting calls (retime, usage reads
and pushes, resets, the policy version) run, every failure of theirs a
:class:`~.base.BackendError` (:func:`call_backend`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from typing import Any, TypeVar

from django_throttle.backends.base import ArgumentRefused, BackendError

#: The algorithm files a spec code needs, its own and those whose functions it reuses (the
#: leaky bucket reuses the token bucket, the calendar quota the fixed window, the windows
#: ``windows.lua``'s helpers).
ALGORITHM_FILES_BY_CODE = {
    "t": ("token_bucket.lua",),
    "l": ("token_bucket.lua", "leaky_bucket.lua"),
    "g": ("gcra.lua",),
    "f": ("windows.lua", "fixed_window.lua"),
    "c": ("windows.lua", "fixed_window.lua", "calendar_quota.lua"),
    "w": ("windows.lua", "sliding_log.lua"),
    "s": ("windows.lua", "sliding_counter.lua"),
    "n": ("concurrency.lua",),
}
#: Every algorithm file, in load order.
ALGORITHM_FILES = tuple(dict.fromkeys(sum(ALGORITHM_FILES_BY_CODE.values(), ())))
#: Lua files making up the counting script, in load order: shared prelude, algorithms, driver.
SCRIPT_FILES = ("prelude.lua", *ALGORITHM_FILES, "driver.lua")
#: The same definitions with the retime driver (after a limit changed, see ``retime``);
#: ``retiming.lua`` has the algorithm files define their retime functions, which the
#: counting script leaves out (each function a script defines is built on every call).
RETIME_FILES = ("prelude.lua", "clock.lua", "retiming.lua", *ALGORITHM_FILES, "retime.lua")
#: The same definitions with the refund driver (a reservation given back, see ``refund``);
#: ``refunding.lua`` has the algorithm files define their refund functions, which the
#: counting script leaves out.
REFUND_FILES = ("prelude.lua", "clock.lua", "refunding.lua", *ALGORITHM_FILES, "refund.lua")
#: The counting script of several counters at once (a login counted by its client, its IP
#: address and its username: one call where the keys share a node, see ``hit_together``).
TOGETHER_FILES = ("prelude.lua", *ALGORITHM_FILES, "together.lua")
#: The refund script of several counters at once (see ``refund_together``).
REFUND_TOGETHER_FILES = (
    "prelude.lua",
    "clock.lua",
    "refunding.lua",
    *ALGORITHM_FILES,
    "refund_together.lua",
)
#: The script that releases and renews a request's concurrency leases (see ``release``).
LEASE_FILES = ("prelude.lua", "clock.lua", "lease.lua")
#: The KEYS and ARGV of one script call.
Call = tuple[Sequence[Any], Sequence[Any]]
T = TypeVar("T")
#: How the scripts' own error replies begin (``ERROR`` in lua/prelude.lua).
SCRIPT_ERROR_PREFIX = "django_throttle:"


def lua_file(name: str) -> str:
    """The text of one of the package's ``.lua`` files."""
    return (resources.files("django_throttle.backends") / "lua" / name).read_text("utf-8")


def load_script(files: Sequence[str] = SCRIPT_FILES) -> str:
    """A script's source, assembled from the package's ``.lua`` files: the definitions (every
    file but the last), then :data:`BODY_MARK` and the body each call runs (the driver)."""
    *definitions, body = map(lua_file, files)
    return "\n".join(definitions) + BODY_MARK + body


#: What separates a script's definitions from the body each call runs (see :func:`library`).
BODY_MARK = "\n-- django_throttle: the body of each call\n"
#: The names of the package's Redis functions and libraries: this, then the first
#: :data:`FUNCTION_DIGITS` hex digits of the script's digest (96 bits: no two scripts share
#: them), so a name is as long as the digest ``EVALSHA`` sends.
FUNCTION_PREFIX = "django_throttle_"
FUNCTION_DIGITS = 24


def function_name(sha: str) -> str:
    """The name of the Redis function (and of its library) holding the script ``sha``."""
    return FUNCTION_PREFIX + sha[:FUNCTION_DIGITS]


def library(sha: str, source: str) -> str:
    """The script ``source`` (digest ``sha``, as :func:`load_script` assembles it) as a Redis
    function library for ``FUNCTION LOAD``: its definitions run once, when the library loads,
    and each ``FCALL`` runs only the body. With ``EVALSHA`` Redis runs the whole script on
    every call, building every function it defines again: about a sixth of the counting
    call's script time (docs/explanation/benchmarks.md). The body reads ``KEYS`` and ``ARGV``
    as a script does, and the one state a call may leave behind (``LEASE``, the prelude's
    lease of this call) starts each call empty, as a script's does."""
    definitions, mark, body = source.rpartition(BODY_MARK)
    if not mark:
        raise ValueError("the script has no body mark (see load_script)")
    name = function_name(sha)
    return (
        f"#!lua name={name}\nlocal KEYS, ARGV\n{definitions}\n"
        "local function call(keys, args)\n  KEYS, ARGV, LEASE = keys, args, nil\n"
        f"{body}\nend\nredis.register_function('{name}', call)\n"
    )


def files_for(files: Sequence[str], codes: Iterable[str]) -> tuple[str, ...]:
    """``files`` with only the algorithm files that ``codes`` need, in their load order.

    Redis runs a script's whole body on every call, so each algorithm a script defines costs
    every call server time; a call therefore uses a script holding just the algorithms of its
    limits (the saving is measured in docs/explanation/benchmarks.md, "Scripts per mix of
    algorithms").
    """
    needed = {name for code in codes for name in ALGORITHM_FILES_BY_CODE[code]}
    return tuple(name for name in files if name not in ALGORITHM_FILES or name in needed)


def call_backend(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call into a storage client; whatever it raises is a :class:`BackendError`. Besides its
    own errors and socket errors, redis-py's parsers raise plain ValueError, AttributeError
    or IndexError on a garbled reply: all backend failures, never a 500."""
    try:
        return func(*args, **kwargs)
    except Exception as exc:
        raise BackendError(f"{type(exc).__name__}: {exc}") from exc


def failure(exc: BaseException) -> BackendError:
    """What a counting call's exception means to the request path: an error reply of our
    own script (it refused an argument we sent, and wrote nothing) is
    :class:`~.base.ArgumentRefused`; anything else out of redis-py, the socket or a garbled
    reply is a :class:`~.base.BackendError`, an outage the breaker counts."""
    message = f"{type(exc).__name__}: {exc}"
    if _is_error_reply(exc):
        text = str(exc)
        if text.startswith("ERR "):  # servers that prefix an error code of their own
            text = text[4:]
        if text.startswith(SCRIPT_ERROR_PREFIX):
            return ArgumentRefused(message)
    return BackendError(message)


def _is_error_reply(exc: BaseException) -> bool:
    """An error reply of the server (redis-py's ResponseError, which the memory store raises
    too), matched without importing redis."""
    return any(cls.__name__ == "ResponseError" for cls in type(exc).__mro__)


def evalsha_all(
    client: Any, sha: str, source: str, calls: Sequence[Call], check: bool = True
) -> list[Any]:
    """The replies of one EVALSHA per ``(keys, args)`` call, pipelined; those the server
    answered NOSCRIPT (its script cache was flushed: nothing ran) are sent again with EVAL,
    which carries the source, in a second pipeline. An error reply is a
    :class:`BackendError`, raised once every call has been sent (with ``check`` off, it is
    left in the list for the caller)."""
    pipe = client.pipeline(transaction=False)
    for keys, args in calls:
        pipe.evalsha(sha, len(keys), *keys, *args)
    replies = list(call_backend(pipe.execute, raise_on_error=False))
    missing = [i for i, reply in enumerate(replies) if _noscript(reply)]
    if missing:
        pipe = client.pipeline(transaction=False)
        for i in missing:
            keys, args = calls[i]
            pipe.eval(source, len(keys), *keys, *args)
        for i, reply in zip(missing, call_backend(pipe.execute, raise_on_error=False), strict=True):
            replies[i] = reply
    failed = [reply for reply in replies if isinstance(reply, Exception)]
    if failed and check:
        raise BackendError(f"{type(failed[0]).__name__}: {failed[0]}")
    return replies


def _noscript(reply: Any) -> bool:
    """A NOSCRIPT error reply (redis-py's NoScriptError, matched without importing redis)."""
    return isinstance(reply, Exception) and type(reply).__name__ == "NoScriptError"
