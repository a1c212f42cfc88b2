"""A Redis Cluster next to a single server, in the same run: speed, round trips, spread, exactness.

Run from the repository root::

    .venv/bin/python bench/bench_cluster.py [--seconds 3] [--clients 100000] [--shards 16,64]
        [--json] [--out-dir bench/results]

One run starts a private ``redis-server`` (``example_project.private_redis.PrivateRedis``) and a
local Redis Cluster of three primaries (``tests.topologies.LocalCluster``: slots split evenly,
no replicas unless ``--replicas``), configures Django in-process, then measures:

- **Speed**, per client thread: four paths in interleaved slices (``bench_meter``): ``PING`` on
  a plain redis-py client of each topology (``redis.Redis``, ``redis.RedisCluster``: the floors,
  sharing none of our code), and ``RedisBackend.hit()`` from ``get_backend()`` with
  ``DJANGO_THROTTLE_REDIS_URL`` the server's URL or the cluster's ``redis+cluster://`` URL
  (no ``?shards=`` on that URL: 1 and 16). Every decision is a client never seen
  before (``user:<n>``) under two limits, 100/minute sliding window counter and 1000/hour token
  bucket. Decisions/s are medians over rounds, ÷PING the median of each round's ratio to the
  same topology's PING, and cluster/single the median of each round's ratio of those ratios.
  The CPU time of this process and of the topology's ``redis-server`` processes (``/proc``) is
  read around every slice: per decision, and in cores busy while the path ran; so are the
  cores the hypervisor stole from the VM meanwhile (``/proc/stat``).
- **Round trips** per call of every path, counted at the socket in this process
  (``bench_costs.Wire``) over an untimed pass of ``--accounting`` fresh clients.
- **Spread**, per ``--shards`` count: ``--clients`` clients ``user:0`` … on the emptied cluster,
  the servers' active expiry paused (a ``1000/hour`` key touched once expires after 3.6 s):
  keys each primary holds afterwards (``DBSIZE``) and counting commands each served (``INFO
  commandstats`` ``evalsha`` + ``eval`` after ``CONFIG RESETSTAT``), max/min over the primaries,
  round trips at the socket; and, computed from the slot map without sending anything, the
  clients each primary would get at more shard counts (``--by-slot``).
- **Exactness**: ``--threads`` threads x ``--tries`` tries at once at one client, under one
  limit of ``--limit`` per day of each algorithm of the list, on each topology: admitted/limit.

Targets are printed, never asserted. On 2 cores shared by this process and every
``redis-server``, the client (Python) is the bottleneck rather than Redis's execution: compare
the client's CPU per decision with Redis's execution time (``INFO commandstats``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench_costs import Wire  # noqa: E402
from bench_meter import Path as BenchPath  # noqa: E402
from bench_meter import Source, constant, percentile, ratio_median, run_slice  # noqa: E402
from loadproject.cpu import TICK, this_process  # noqa: E402

#: The limit list of every timed and spread decision: (id, rate, algorithm).
LIMITS = (
    ("u1", "100/minute", "sliding_window_counter"),
    ("u2", "1000/hour", "token_bucket"),
)
PRIMARIES = 3
#: Shard counts whose spread is computed from the slot map (nothing sent).
BY_SLOT = (16, 32, 48, 64, 128, 256)
#: Clients sent before a spread pass so that every primary has loaded the script.
WARM_CLIENTS = 300
SPREAD_TARGET = 1.2
RATIO_TARGET = 0.9


def build_limits(period: str | None = None, count: int | None = None) -> tuple[Any, ...]:
    """The realistic list, or with ``count`` and ``period`` one limit per algorithm of it
    at that rate (for the exactness check)."""
    from django_throttle.rates import Limit

    return tuple(
        Limit.build(limit_id, f"{count}/{period}" if count else rate, algorithm=algorithm)
        for limit_id, rate, algorithm in LIMITS
    )


@contextlib.contextmanager
def throttle_settings(**values: Any) -> Iterator[None]:
    """``DJANGO_THROTTLE_<name>`` settings in force inside the block."""
    from django.test import override_settings

    with override_settings(**{f"DJANGO_THROTTLE_{name}": v for name, v in values.items()}):
        yield


def backend_for(url: str, shards: int | None = None) -> Any:
    """``get_backend()`` with ``REDIS_URL`` (and its ``?shards=``, unless None: the default),
    warmed up while those settings hold (a cluster client is built on first use), then kept:
    leaving the settings would otherwise close it."""
    from django_throttle.backends import get_backend, reset_backend_cache

    with throttle_settings(REDIS_URL=url if shards is None else f"{url}?shards={shards}"):
        backend = get_backend()
        limits = build_limits()
        for n in range(WARM_CLIENTS):  # every shard's primary loads the script
            backend.hit(f"warm:{n}", limits)
        reset_backend_cache(close=False)  # the caller uses this one
    return backend


@dataclass
class Primary:
    """One primary: a client of its own for INFO, DBSIZE and CONFIG, its pid and slots."""

    name: str
    port: int
    pid: int | None
    client: Any
    slots: list[tuple[int, int]] = field(default_factory=list)

    @property
    def slot_text(self) -> str:
        return ", ".join(f"{first}-{last}" for first, last in self.slots) or "-"


@dataclass
class Topology:
    key: str
    label: str
    url: str
    plain: Any
    primaries: list[Primary]
    #: Every ``redis-server`` of the topology (replicas too): whose CPU its paths cost.
    pids: list[int]
    backend: Any = None

    @property
    def ports(self) -> set[int]:
        return {primary.port for primary in self.primaries}


def single_topology(private: Any) -> Topology:
    import redis

    client = redis.Redis.from_url(private.url)
    primary = Primary("single", private.port, private.pid, client)
    plain = redis.Redis.from_url(private.url)
    return Topology("single", "single node", private.url, plain, [primary], [private.pid])


def cluster_topology(cluster: Any) -> Topology:
    import redis

    first = cluster.nodes[0]
    plain = redis.RedisCluster(host="127.0.0.1", port=first.port)
    primaries = []
    for number, node in enumerate(sorted(cluster.primaries(), key=slot_start(cluster)), 1):
        client = node.client()
        slots = [
            (int(low), int(high))
            for low, high, owner, *_ in client.execute_command("CLUSTER", "SLOTS")
            if int(owner[1]) == node.port
        ]
        primaries.append(Primary(f"primary {number}", node.port, node.pid, client, sorted(slots)))
    pids = [node.pid for node in cluster.nodes if node.pid is not None]
    return Topology("cluster", f"{PRIMARIES}-primary cluster", cluster.url, plain, primaries, pids)


def slot_start(cluster: Any) -> Callable[[Any], int]:
    """Sort key of a primary: the first slot it serves."""
    with contextlib.closing(cluster.nodes[0].client()) as client:
        owners = {
            int(o[1]): int(low) for low, _, o, *_ in client.execute_command("CLUSTER", "SLOTS")
        }
    return lambda node: owners.get(node.port, 1 << 20)


def build_paths(topology: Topology) -> list[Any]:
    """PING on the topology's plain client, and ``hit()`` of a client it never saw."""
    plain, backend, limits = topology.plain, topology.backend, build_limits()

    def ping(_: object) -> object:
        return plain.execute_command("PING")

    def hit(client: str) -> object:
        return backend.hit(client, limits)

    def users(start: int, n: int) -> list[str]:
        return [f"user:{i}" for i in range(start, start + n)]

    label = topology.label
    return [
        BenchPath(f"ping_{topology.key}", f"PING, plain redis-py, {label}", ping, constant(None)),
        BenchPath(f"hit_{topology.key}", f"hit(), {label}", hit, Source(users)),
    ]


def redis_cpu(pids: Sequence[int]) -> float:
    """CPU seconds the processes ``pids`` used so far (``/proc/<pid>/stat``)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


@dataclass
class CPU:
    """CPU seconds of this process and of a path's Redis, and the wall time, of its slices."""

    client: float = 0.0
    redis: float = 0.0
    wall: float = 0.0
    calls: int = 0

    @contextlib.contextmanager
    def slice(self, path: Any, pids: Sequence[int]) -> Iterator[None]:
        calls, wall, mine, theirs = (
            len(path.samples),
            time.monotonic(),
            this_process(),
            redis_cpu(pids),
        )
        yield
        self.client += this_process() - mine
        self.redis += redis_cpu(pids) - theirs
        self.wall += time.monotonic() - wall
        self.calls += len(path.samples) - calls

    def read(self) -> dict[str, float | None]:
        if not self.calls or not self.wall:
            return {
                "client_cpu_us": None,
                "redis_cpu_us": None,
                "client_cores": None,
                "redis_cores": None,
            }
        return {
            "client_cpu_us": self.client / self.calls * 1e6,
            "redis_cpu_us": self.redis / self.calls * 1e6,
            "client_cores": self.client / self.wall,
            "redis_cores": self.redis / self.wall,
        }


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave other guests while this VM wanted them (``/proc/stat``
    steal, all cores): how noisy a shared VM was."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / TICK if len(fields) > 8 else 0.0


def interleave_metered(
    paths: Sequence[Any], pids: dict[str, list[int]], seconds: float, slice_seconds: float
) -> tuple[int, dict[str, CPU]]:
    """``bench_meter.interleave`` (same rounds, same rotating order), with the CPU of this
    process and of the path's ``redis-server`` processes read around each slice."""
    rounds = max(3, round(seconds / slice_seconds))
    cpu = {path.key: CPU() for path in paths}
    for number in range(rounds):
        shift = number % len(paths)
        for path in [*paths[shift:], *paths[:shift]]:
            with cpu[path.key].slice(path, pids[path.key]):
                run_slice(path, seconds / rounds)
    return rounds, cpu


class Wires(Wire):
    """``bench_costs.Wire`` counting this process's traffic with any of ``ports``."""

    def __init__(self, ports: set[int]) -> None:
        super().__init__(0)
        self.ports = ports

    def _is_ours(self, sock: Any) -> bool:
        ours = self._ours.get(id(sock))
        if ours is None:
            try:
                ours = sock.getpeername()[1] in self.ports
            except (OSError, IndexError, TypeError):
                ours = False
            self._ours[id(sock)] = ours
        return ours


def round_trips(path: Any, n: int, topology: Topology) -> dict[str, Any]:
    """Round trips and commands per call over ``n`` calls of fresh items, at the socket, and
    the servers' own time executing them (``INFO commandstats`` ``usec`` of the commands
    sent: a script's inner commands are inside its ``evalsha``)."""
    items = path.source.take(n)
    wire = Wires(topology.ports)
    before = [commandstats(primary) for primary in topology.primaries]
    with wire.counting():
        for item in items:
            path.step(item)
    after = [commandstats(primary) for primary in topology.primaries]
    usec = sum(
        int(now.get(name, {}).get("usec", 0)) - int(then.get(name, {}).get("usec", 0))
        for then, now in zip(before, after, strict=True)
        for name in wire.commands
    )
    return {
        "accounted_calls": n,
        "round_trips": wire.round_trips / n,
        "commands": {name: calls / n for name, calls in sorted(wire.commands.items())},
        "server_us": usec / n,
    }


def commandstats(primary: Primary) -> dict[str, dict[str, int]]:
    stats = primary.client.info("commandstats")
    return {name.removeprefix("cmdstat_"): row for name, row in stats.items()}


def set_active_expiry(primaries: Sequence[Primary], on: bool) -> bool:
    """Switch the servers' active expiry (DEBUG, allowed on our own servers); False if not."""
    try:
        for primary in primaries:
            primary.client.execute_command("DEBUG", "SET-ACTIVE-EXPIRE", int(on))
    except Exception:
        return False
    return True


def spread(topology: Topology, shards: int, clients: int) -> dict[str, Any]:
    """``clients`` fresh clients on the emptied cluster with ``shards`` key shards: keys and
    counting commands per primary, round trips at the socket."""
    backend = backend_for(topology.url, shards)
    limits = build_limits()
    names = [f"user:{n}" for n in range(clients)]
    for primary in topology.primaries:
        primary.client.flushall()
        primary.client.config_resetstat()
    paused = set_active_expiry(topology.primaries, False)
    wire = Wires(topology.ports)
    try:
        started = time.perf_counter()
        with wire.counting():
            for name in names:
                backend.hit(name, limits)
        took = time.perf_counter() - started
        rows: list[dict[str, Any]] = []
        for primary in topology.primaries:
            stats = commandstats(primary)
            counting = ("fcall", "evalsha", "eval")
            fcall, evalsha, scripted = (int(stats.get(c, {}).get("calls", 0)) for c in counting)
            rows.append(
                {
                    "primary": primary.name,
                    "port": primary.port,
                    "slots": primary.slot_text,
                    "keys": int(primary.client.dbsize()),
                    "counting_commands": fcall + evalsha + scripted,
                    "server_us": sum(int(stats.get(c, {}).get("usec", 0)) for c in counting),
                    "fcall": fcall,
                    "evalsha": evalsha,
                    "eval": scripted,
                    "failed_calls": sum(
                        int(stats.get(c, {}).get("failed_calls", 0)) for c in counting
                    ),
                }
            )
    finally:
        if paused:
            set_active_expiry(topology.primaries, True)
        backend.close()
    keys = [row["keys"] for row in rows]
    commands = [row["counting_commands"] for row in rows]
    return {
        "shards": shards,
        "clients": clients,
        "expiry_paused": paused,
        "primaries": rows,
        "keys_max_min": max_min(keys),
        "commands_max_min": max_min(commands),
        "keys_per_decision": sum(keys) / clients,
        "counting_commands_per_decision": sum(commands) / clients,
        "round_trips": wire.round_trips / clients,
        "server_us_per_decision": sum(row["server_us"] for row in rows) / clients,
        "commands_sent": {name: calls / clients for name, calls in sorted(wire.commands.items())},
        "untimed_decisions_per_s": clients / took,
    }


def max_min(values: Sequence[int]) -> float | None:
    return max(values) / min(values) if values and min(values) > 0 else None


def by_slot(topology: Topology, counts: Sequence[int], clients: int) -> list[dict[str, Any]]:
    """Clients per primary at each shard count, computed from the slot map (nothing sent):
    the primary serving the slot of each client's key."""
    from redis.crc import key_slot

    from django_throttle.backends.redis import RedisBackend

    limit = build_limits()[0]
    owner = [""] * 16384
    for primary in topology.primaries:
        for first, last in primary.slots:
            owner[first : last + 1] = [primary.name] * (last - first + 1)
    rows = []
    for shards in counts:
        with throttle_settings(REDIS_URL=f"{topology.url}?shards={shards}"):
            backend = RedisBackend()  # no network: only its key layout is used
        slots = {key_slot(tag.encode()) for tag in backend.shard_tags()}
        per_primary = dict.fromkeys((p.name for p in topology.primaries), 0)
        shards_per_primary = dict.fromkeys(per_primary, 0)
        for slot in slots:
            shards_per_primary[owner[slot]] += 1
        for n in range(clients):
            per_primary[owner[key_slot(backend.key(f"user:{n}", limit).encode())]] += 1
        rows.append(
            {
                "shards": shards,
                "shards_per_primary": list(shards_per_primary.values()),
                "clients_per_primary": list(per_primary.values()),
                "max_min": max_min(list(per_primary.values())),
            }
        )
    return rows


def race(backend: Any, client: str, limit: Any, threads: int, tries: int) -> tuple[int, int]:
    """``threads`` threads, released together, each trying ``tries`` times at ``client``:
    how many tries were admitted, and how many raised."""
    admitted, errors = [0] * threads, [0] * threads
    barrier = threading.Barrier(threads)

    def work(number: int) -> None:
        barrier.wait()
        for _ in range(tries):
            try:
                admitted[number] += backend.hit(client, (limit,)).allowed
            except Exception:
                errors[number] += 1

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(admitted), sum(errors)


def exactness(topology: Topology, threads: int, tries: int, count: int) -> list[dict[str, Any]]:
    """Per algorithm of the list, one limit of ``count`` per day raced at one client: how
    many were admitted (exact: ``count``)."""
    rows = []
    for limit in build_limits("day", count):
        client = f"exact:{limit.algorithm}:{time.time_ns()}"
        admitted, errors = race(topology.backend, client, limit, threads, tries)
        rows.append(
            {
                "topology": topology.key,
                "algorithm": str(limit.algorithm),
                "threads": threads,
                "tries": threads * tries,
                "limit": count,
                "admitted": admitted,
                "errors": errors,
            }
        )
    return rows


def make_cluster(replicas: int) -> Any:
    """A local cluster (not started) whose nodes allow ``DEBUG`` from 127.0.0.1."""
    from tests.topologies import LocalCluster

    cluster = LocalCluster(primaries=PRIMARIES, replicas=replicas)
    for node in cluster.nodes:  # DEBUG SET-ACTIVE-EXPIRE keeps every key a spread pass wrote
        node.extra_args = (*node.extra_args, "--enable-debug-command", "local")
    return cluster


def measure_speed(
    topologies: Sequence[Topology], args: argparse.Namespace
) -> tuple[int, float, dict[str, Any]]:
    """Warm-up, the socket-counted pass, then the interleaved timed slices of every path;
    the rounds, the cores stolen by the hypervisor meanwhile, and the paths' numbers."""
    owned = [(topology, path) for topology in topologies for path in build_paths(topology)]
    for _, path in owned:  # connections, scripts, framing
        run_slice(path, min(0.2, args.seconds / 5))
        path.rates.clear()
        path.samples.clear()
    accounting = {path.key: round_trips(path, args.accounting, t) for t, path in owned}
    pids = {path.key: topology.pids for topology, path in owned}
    steal, wall = steal_seconds(), time.monotonic()
    rounds, cpu = interleave_metered([path for _, path in owned], pids, args.seconds, args.slice)
    stolen = (steal_seconds() - steal) / (time.monotonic() - wall)
    pings = {topology.key: path for topology, path in owned if path.key.startswith("ping")}
    results = {}
    for topology, path in owned:
        results[path.key] = {
            "label": path.label,
            "topology": topology.key,
            "decisions_per_s": statistics.median(path.rates),
            "rounds": path.rates,
            "vs_ping": ratio_median(path.rates, pings[topology.key].rates),
            "p50_us": percentile(path.samples, 0.5) / 1e3,
            "p99_us": percentile(path.samples, 0.99) / 1e3,
            "timed_calls": len(path.samples),
            **cpu[path.key].read(),
            **accounting[path.key],
        }
    return rounds, stolen, results


def run(args: argparse.Namespace, private: Any, cluster: Any) -> dict[str, Any]:
    from bench_throttle import configure_django

    configure_django(private.url, "dt", count_usage=False)
    single, clustered = single_topology(private), cluster_topology(cluster)
    topologies = (single, clustered)
    for topology in topologies:
        topology.backend = backend_for(topology.url)
    rounds, stolen, results = measure_speed(topologies, args)
    spreads = [spread(clustered, shards, args.clients) for shards in args.shards]
    computed = by_slot(clustered, sorted({*args.by_slot, *args.shards}), args.clients)
    exact = [
        row
        for topology in topologies
        for row in exactness(topology, args.threads, args.tries, args.limit)
    ]
    report = {
        "machine": {**machine(single), "steal_cores_while_timed": stolen},
        "settings": {
            "seconds_per_path": args.seconds,
            "slice": args.slice,
            "rounds": rounds,
            "clients": args.clients,
            "accounting": args.accounting,
            "limits": [f"{rate} {algorithm}" for _, rate, algorithm in LIMITS],
            "primaries": PRIMARIES,
            "replicas": args.replicas,
            "default_shards": {t.key: t.backend.shards for t in topologies},
        },
        "paths": results,
        "cluster_vs_single": compare(results),
        "spread": spreads,
        "by_slot": computed,
        "exactness": exact,
    }
    report["targets"] = targets(report)
    for topology in topologies:
        topology.backend.close()
        topology.plain.close()
        for primary in topology.primaries:
            primary.client.close()
    return report


def compare(results: dict[str, Any]) -> dict[str, float]:
    """The cluster over the single node, each a median of per-round ratios."""
    hit_c, hit_s, ping_c, ping_s = (
        results[key]["rounds"]
        for key in ("hit_cluster", "hit_single", "ping_cluster", "ping_single")
    )
    ratios = [
        (hc / pc) / (hs / ps) for hc, hs, pc, ps in zip(hit_c, hit_s, ping_c, ping_s, strict=True)
    ]
    return {
        "hit_vs_ping": statistics.median(ratios),
        "hit": ratio_median(hit_c, hit_s),
        "ping": ratio_median(ping_c, ping_s),
    }


def machine(single: Topology) -> dict[str, Any]:
    import redis

    return {
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "redis": single.primaries[0].client.info("server").get("redis_version"),
    }


def target(label: str, value: float | None, comparison: str, goal: float) -> dict[str, Any]:
    met = value is not None and (value >= goal if comparison == ">=" else value <= goal)
    return {"target": label, "value": value, "comparison": comparison, "goal": goal, "met": met}


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    found = [
        target(
            "cluster hit() ÷ PING over single node's (within 10%)",
            report["cluster_vs_single"]["hit_vs_ping"],
            ">=",
            RATIO_TARGET,
        ),
        target(
            "cluster round trips per decision",
            report["paths"]["hit_cluster"]["round_trips"],
            "<=",
            1.0,
        ),
    ]
    for row in report["spread"]:
        found += [
            target(
                f"{row['shards']} shards: keys per primary max/min",
                row["keys_max_min"],
                "<=",
                SPREAD_TARGET,
            ),
            target(
                f"{row['shards']} shards: counting commands per primary max/min",
                row["commands_max_min"],
                "<=",
                SPREAD_TARGET,
            ),
            target(
                f"{row['shards']} shards: round trips per decision", row["round_trips"], "<=", 1.0
            ),
        ]
    for row in report["exactness"]:
        found.append(
            target(
                f"{row['topology']} {row['algorithm']}: admitted - limit",
                row["admitted"] - row["limit"],
                "<=",
                0,
            )
        )
    return found


def _number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(150, Console().width))
    settings, box = report["settings"], report["machine"]
    speed = Table(
        title=(
            f"One client thread: {settings['seconds_per_path']:g} s per path in "
            f"{settings['rounds']} interleaved rounds, limits {' + '.join(settings['limits'])}, "
            f"every decision a new client; Redis {box['redis']}, redis-py {box['redis_py']}, "
            f"load average {box['load_average'][0]:.1f} on {box['cpus']} CPUs, "
            f"{box['steal_cores_while_timed']:.2f} cores stolen by the hypervisor while timed"
        )
    )
    columns = (
        "path", "dec/s", "÷PING", "p50 µs", "p99 µs", "round trips", "client CPU µs/dec",
        "Redis CPU µs/dec", "Redis exec µs/dec", "client cores", "Redis cores",
    )  # fmt: skip
    for column in columns:
        speed.add_column(column, justify="left" if column == "path" else "right")
    for row in report["paths"].values():
        speed.add_row(
            row["label"],
            _number(row["decisions_per_s"]),
            f"{row['vs_ping']:.2f}",
            _number(row["p50_us"], 1),
            _number(row["p99_us"], 1),
            f"{row['round_trips']:.3f}",
            _number(row["client_cpu_us"]),
            _number(row["redis_cpu_us"]),
            _number(row["server_us"], 1),
            _number(row["client_cores"], 2),
            _number(row["redis_cores"], 2),
        )
    console.print(speed)
    ratio = report["cluster_vs_single"]
    console.print(
        f"cluster ÷ single node: hit() ÷ PING {ratio['hit_vs_ping']:.2f}, hit() "
        f"{ratio['hit']:.2f}, PING {ratio['ping']:.2f} (medians of per-round ratios)"
    )
    for row in report["spread"]:
        table = Table(
            title=(
                f"Spread: {row['clients']:,} clients, {row['shards']} shards: keys max/min "
                f"{_number(row['keys_max_min'], 2)}, counting commands max/min "
                f"{_number(row['commands_max_min'], 2)}, {row['round_trips']:.3f} round trips "
                f"and {row['counting_commands_per_decision']:.3f} counting commands per decision"
                + ("" if row["expiry_paused"] else " (active expiry NOT paused: keys undercounted)")
            )
        )
        for column in ("primary", "slots", "keys", "counting commands (fcall + evalsha + eval)"):
            table.add_column(column, justify="left" if column in ("primary", "slots") else "right")
        for primary in row["primaries"]:
            table.add_row(
                f"{primary['primary']} (:{primary['port']})",
                primary["slots"],
                _number(primary["keys"]),
                f"{primary['counting_commands']:,} ({primary['fcall']:,} + {primary['evalsha']:,}"
                f" + {primary['eval']:,})",
            )
        console.print(table)
    computed = Table(title="Computed from the slot map (nothing sent): clients per primary")
    for column in ("shards", "shards per primary", "clients per primary", "max/min"):
        computed.add_column(column, justify="right")
    for row in report["by_slot"]:
        computed.add_row(
            str(row["shards"]),
            " / ".join(map(str, row["shards_per_primary"])),
            " / ".join(f"{n:,}" for n in row["clients_per_primary"]),
            _number(row["max_min"], 2),
        )
    console.print(computed)
    exact = Table(title="Exactness: threads released together at one client")
    for column in ("topology", "algorithm", "threads x tries", "admitted / limit", "errors"):
        exact.add_column(column, justify="left" if column in ("topology", "algorithm") else "right")
    for row in report["exactness"]:
        exact.add_row(
            row["topology"],
            row["algorithm"],
            f"{row['threads']} x {row['tries'] // row['threads']}",
            f"{row['admitted']} / {row['limit']}",
            str(row["errors"]),
        )
    console.print(exact)
    goals = Table(title="Targets (printed, never asserted)")
    for column in ("target", "measured", "goal", ""):
        goals.add_column(column, justify="left" if column == "target" else "right")
    for item in report["targets"]:
        value = item["value"]
        shown = "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        verdict = "[green]met[/]" if item["met"] else "[red]not met[/]"
        goals.add_row(item["target"], shown, f"{item['comparison']} {item['goal']:g}", verdict)
    console.print(goals)
    console.print(
        "Timed: only the call. CPU µs/dec and cores: this process (getrusage) and the "
        "topology's redis-server processes (/proc, kernel time included) around each slice. "
        "Redis exec µs/dec: the servers' own time in the commands sent (INFO commandstats), "
        "over the socket-counted pass. One thread waits for each reply: neither side fills a "
        "core, and the wall time per decision is the client's CPU, Redis's and the wake-ups."
    )


def write_results(report: dict[str, Any], directory: Path) -> None:
    """``cluster.json`` (the whole report) and ``cluster.csv`` (one row per shard count and
    primary) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cluster.json").write_text(json.dumps(report, indent=2) + "\n")
    names = (
        "shards",
        "clients",
        "primary",
        "port",
        "slots",
        "keys",
        "counting_commands",
        "fcall",
        "evalsha",
        "eval",
    )
    with open(directory / "cluster.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names, extrasaction="ignore")
        writer.writeheader()
        for row in report["spread"]:
            for primary in row["primaries"]:
                writer.writerow({"shards": row["shards"], "clients": row["clients"], **primary})


def counts(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(",") if n)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per path")
    parser.add_argument("--slice", type=float, default=0.2, help="seconds per interleaved slice")
    parser.add_argument("--clients", type=int, default=100_000, help="clients per spread pass")
    parser.add_argument(
        "--accounting", type=int, default=3000, help="calls per path counted at the socket"
    )
    parser.add_argument(
        "--shards", type=counts, default=(16, 64), help="key shards (?shards=) of the spread passes"
    )
    parser.add_argument(
        "--by-slot", type=counts, default=BY_SLOT, help="shard counts computed from the slot map"
    )
    parser.add_argument("--replicas", type=int, default=0, help="replicas per primary")
    parser.add_argument("--threads", type=int, default=8, help="threads of the exactness check")
    parser.add_argument("--tries", type=int, default=40, help="tries per thread")
    parser.add_argument("--limit", type=int, default=50, help="the exactness check's limit")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out-dir", type=Path, help="write cluster.json and cluster.csv there")
    args = parser.parse_args(argv)
    if (
        args.seconds <= 0
        or min(args.clients, args.accounting, args.threads, args.tries, args.limit) < 1
    ):
        parser.error(
            "--seconds, --clients, --accounting, --threads, --tries and --limit must be positive"
        )
    if not args.shards or min(args.shards) < 1 or args.replicas < 0:
        parser.error("--shards needs at least one positive count; --replicas cannot be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from example_project.private_redis import PrivateRedis

    private = PrivateRedis(extra_args=("--enable-debug-command", "local")).start()
    cluster = make_cluster(args.replicas)
    try:
        report = run(args, private, cluster.start())
    finally:
        cluster.stop()
        private.stop()
    if args.out_dir is not None:
        write_results(report, args.out_dir)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
