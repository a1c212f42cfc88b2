"""Adaptive limits under a surge: a service whose latency climbs with load, two tiers of
clients, a surge of the low-priority one; run without and with the adaptive controller.

Run by hand from the repository root (never in CI)::

    .venv/bin/python bench/load_adaptive.py            # about four minutes
    .venv/bin/python bench/load_adaptive.py --quick    # about 40 s, *_quick files

Needs the ``bench`` extra (uvicorn, matplotlib). One run starts a private ``redis-server``,
migrates a SQLite file and writes two tiers as an operator would: ``free`` (the default tier
of anonymous clients, priority 0) and ``pro`` (priority 10, API keys), each with one token
bucket limit per client (``--free-limit``/``--free-burst``, ``--pro-limit``/``--pro-burst``).
For each run it starts a fresh uvicorn (``--workers`` workers) serving ``loadproject``'s
``/adaptive/work/`` (``loadproject.adaptive``: its service time grows with the requests in
flight in the server, ``--base-ms * (1 + (n - 1) / --capacity)``, so beyond ``--capacity /
--base-ms`` requests a second the latency climbs for as long as the overload lasts). A
middleware records the latency of every served request in Redis; the load signal
(:data:`SIGNAL`, ``loadproject.adaptive.p95_over_target``) is its p95 over the last
``--window`` seconds divided by ``--target-ms``. Run "adaptive" also starts the controller,
``python -m django throttle_adapt --signal <it> --step <--step>``, as an operator would.

The load, from threads of this process (the same machine as the server), open loop (each
request sent when due, whatever came back; Poisson arrivals, seeded): ``--free-clients``
client addresses at ``--free-rate`` requests a second each, ``--surge-rate`` during the
surge; ``--pro-clients`` API keys at ``--pro-rate`` each throughout. Phases: ``--before``
seconds normal, ``--surge`` seconds of surge, ``--after`` seconds normal. The surge stays
under the free tier's own limit: only a scaled-down limit refuses it.

Recorded per second: the p95 latency of the served requests (as the clients saw it, and as
the server measured it), served and refused (429) requests by tier, the tiers' automatic
factors (sampled from Redis), the signal the controller read. Before each run it waits (up
to ``--patience`` s) for other processes to use at most ``--max-foreign`` cores. Writes
``<out-dir>/<stem>.json`` and ``.png``. Every process it started is stopped at the end, also
on errors, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import loadkit
from loadkit import log, percentile, round1

PATH = "/adaptive/work/"
#: The controller's ``--signal``: the p95 of the served requests over its target.
SIGNAL = "loadproject.adaptive.p95_over_target"
RUNS = ("static", "adaptive")
TIERS = ("free", "pro")
#: Client addresses of each run: fresh counters, whatever the other run left in Redis.
NETWORKS = {"static": "10.4", "adaptive": "10.5"}


def prepare_tiers(args: argparse.Namespace) -> dict[str, Any]:
    """The anonymous tier ``private_setup`` made becomes ``free``; ``pro`` gets one API key
    per client and run. Returns ``{"tier ids": {id: slug}, "keys": {run: [key, …]}}``."""
    from django_throttle.models import ApiKey, Tier, TierLimit

    free = Tier.objects.get(is_default_anonymous=True)
    free.slug, free.name, free.priority = "free", "Free", 0
    free.save()
    TierLimit.objects.filter(tier=free).update(rate=args.free_limit, burst=args.free_burst)
    pro = Tier.objects.create(slug="pro", name="Pro", priority=10)
    TierLimit.objects.create(tier=pro, rate=args.pro_limit, burst=args.pro_burst)
    keys = {
        run: [
            ApiKey.objects.create_key(name=f"{run} {n}", tier=pro)[1]
            for n in range(args.pro_clients)
        ]
        for run in RUNS
    }
    return {"tiers": {free.id: "free", pro.id: "pro"}, "keys": keys}


def send(port: int, headers: dict[str, str], timeout: float) -> int:
    """Status of one GET of ``PATH`` on a new connection; 0 on a socket error or timeout."""
    return loadkit.fetch(port, PATH, headers, timeout)[0]


def probe(port: int, keys: list[str], args: argparse.Namespace) -> None:
    """Fail early unless the tiers apply: a free client's burst beyond its limit's burst is
    partly refused, a pro key is served."""
    sent = args.free_burst + 4
    with ThreadPoolExecutor(sent) as pool:
        for attempt in range(3):
            address = {"X-Forwarded-For": f"192.0.2.{attempt + 1}"}
            statuses = list(pool.map(lambda a: send(port, a, 10), [address] * sent))
            pro = send(port, {"X-API-Key": keys[0]}, 10)
            if statuses.count(429) > 0 and statuses.count(200) > 0 and pro == 200:
                return
    raise RuntimeError(f"probe: free burst {statuses}, pro {pro}")


class Load:
    """The clients, open loop, and the sampler of factors and requests in flight."""

    def __init__(
        self,
        port: int,
        run: str,
        keys: list[str],
        tiers: dict[int, str],
        redis_url: str,
        args: argparse.Namespace,
    ) -> None:
        import redis

        self.port, self.run, self.keys, self.tiers, self.args = port, run, keys, tiers, args
        self.in_flight_key = f"lt-adapt:{run}:in-flight"  # loadproject.adaptive's key
        self.redis = redis.Redis.from_url(redis_url)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        # (tier, due, sent, answered, status), times in Unix seconds
        self.requests: list[tuple[str, float, float, float, int]] = []
        # (time, {slug: automatic factor}, requests in flight in the server)
        self.samples: list[tuple[float, dict[str, float], int]] = []

    def schedule(self, start: float) -> list[tuple[float, str, dict[str, str]]]:
        """Every request of the run: (due, tier, headers), in order."""
        args = self.args
        rng = random.Random(args.seed)
        surge_from, surge_to = args.before, args.before + args.surge
        end = surge_to + args.after
        events = []
        for client in range(args.free_clients):
            headers = {
                "X-Forwarded-For": f"{NETWORKS[self.run]}.{client // 250}.{client % 250 + 1}"
            }
            t = 0.0
            while True:
                rate = args.surge_rate if surge_from <= t < surge_to else args.free_rate
                t += rng.expovariate(rate)
                if t >= end:
                    break
                events.append((start + t, "free", headers))
        for key in self.keys:
            headers = {"X-API-Key": key}
            t = rng.expovariate(args.pro_rate)
            while t < end:
                events.append((start + t, "pro", headers))
                t += rng.expovariate(args.pro_rate)
        events.sort(key=lambda e: e[0])
        return events

    def request(self, due: float, tier: str, headers: dict[str, str]) -> None:
        sent = time.time()
        status = send(self.port, headers, self.args.timeout)
        answered = time.time()
        with self.lock:
            self.requests.append((tier, due, sent, answered, status))

    def sampler(self) -> None:
        from django_throttle.backends.adaptive_store import parse_factors

        factors_key = "lt:adaptive:factors"  # DJANGO_THROTTLE_KEY_PREFIX "lt"
        while not self.stop.is_set():
            factors, in_flight = self.redis.mget(factors_key, self.in_flight_key)
            by_slug = {slug: 1.0 for slug in self.tiers.values()}
            by_slug.update(
                {self.tiers[t]: f for t, f in parse_factors(factors).items() if t in self.tiers}
            )
            self.samples.append((time.time(), by_slug, int(in_flight or 0)))
            self.stop.wait(self.args.sample_every)

    def drive(self) -> float:
        """Send every request when due; returns the start (Unix s) of the schedule."""
        start = time.time() + 0.5
        events = self.schedule(start)
        sampler = threading.Thread(target=self.sampler)
        sampler.start()
        try:
            with ThreadPoolExecutor(self.args.threads) as pool:
                for due, tier, headers in events:
                    wait = due - time.time()
                    if wait > 0 and self.stop.wait(wait):
                        break
                    pool.submit(self.request, due, tier, headers)
        finally:
            self.stop.set()
            sampler.join()
        return start


def per_second(
    load: Load,
    start: float,
    server: list[tuple[float, float]],
    signals: list[tuple[float, float | None]],
) -> list[dict[str, Any]]:
    """One row per second of the schedule: the phase, requests due, served and refused by
    tier (by when they were answered), p50/p95 of the served ones as the clients saw them and
    as the server measured them, the tiers' factors and the requests in flight (the second's
    last sample), the signal (the second's last value)."""
    args = load.args
    rows = []
    for second in range(int(args.before + args.surge + args.after)):
        low, high = start + second, start + second + 1
        ended = [r for r in load.requests if low <= r[3] < high]
        served = [(r[3] - r[2]) * 1e3 for r in ended if r[4] == 200]
        measured = [ms for t, ms in server if low <= t < high]
        samples = [s for s in load.samples if low <= s[0] < high]
        read = [value for t, value in signals if low <= t < high]
        row: dict[str, Any] = {
            "second": second,
            "phase": "surge" if args.before <= second < args.before + args.surge else "normal",
        }
        for tier in TIERS:
            of_tier = [r for r in ended if r[0] == tier]
            row[f"{tier}_due"] = sum(
                1 for r in load.requests if r[0] == tier and low <= r[1] < high
            )
            row[f"{tier}_served"] = sum(1 for r in of_tier if r[4] == 200)
            row[f"{tier}_refused"] = sum(1 for r in of_tier if r[4] == 429)
            row[f"{tier}_other"] = sum(1 for r in of_tier if r[4] not in (200, 429))
            row[f"{tier}_factor"] = samples[-1][1][tier] if samples else None
        row.update(
            p50_ms=round1(percentile(served, 0.5)),
            p95_ms=round1(percentile(served, 0.95)),
            server_p95_ms=round1(percentile(measured, 0.95)),
            in_flight=samples[-1][2] if samples else None,
            signal=read[-1] if read else None,
        )
        rows.append(row)
    return rows


def phase_summary(
    rows: list[dict[str, Any]], load: Load, start: float, server: list[tuple[float, float]]
) -> dict[str, Any]:
    """Each phase in a few numbers; the surge's second half apart (after the controller had
    time to act)."""
    args = load.args
    bounds = {
        "before": (0, args.before),
        "surge": (args.before, args.before + args.surge),
        "surge_second_half": (args.before + args.surge / 2, args.before + args.surge),
        "after": (args.before + args.surge, args.before + args.surge + args.after),
    }
    phases: dict[str, Any] = {}
    for name, (low, high) in bounds.items():
        ended = [r for r in load.requests if start + low <= r[3] < start + high]
        served = [(r[3] - r[2]) * 1e3 for r in ended if r[4] == 200]
        measured = [ms for t, ms in server if start + low <= t < start + high]
        seconds = high - low
        phase: dict[str, Any] = {
            "seconds": seconds,
            "p50_ms": round1(percentile(served, 0.5)),
            "p95_ms": round1(percentile(served, 0.95)),
            "server_p95_ms": round1(percentile(measured, 0.95)),
        }
        for tier in TIERS:
            of_tier = [r for r in ended if r[0] == tier]
            phase[f"{tier}_served_per_s"] = round(
                sum(1 for r in of_tier if r[4] == 200) / seconds, 1
            )
            phase[f"{tier}_refused_per_s"] = round(
                sum(1 for r in of_tier if r[4] == 429) / seconds, 1
            )
            phase[f"{tier}_other"] = sum(1 for r in of_tier if r[4] not in (200, 429))
        phases[name] = phase
    return phases


def summary(
    rows: list[dict[str, Any]], load: Load, start: float, server: list[tuple[float, float]]
) -> dict[str, Any]:
    """The run in a few numbers: per phase, the seconds above the target, how long after
    the surge began (and after it ended) the server's per-second p95 was back at the target
    for good, the lowest factor of each tier, the requests the generator sent late."""
    args = load.args
    target = args.target_ms
    surge_from, surge_to = args.before, args.before + args.surge
    above = [r["second"] for r in rows if (r["server_p95_ms"] or 0) > target]

    def back_from(first: int) -> int | None:
        """Seconds from ``first`` to the first second from which every later one is at or
        below the target (``None``: never)."""
        later = [s for s in above if s >= first]
        last = max(later, default=first - 1)
        return last + 1 - first if last + 1 < len(rows) else None

    surge_above = [s for s in above if surge_from <= s < surge_to]
    late = [r for r in load.requests if r[2] - r[1] > 0.1]
    return {
        "phases": phase_summary(rows, load, start, server),
        "seconds_above_target": len(above),
        "surge_seconds_above_target": len(surge_above),
        "worst_server_p95_ms": max((r["server_p95_ms"] or 0 for r in rows), default=None),
        "last_surge_second_above_target": max(surge_above, default=None),
        "at_target_for_good_after_surge_began_s": back_from(surge_from),
        "at_target_for_good_after_surge_ended_s": back_from(surge_to),
        "min_factor": {
            t: min((r[f"{t}_factor"] for r in rows if r[f"{t}_factor"] is not None), default=None)
            for t in TIERS
        },
        "requests": len(load.requests),
        "sent_late": len(late),
        "timeouts_or_errors": sum(1 for r in load.requests if r[4] not in (200, 429)),
    }


def start_controller(
    env: dict[str, str], step: float, logdir: Path, run: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """``python -m django throttle_adapt --signal SIGNAL --step <step>`` in its own process
    group."""
    path = logdir / f"controller-{run}.log"
    with path.open("wb") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "django", "throttle_adapt"),
                *("--signal", SIGNAL, "--step", f"{step:g}"),
            ],
            env={**env, "PYTHONUNBUFFERED": "1"},  # its "Adapting every" line at once
            cwd=loadkit.BENCH,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, path


def wait_for_controller(process: subprocess.Popen[bytes], path: Path, timeout: float = 60) -> None:
    """Until the controller says it runs (its Django set up), so its start takes no CPU
    from the measured run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if b"Adapting every" in path.read_bytes():
            return
        if process.poll() is not None:
            raise RuntimeError(f"throttle_adapt exited: {path.read_text(errors='replace')}")
        time.sleep(0.1)
    raise RuntimeError(f"throttle_adapt did not start in {timeout} s; see {path}")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C (the command's own way out), then SIGTERM, then SIGKILL to its group."""
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def controller_moves(path: Path, start: float) -> list[dict[str, Any]]:
    """The moves the controller logged: (second of the schedule, line)."""
    moves = []
    for line in path.read_text(errors="replace").splitlines():
        stamp, _, rest = line.partition(" ")
        if "django_throttle.adaptive" in rest:
            try:
                moves.append({"second": round(float(stamp) - start, 2), "line": rest})
            except ValueError:
                continue
    return moves


def one_run(
    name: str, setup: loadkit.Setup, prepared: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """A fresh server (and, in run "adaptive", the controller), the probe, then the load."""
    import redis

    ours = setup.redis.pid
    env = setup.env(
        LOADTEST_USAGE="1",
        LOADTEST_ADAPT_RUN=name,
        LOADTEST_ADAPT_BASE_MS=str(args.base_ms),
        LOADTEST_ADAPT_CAPACITY=str(args.capacity),
        LOADTEST_ADAPT_TARGET_MS=str(args.target_ms),
        LOADTEST_ADAPT_WINDOW=str(args.window),
    )
    # loadproject.adaptive's keys of this run
    keys = {"latency": f"lt-adapt:{name}:latency", "signal": f"lt-adapt:{name}:signal"}
    client = redis.Redis.from_url(setup.redis.url)
    controller = None
    with loadkit.fresh_server("uvicorn", env, args, ours) as (server, waited):
        try:
            probe(server.port, prepared["keys"][name], args)
            client.delete(keys["latency"], keys["signal"])
            if name == "adaptive":  # after the probe: its latencies are not the load's
                controller, controller_log = start_controller(env, args.step, setup.logdir, name)
                wait_for_controller(controller, controller_log)
            load = Load(
                server.port, name, prepared["keys"][name], prepared["tiers"], setup.redis.url, args
            )
            start, watched = loadkit.watch(server, ours, load.drive)
            logged = loadkit.log_record(server)
        finally:
            if controller is not None:
                stop_process(controller)
    served = [
        (float(t), float(ms))
        for t, ms, *_ in (row.decode().split(":") for row in client.zrange(keys["latency"], 0, -1))
    ]
    signals = []
    for row in client.lrange(keys["signal"], 0, -1):
        t, _, value = row.decode().partition(":")
        signals.append((float(t), float(value) if value else None))
    load.redis.close()
    client.close()
    rows = per_second(load, start, served, signals)
    s = summary(rows, load, start, served)
    result = loadkit.run_record(
        name,
        s,
        rows,
        watched,
        waited,
        logged,
        controller_moves=controller_moves(controller_log, start) if controller else [],
        server_cpu_s=round(watched.meter.server, 2),
    )
    p = s["phases"]
    log(
        f"{name:8}  server p95 ms before {p['before']['server_p95_ms']} surge "
        f"{p['surge']['server_p95_ms']} (2nd half {p['surge_second_half']['server_p95_ms']}) "
        f"after {p['after']['server_p95_ms']} | worst {s['worst_server_p95_ms']} | seconds above "
        f"target {s['seconds_above_target']} | free 429/s in surge "
        f"{p['surge']['free_refused_per_s']}, pro {p['surge']['pro_refused_per_s']} | min "
        f"factors {s['min_factor']} | late {s['sent_late']}, timeouts {s['timeouts_or_errors']}"
        f" | {watched.summary()}"
    )
    return result


def plot(payload: dict[str, Any], path: Path) -> None:
    """Per second, both runs: p95 latency of served requests with the target, the tiers'
    automatic factors, 429s by tier; the surge shaded."""
    plt = loadkit.pyplot()
    settings, runs = payload["settings"], payload["runs"]
    colours = {"static": "tab:orange", "adaptive": "tab:blue"}
    figure, (latency, factors, refused) = plt.subplots(
        3, 1, figsize=(10, 10), sharex=True, gridspec_kw={"height_ratios": [2, 1, 1]}
    )
    surge = (settings["before"], settings["before"] + settings["surge"])
    for run in runs:
        rows, name, colour = run["per_second"], run["run"], colours[run["run"]]
        xs = [row["second"] + 0.5 for row in rows]
        latency.plot(
            xs,
            [r["server_p95_ms"] for r in rows],
            "o-",
            ms=3,
            color=colour,
            label=f"{name}: p95, server",
        )
        latency.plot(
            xs, [r["p95_ms"] for r in rows], ":", color=colour, label=f"{name}: p95, clients"
        )
        for tier, style in (("free", "o-"), ("pro", "^--")):
            factors.plot(
                xs,
                [100 * (r[f"{tier}_factor"] or 0) for r in rows],
                style,
                ms=3,
                color=colour,
                label=f"{name}: {tier}",
            )
            refused.plot(
                xs,
                [r[f"{tier}_refused"] for r in rows],
                style,
                ms=3,
                color=colour,
                label=f"{name}: {tier}",
            )
    latency.axhline(settings["target_ms"], color="black", lw=1, ls="--", label="target")
    latency.set_yscale("log")
    latency.set_ylabel("p95 latency of served requests\nper second, ms")
    factors.set_ylabel("automatic factor, %")
    factors.set_ylim(0, 105)
    refused.set_ylabel("429s per second")
    refused.set_xlabel("second")
    for axis in (latency, factors, refused):
        axis.axvspan(*surge, color="grey", alpha=0.12)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8, loc="upper right", ncol=2)
    capacity = settings["capacity"] / settings["base_ms"] * 1e3
    title = (
        f"uvicorn, {settings['workers']} worker(s): service time {settings['base_ms']:g} ms x "
        f"(1 + in flight / {settings['capacity']:g}), at most {capacity:.0f}/s; target p95 "
        f"{settings['target_ms']:g} ms\nfree: {settings['free_clients']} clients x "
        f"{settings['free_rate']:g}/s, {settings['surge_rate']:g}/s in the surge (limit "
        f"{settings['free_limit']}); pro: {settings['pro_clients']} keys x "
        f"{settings['pro_rate']:g}/s (limit {settings['pro_limit']}); throttle_adapt --step "
        f"{settings['step']:g}, signal p95 of {settings['window']:g} s / target"
    )
    loadkit.save_figure(figure, path, title, payload["machine"], fontsize=9, rect=(0, 0, 1, 0.93))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="3 + 10 + 5 s per run, no wait for quiet"
    )
    parser.add_argument("--before", type=float, default=20, help="s normal before the surge")
    parser.add_argument("--surge", type=float, default=40, help="s of surge")
    parser.add_argument("--after", type=float, default=20, help="s normal after the surge")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers")
    parser.add_argument("--base-ms", type=float, default=20, help="service time alone")
    parser.add_argument("--capacity", type=float, default=1.5, help="in flight that doubles it")
    parser.add_argument("--target-ms", type=float, default=150, help="the p95 objective")
    parser.add_argument("--window", type=float, default=1, help="s of latencies in the signal")
    parser.add_argument("--step", type=float, default=1, help="throttle_adapt --step")
    parser.add_argument("--free-clients", type=int, default=30, help="free client addresses")
    parser.add_argument("--free-rate", type=float, default=1, help="per free client, per s")
    parser.add_argument("--surge-rate", type=float, default=2.5, help="the same in the surge")
    parser.add_argument("--free-limit", default="180/min", help="the free tier's limit")
    parser.add_argument("--free-burst", type=int, default=10, help="its burst")
    parser.add_argument("--pro-clients", type=int, default=5, help="pro API keys")
    parser.add_argument("--pro-rate", type=float, default=2, help="per key, per s")
    parser.add_argument("--pro-limit", default="300/min", help="the pro tier's limit")
    parser.add_argument("--pro-burst", type=int, default=10, help="its burst")
    parser.add_argument("--threads", type=int, default=600, help="requests open at once, at most")
    parser.add_argument("--sample-every", type=float, default=0.25, help="s between samples")
    parser.add_argument("--seed", type=int, default=1, help="of the arrivals")
    args = loadkit.parse(parser, argv, "load_adaptive", quick_seconds=0)
    if args.quick:
        args.before, args.surge, args.after = 3, 10, 5
    for unused in ("seconds", "warmup"):  # loadkit.parse's --quick sets them; phases rule here
        args.__dict__.pop(unused, None)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def runs(setup: loadkit.Setup) -> list[dict[str, Any]]:
        prepared = prepare_tiers(args)
        return [one_run(name, setup, prepared, args) for name in RUNS]

    pro = args.pro_clients * args.pro_rate
    return loadkit.run_all(
        args,
        "django-throttle-adaptive-",
        args.free_limit,
        runs,
        plot,
        capacity_per_s=round(args.capacity / args.base_ms * 1e3, 1),
        offered_per_s={
            "normal": round(args.free_clients * args.free_rate + pro, 1),
            "surge": round(args.free_clients * args.surge_rate + pro, 1),
        },
    )


if __name__ == "__main__":
    sys.exit(main())
