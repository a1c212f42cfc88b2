"""The server half of ``bench_async.py``: uvicorn in this process, serving Django with two
``async def`` views and a ``/_bench/`` endpoint that reports what the event loop and the
threads did since the last reset.

Run by ``bench_async.py`` as ``python bench/bench_async_server.py PORT REDIS_URL PREFIX
OPTIONS_JSON``; this module is also the server's ``ROOT_URLCONF``.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

#: Never reached: every decision is "allowed" and does the same work.
RATE = "1000000/hour"


def raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class ServerMeter:
    """Event-loop idle time, thread-pool jobs and threads, since the last reset."""

    def __init__(self) -> None:
        self.idle = 0.0
        self.jobs = 0
        self.threads_started = 0
        self.peak_threads = 0
        self.max_lag = 0.0
        self.reset()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        import concurrent.futures

        selector = loop._selector  # type: ignore[attr-defined]
        select = selector.select
        meter = self

        def timed_select(timeout: float | None = None) -> Any:
            start = time.perf_counter()
            try:
                return select(timeout)
            finally:
                meter.idle += time.perf_counter() - start

        selector.select = timed_select
        submit = concurrent.futures.ThreadPoolExecutor.submit

        def counted_submit(executor: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            meter.jobs += 1

            def job() -> Any:
                meter.peak_threads = max(meter.peak_threads, threading.active_count())
                return fn(*args, **kwargs)

            return submit(executor, job)

        concurrent.futures.ThreadPoolExecutor.submit = counted_submit  # type: ignore[method-assign]
        start_thread = threading.Thread.start

        def counted_start(thread: threading.Thread) -> None:
            meter.threads_started += 1
            meter.thread_kinds[re.sub(r"[-_]?\d+", "", thread.name)] += 1
            start_thread(thread)

        threading.Thread.start = counted_start  # type: ignore[assignment,method-assign]

    def reset(self) -> None:
        self.started = time.perf_counter()
        self.idle_at_start = self.idle
        self.cpu_at_start = time.process_time()
        self.loop_cpu_at_start = time.thread_time()  # called on the loop thread
        self.jobs = self.threads_started = 0
        self.thread_kinds: Counter[str] = Counter()
        self.peak_threads = threading.active_count()
        self.max_lag = 0.0

    def stats(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        loop_cpu = time.thread_time() - self.loop_cpu_at_start
        return {
            "wall_s": wall,
            "loop_busy_s": wall - (self.idle - self.idle_at_start),
            "loop_cpu_s": loop_cpu,
            "off_loop_cpu_s": time.process_time() - self.cpu_at_start - loop_cpu,
            "jobs": self.jobs,
            "threads_started": self.threads_started,
            "thread_kinds": dict(self.thread_kinds),
            "peak_threads": self.peak_threads,
            "threads_now": threading.active_count(),
            "max_loop_lag_s": self.max_lag,
        }

    async def watch_lag(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            self.max_lag = max(self.max_lag, time.perf_counter() - start - 0.001)


def serve(port: int, redis_url: str, prefix: str, redis_options: dict[str, Any]) -> None:
    from bench_throttle import configure_django

    raise_file_limit()
    configure_django(
        redis_url,
        prefix,
        redis_options=redis_options,
        extra_settings={
            "ROOT_URLCONF": "bench_async_server",
            "MIDDLEWARE": [],
            "ALLOWED_HOSTS": ["*"],
            "DJANGO_THROTTLE_TRUSTED_PROXIES": 1,
        },
    )
    import uvicorn
    from django.core.handlers.asgi import ASGIHandler

    meter = ServerMeter()
    django_app = ASGIHandler()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/_bench/"):
            await django_app(scope, receive, send)
            return
        if path == "/_bench/reset":
            meter.reset()
        body = json.dumps(meter.stats()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="asyncio",
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
        backlog=4096,
    )

    async def main() -> None:
        meter.install(asyncio.get_running_loop())
        ticker = asyncio.ensure_future(meter.watch_lag())
        await uvicorn.Server(config).serve()
        ticker.cancel()

    asyncio.run(main())


def _views() -> list[Any]:
    from django.http import JsonResponse
    from django.urls import path

    from django_throttle.decorators import throttle

    async def plain(request: Any) -> JsonResponse:
        return JsonResponse({"ok": True})

    @throttle(rate=RATE)
    async def throttled(request: Any) -> JsonResponse:
        return JsonResponse({"ok": True})

    return [path("plain/", plain), path("throttled/", throttled)]


def __getattr__(name: str) -> Any:
    """``urlpatterns`` on first use: this module is the server's ROOT_URLCONF."""
    if name == "urlpatterns":
        patterns = globals()["urlpatterns"] = _views()
        return patterns
    raise AttributeError(name)


if __name__ == "__main__":
    port, redis_url, prefix, options = sys.argv[1:5]
    serve(int(port), redis_url, prefix, json.loads(options))
