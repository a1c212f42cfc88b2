"""The least-privilege Redis ACL user for the throttle: the commands and the key pattern it
needs, and nothing else.

Managed Redis (ElastiCache, Memorystore, Azure Cache, Upstash) gives each application its own
ACL user. The throttle's needs no ``@dangerous`` or ``@admin`` command (no ``KEYS``, ``FLUSH*``,
``CONFIG``, ``SCRIPT FLUSH`` or ``DEBUG``), touches only keys under its
``DJANGO_THROTTLE_KEY_PREFIX``, and never publishes or subscribes. :func:`acl_rules` spells that
user in ``ACL SETUSER`` words; the docs (``docs/howto/managed-redis.md``) print it for the
default prefix, and the test suite runs as it (``DJANGO_THROTTLE_TEST_ACL=least-privilege``),
so a command added to a script or an operator tool without being listed here fails there.
"""

from __future__ import annotations

import re

__all__ = ["acl_rules"]

#: Every command the throttle sends, or its Lua scripts call (a script's calls are checked
#: against the caller's ACL too), with what it is for. redis-py's ``CLIENT SETINFO`` on
#: connect is left out: redis-py ignores its refusal, and Redis before 7.2 has no such
#: command for an ACL rule to name.
COMMANDS = {
    "evalsha": "every decision, peek, refund, retime batch and usage push: one script call",
    "eval": "the same script sent whole when the server has not cached it (NOSCRIPT)",
    "time": "the scripts read the server's clock, so every worker counts on one clock",
    "get": "policy version; counters and state of the fixed-window and calendar algorithms",
    "set": "counters and state written by the scripts, with their expiry",
    "incrby": "the policy version, bumped when an admin edit must reach every worker (INCR)",
    "expire": "every key written expires (policy version, usage minutes)",
    "pexpire": "the scripts' keys expire with their window",
    "del": "reset (manage.py throttle_reset, the admin's reset) and the scripts",
    "scan": "retime and reset find a limit's keys (never KEYS: no long stall)",
    "hincrby": "usage: requests and denials per minute",
    "hgetall": "usage reports read a minute's totals",
    "zadd": "sliding logs; usage's top clients and late minutes",
    "zrange": "sliding logs; usage reports read the top clients",
    "zrevrange": "the sliding log reads its newest entries",
    "zrangebyscore": "the sliding log finds when a slot frees (Retry-After)",
    "zremrangebyscore": "the sliding log forgets what left its window",
    "zremrangebyrank": "usage keeps its top clients bounded",
    "zrem": "refund takes back a sliding-log entry",
    "zcard": "the sliding log counts its entries",
    "zcount": "the sliding log counts what is still in the window",
    "zpopmin": "usage: the rollup takes the minutes pushed late",
    "zmscore": "usage reports read chosen clients' counts",
    "ping": "redis-py's health checks (health_check_interval)",
    "client|setname": "client_name in DJANGO_THROTTLE_REDIS_OPTIONS names connections",
}

#: What redis-py's ``RedisCluster`` adds on a cluster: reading the slot map and the command
#: table when it starts, and following an ``ASK`` redirect during a resharding.
CLUSTER_COMMANDS = {
    "cluster|slots": "the slot map, read when the client starts and after a MOVED reply",
    "cluster|shards": "the slot map on servers and redis-py versions that read it so",
    "command": "the command table, read once when the client starts (which arguments are keys)",
    "asking": "follow an ASK redirect to the node importing a slot",
}

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob (``SCAN MATCH``, an ACL key pattern)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def key_pattern(prefix: str) -> str:
    """The ACL key pattern covering every key under ``prefix``."""
    return f"~{glob_escape(prefix)}:*"


def acl_rules(prefix: str, *, cluster: bool = False) -> list[str]:
    """``ACL SETUSER`` rules for the throttle's user: its keys, no channels, its commands.

    ``resetkeys`` and ``-@all`` first, so applying them to an existing user takes away what it
    had; the password and ``on`` are the caller's to add."""
    commands = {**COMMANDS, **(CLUSTER_COMMANDS if cluster else {})}
    return [
        "resetkeys",
        key_pattern(prefix),
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in commands),
    ]
