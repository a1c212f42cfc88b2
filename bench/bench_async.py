"""Does ``@throttle`` on an ``async def`` view borrow a thread per request under ASGI?

Run from the repository root::

    .venv/bin/python bench/bench_async.py [--requests 1000] [--repetitions 3] [--json]

Starts a private ``redis-server`` (or uses ``REDIS_URL``, under a random key prefix deleted
afterwards) and a uvicorn server in a child process (``bench_async_server.py``: asyncio loop,
httptools, by default the production Redis client options) serving a bench-local Django app with
two ``async def`` views, ``/plain/`` and ``/throttled/`` (``@throttle(rate="1000000/hour")``,
never denying), no middleware. For each view it opens ``--requests`` connections, then sends
one request on each at once (``X-Forwarded-For`` gives each its own client; the server trusts
one proxy) and reads every response. It reports, per burst, the median over repetitions of:

- total time from the first send to the last response, and per-request p50/p99;
- event-loop busy time: wall time minus the time the loop spent in ``select()`` (its selector
  is wrapped; this includes waiting for the GIL while other threads run), the loop thread's
  own CPU time, in total and per request, and the longest loop lag seen by a 1 ms ticker;
- CPU time off the loop thread (process CPU minus the loop thread's);
- thread-pool jobs per request (``ThreadPoolExecutor.submit`` is counted), threads started,
  and the peak thread count, both inside the server and from ``/proc/<pid>/status`` sampled
  every millisecond by the client.

Django's own ASGI handler already runs ``response.close()`` through ``sync_to_async`` in a
per-request executor, so ``/plain/`` shows the framework's share and ``/throttled/`` minus
``/plain/`` the decorator's. The client is plain asyncio streams (HTTP/1.1, one request per
connection), in this process. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

VIEWS = ("/plain/", "/throttled/")


async def fetch(port: int, path: str) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return dict(json.loads(data.split(b"\r\n\r\n", 1)[1]))


async def burst(port: int, path: str, n: int, first_client: int, pid: int) -> dict[str, Any]:
    """Open ``n`` connections, then send one request on each at once and read all replies."""
    connections = await asyncio.gather(
        *(asyncio.open_connection("127.0.0.1", port) for _ in range(n))
    )
    requests = [
        (
            f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n"
            f"X-Forwarded-For: 10.{c >> 16 & 255}.{c >> 8 & 255}.{c & 255}\r\n\r\n"
        ).encode()
        for c in range(first_client, first_client + n)
    ]
    sampler = ThreadSampler(pid)
    await fetch(port, "/_bench/reset")
    sampler.start()
    start = time.perf_counter()

    async def one(index: int) -> tuple[float, bytes]:
        reader, writer = connections[index]
        sent = time.perf_counter()
        writer.write(requests[index])
        data = await reader.read()
        writer.close()
        return time.perf_counter() - sent, data

    try:
        replies = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    finally:
        total = time.perf_counter() - start
        sampler.stop()
    server = await fetch(port, "/_bench/stats")
    ok = [r for r in replies if isinstance(r, tuple) and r[1][9:12] == b"200"]
    latencies = sorted(r[0] for r in ok)
    return {
        "total_s": total,
        "ok": len(ok),
        "failed": n - len(ok),
        "degraded": sum(b"x-ratelimit-degraded" in r[1].lower() for r in ok),
        "p50_ms": latencies[len(latencies) // 2] * 1e3 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else None,
        "proc_threads_before": sampler.before,
        "proc_threads_peak": sampler.peak,
        **server,
    }


class ThreadSampler:
    """Peak of ``Threads:`` in ``/proc/<pid>/status``, read every millisecond."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = self.read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
        return 0

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self.read())

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.read())


async def measure(port: int, pid: int, n: int, repetitions: int) -> dict[str, Any]:
    client = 0
    for path in VIEWS:  # warm-up: imports, the Redis pool, the script cache
        await burst(port, path, min(n, 100), client, pid)
        client += 100
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in VIEWS}
    for repetition in range(repetitions):
        for path in VIEWS if repetition % 2 == 0 else VIEWS[::-1]:
            runs[path].append(await burst(port, path, n, client, pid))
            client += n
    summary = {}
    for path, results in runs.items():
        row: dict[str, Any] = {}
        for name, value in results[0].items():
            values = [r[name] for r in results]
            if isinstance(value, int | float) and None not in values:
                row[name] = statistics.median(values)
        row["loop_busy_us_per_request"] = row["loop_busy_s"] / n * 1e6
        row["loop_cpu_us_per_request"] = row["loop_cpu_s"] / n * 1e6
        row["jobs_per_request"] = row["jobs"] / n
        row["runs"] = results
        summary[path] = row
    return summary


def start_server(
    redis_url: str, prefix: str, redis_options: str
) -> tuple[subprocess.Popen[bytes], int]:
    from example_project.private_redis import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "bench_async_server.py"), str(port), redis_url,
         prefix, redis_options],
        env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the uvicorn server exited with code {process.returncode}")
            try:
                asyncio.run(fetch(port, "/_bench/stats"))
                return process, port
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the uvicorn server did not answer within 30 s")
    except BaseException:
        process.kill()
        process.wait()
        raise


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    n = result["requests"]
    table = Table(
        title=f"{n:,} concurrent requests per burst, median of {result['repetitions']} "
        f"(uvicorn, asyncio loop, one worker; Redis {result['redis_version']}; load average "
        f"{result['load_average'][0]:.1f} on {result['cpus']} CPUs)"
    )
    columns = (
        ("total ms", "total_s", 1e3, 0), ("ok", "ok", 1, 0), ("degraded", "degraded", 1, 0),
        ("p50 ms", "p50_ms", 1, 0), ("p99 ms", "p99_ms", 1, 0),
        ("loop busy ms", "loop_busy_s", 1e3, 0),
        ("loop CPU ms", "loop_cpu_s", 1e3, 0),
        ("loop CPU µs/req", "loop_cpu_us_per_request", 1, 0),
        ("max loop lag ms", "max_loop_lag_s", 1e3, 1),
        ("off-loop CPU ms", "off_loop_cpu_s", 1e3, 0),
        ("pool jobs/req", "jobs_per_request", 1, 2),
        ("threads started", "threads_started", 1, 0),
        ("peak threads", "peak_threads", 1, 0),
        ("peak /proc Threads", "proc_threads_peak", 1, 0),
    )  # fmt: skip
    table.add_column("view")
    for title, *_ in columns:
        table.add_column(title, justify="right")
    for path, row in result["views"].items():
        cells = []
        for _, name, scale, digits in columns:
            value = row.get(name)
            cells.append("-" if value is None else f"{value * scale:,.{digits}f}")
        table.add_row(path, *cells)
    Console(width=max(160, Console().width)).print(table)
    extra = result["views"]["/throttled/"]["jobs_per_request"]
    extra -= result["views"]["/plain/"]["jobs_per_request"]
    print(
        f"The decorator adds {extra:.2f} thread-pool jobs per request "
        f"({'borrows a thread' if extra >= 0.5 else 'decides on the event loop'})."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="concurrent requests")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument(
        "--redis-options",
        default="{}",
        help="DJANGO_THROTTLE_REDIS_OPTIONS as JSON (default {}: the production client, "
        '50 ms timeouts and a pool of 64), e.g. \'{"socket_timeout": 1, "max_connections": 1000}\'',
    )
    args = parser.parse_args(argv)
    import redis
    from bench_async_server import raise_file_limit
    from bench_throttle import _delete_keys

    from example_project.private_redis import PrivateRedis

    raise_file_limit()
    redis_url = os.environ.get("REDIS_URL")
    private = None if redis_url else PrivateRedis().start()
    redis_url = redis_url or private.url  # type: ignore[union-attr]
    prefix = "dt" if private is not None else f"dtasync{uuid.uuid4().hex[:10]}"
    server = None
    try:
        version = redis.Redis.from_url(redis_url).info("server")["redis_version"]
        server, port = start_server(redis_url, prefix, args.redis_options)
        views = asyncio.run(measure(port, server.pid, args.requests, args.repetitions))
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        if private is not None:
            private.stop()
        else:
            _delete_keys(redis_url, prefix)
    result = {
        "requests": args.requests,
        "redis_options": json.loads(args.redis_options),
        "repetitions": args.repetitions,
        "redis_version": version,
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "views": views,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
