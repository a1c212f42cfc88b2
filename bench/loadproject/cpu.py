"""Whose CPU a run used: the machine's busy time minus this load test's own processes.

On a shared machine other work steals cores from the server under test; ``load_test.py``
records that "foreign" CPU per run (in cores, averaged over the run) and reruns a run that
had too much of it.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds all cores spent not idle since boot (guest time is inside user time)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / TICK  # minus idle and iowait


def processes() -> dict[int, tuple[int, float]]:
    """pid -> (process group, CPU seconds) of every live process."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        found[int(entry.name)] = (int(fields[2]), (int(fields[11]) + int(fields[12])) / TICK)
    return found


def this_process() -> float:
    """CPU seconds of this process and its waited-for children (the finished wrk runs)."""
    mine = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + waited.ru_utime + waited.ru_stime


class Meter:
    """CPU over a ``with`` block. ``redis`` is the Redis pid, ``groups`` the process groups of
    every server, ``measured`` the one under load. Afterwards: ``foreign`` and ``ours`` in
    cores (averaged over the block's wall time), ``server`` and ``redis_seconds`` in CPU
    seconds of the measured server's processes and of Redis."""

    def __init__(self, redis: int | None, groups: set[int], measured: int) -> None:
        self.redis, self.groups, self.measured = redis, groups, measured
        self.foreign = self.ours = self.server = self.redis_seconds = 0.0

    def _snapshot(self) -> tuple[float, float, float, float, float]:
        table = processes()
        servers = sum(cpu for group, cpu in table.values() if group in self.groups)
        measured = sum(cpu for group, cpu in table.values() if group == self.measured)
        redis = table.get(self.redis or -1, (0, 0.0))[1]
        return time.monotonic(), machine_busy(), this_process() + servers + redis, measured, redis

    def __enter__(self) -> Meter:
        self._start = self._snapshot()
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, ours, server, redis = (
            end - start for end, start in zip(self._snapshot(), self._start, strict=True)
        )
        self.ours = round(ours / wall, 3)
        self.foreign = round(max(busy - ours, 0.0) / wall, 3)
        self.server, self.redis_seconds = server, redis
