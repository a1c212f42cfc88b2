"""Where the running demo counts, so ``manage.py`` in a second terminal counts there too.

``run_demo`` may start a private ``redis-server`` on a free port; the operator commands
(``throttle_inspect``, ``throttle_reset``…) run in another process that cannot guess that port.
So ``run_demo`` records its Redis URL and key prefix in a small file next to the demo's
SQLite database (the database both processes already share), readable by its owner only,
and removes it on exit; the settings read it when ``REDIS_URL`` is unset. A record whose
process is gone (a crash, ``kill -9``) is ignored.

Nothing here imports Django: the settings module reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

__all__ = ["RunningDemo", "forget", "read", "record", "state_file"]


class RunningDemo(TypedDict):
    pid: int
    redis_url: str
    key_prefix: str


def state_file(database: Mapping[str, Any], base_dir: Path) -> Path:
    """The record of the demo using ``database`` (a ``DATABASES`` entry): next to its SQLite
    file, else one per project in ``base_dir``."""
    name = str(database.get("NAME") or "")
    if "sqlite" in str(database.get("ENGINE", "")) and name and name != ":memory:":
        return Path(name).with_name(Path(name).name + ".run_demo.json")
    return base_dir / ".run_demo.json"


def read(path: Path) -> RunningDemo | None:
    """The record at ``path`` if the process that wrote it still runs, else None."""
    try:
        data = json.loads(path.read_text())
        pid, url, prefix = int(data["pid"]), str(data["redis_url"]), str(data["key_prefix"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _alive(pid):
        return None
    return {"pid": pid, "redis_url": url, "key_prefix": prefix}


def record(path: Path, redis_url: str, key_prefix: str) -> None:
    """Write this process's record (mode 0600: the URL may hold the Redis password)."""
    data = json.dumps({"pid": os.getpid(), "redis_url": redis_url, "key_prefix": key_prefix})
    partial = path.with_name(path.name + f".{os.getpid()}.tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(data)
    os.replace(partial, path)


def forget(path: Path) -> None:
    """Remove the record at ``path`` if this process wrote it."""
    found = read(path)
    if found is not None and found["pid"] == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
