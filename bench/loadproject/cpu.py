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


def processes_cpu(pids: set[int], groups: set[int]) -> float:
    """CPU seconds of the live processes in ``pids`` or in the process groups ``groups``."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        if int(entry.name) in pids or int(fields[2]) in groups:
            total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICK


def own_cpu(pids: set[int], groups: set[int]) -> float:
    """This process, its waited-for children (wrk) and the given processes and groups."""
    mine = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (mine.ru_utime + mine.ru_stime + waited.ru_utime + waited.ru_stime) + processes_cpu(
        pids, groups
    )


class Meter:
    """``with Meter(pids, groups) as meter: ...`` then ``meter.foreign`` (cores) and
    ``meter.ours`` (cores), both averaged over the block's wall time."""

    def __init__(self, pids: set[int], groups: set[int]) -> None:
        self.pids, self.groups = pids, groups
        self.foreign = self.ours = 0.0

    def __enter__(self) -> Meter:
        self._start = (time.monotonic(), machine_busy(), own_cpu(self.pids, self.groups))
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self._start[0]
        busy = machine_busy() - self._start[1]
        ours = own_cpu(self.pids, self.groups) - self._start[2]
        self.ours = round(ours / wall, 3)
        self.foreign = round(max(busy - ours, 0.0) / wall, 3)
