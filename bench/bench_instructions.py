"""Instructions Redis executes per counting call, counted by valgrind: a measure load cannot move.

Run from the repository root (needs valgrind: ``apt-get install valgrind``)::

    .venv/bin/python bench/bench_instructions.py [--calls 1500] [--json]

``bench_script_mix.py`` times the counting call with ``INFO commandstats``: microseconds, which
move with whatever else the machine runs (on a shared 2-core VM, +-20 % between runs). This
benchmark counts instead: for each algorithm, a private ``redis-server`` runs under valgrind's
callgrind, the script is loaded and warmed up (200 calls), the counters are zeroed, and
``--calls`` decisions for clients never seen before (one limit of the algorithm, framed as the
backend frames them: ``RedisBackend._calls``) are sent pipelined. The figure is the
instructions executed inside ``evalShaCommand`` per call (inclusive: the script, the commands it
runs, its share of Lua's garbage collector), the same span ``INFO commandstats`` times; and the
same decisions as the package sends them, ``FCALL`` of its function library
(``scripts.library``: the definitions run once, when it loads), inside ``fcallCommand``. The
same for the benchmark's own minimal token bucket (``bench_paths.MINIMAL_BUCKET``, sharing no
code with the package) and, for the token bucket, the decision written flat
(``bench/flat_token_bucket.lua``). Instructions are not time (a cache miss costs more than an
add), but a change that removes work shows here in one run, whatever the load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench_script_mix import ALGORITHMS  # noqa: E402

TOOLS = ("valgrind", "callgrind_control", "callgrind_annotate")
WARM_UP = 200
#: The function whose inclusive count is a call's: what ``INFO commandstats`` times for EVALSHA.
MEASURED = "evalShaCommand"
#: The same for FCALL.
MEASURED_FCALL = "fcallCommand"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def instructions_per_call(
    source: str,
    args_for: Callable[[int], Sequence[Any]],
    calls: int,
    workdir: str,
    function: tuple[str, str] | None = None,
) -> float:
    """Instructions inside ``evalShaCommand`` per call of ``source`` with ``args_for(i)``
    (numkeys, keys and arguments), on a fresh ``redis-server`` under callgrind; with
    ``function`` (its name and library), inside ``fcallCommand`` per ``FCALL`` of it."""
    import redis

    port = free_port()
    out = os.path.join(workdir, f"callgrind.{port}")
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("redis-server under valgrind did not start") from None
                time.sleep(0.2)
        if function is None:
            sha = client.script_load(source)
        else:
            sha = function[0]
            client.function_load(function[1], replace=True)
        command = "EVALSHA" if function is None else "FCALL"
        send(client, command, sha, args_for, range(-WARM_UP, 0))
        zero = ["callgrind_control", "--zero", str(server.pid)]
        subprocess.run(zero, check=True, capture_output=True)
        send(client, command, sha, args_for, range(calls))
        client.shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # the shutdown's own answer: the server is gone
    finally:
        client.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    measured = MEASURED if function is None else MEASURED_FCALL
    for line in annotated.splitlines():
        if measured in line:
            return int(line.split()[0].replace(",", "")) / calls
    raise SystemExit(f"{measured} not in callgrind's output (a redis-server without symbols?)")


def send(
    client: Any, command: str, name: str, args_for: Callable[[int], Sequence[Any]], numbers: range
) -> None:
    pipe = client.pipeline(transaction=False)
    for n in numbers:
        pipe.execute_command(command, name, *args_for(n))
    for reply in pipe.execute(raise_on_error=False):
        if isinstance(reply, Exception):
            raise SystemExit(f"the script refused a call: {reply}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench_paths import MINIMAL_BUCKET
    from bench_throttle import configure_django

    # The backend only frames the calls here (scripts, keys, specs): it never connects.
    configure_django("redis://127.0.0.1:1/0", "dt")
    from django_throttle.backends import get_backend
    from django_throttle.backends.scripts import function_name, library
    from django_throttle.rates import Limit

    backend = get_backend()
    workdir = tempfile.mkdtemp(prefix="bench-instructions-")
    try:
        minimal = instructions_per_call(
            MINIMAL_BUCKET, lambda n: (1, f"dt-mb:{n}", 1000, 3.6e6, 1), args.calls, workdir
        )
        results: dict[str, Any] = {}
        flat_source = (ROOT / "bench" / "flat_token_bucket.lua").read_text("utf-8")
        for algorithm in args.algorithms:
            rate = "10000/month" if algorithm == "calendar_quota" else "1000/hour"
            limits = (Limit.build("t12", rate, algorithm=algorithm),)
            encoded = backend._calls.encoded(limits)
            sha, source = backend._calls.script(limits)

            def framed(n: int, encoded: Any = encoded) -> tuple[Any, ...]:
                tag = backend._client_tag(f"ip:10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")[1]
                keys = backend._calls.keys(encoded, tag)
                return (len(keys), *keys, b"1", b"0", *encoded.specs)

            row = {"package": instructions_per_call(source, framed, args.calls, workdir)}
            row["package / minimal"] = row["package"] / minimal
            function = (function_name(sha), library(sha, source))
            row["function"] = instructions_per_call(source, framed, args.calls, workdir, function)
            row["function / minimal"] = row["function"] / minimal
            if algorithm == "token_bucket":
                row["flat"] = instructions_per_call(flat_source, framed, args.calls, workdir)
                row["flat / minimal"] = row["flat"] / minimal
            results[algorithm] = row
            print(f"{algorithm}: {row['package']:,.0f} per call", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    version = (
        subprocess.run(["redis-server", "--version"], check=True, capture_output=True, text=True)
        .stdout.split()[2]
        .removeprefix("v=")
    )
    return {
        "redis": version,
        "calls": args.calls,
        "minimal": minimal,
        "instructions_per_call": results,
    }


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=(
            f"Instructions per counting call (valgrind, inside {MEASURED_FCALL} or {MEASURED}; "
            f"{result['calls']:,} calls, Redis {result['redis']})"
        )
    )
    columns = (
        "algorithm",
        "package (FCALL)",
        "÷ minimal",
        "script (EVALSHA)",
        "÷ minimal",
        "flat",
        "flat ÷ minimal",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "algorithm" else "right")
    for algorithm, row in result["instructions_per_call"].items():
        table.add_row(
            algorithm,
            f"{row['function']:,.0f}",
            f"{row['function / minimal']:.2f}",
            f"{row['package']:,.0f}",
            f"{row['package / minimal']:.2f}",
            f"{row['flat']:,.0f}" if "flat" in row else "",
            f"{row['flat / minimal']:.2f}" if "flat" in row else "",
        )
    table.add_row("minimal bucket", f"{result['minimal']:,.0f}", "1.00", "", "", "", "")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1500, help="counted calls per script")
    parser.add_argument(
        "--algorithms",
        nargs="+",
        choices=ALGORITHMS,
        default=list(ALGORITHMS),
        metavar="ALGORITHM",
        help=f"some of: {', '.join(ALGORITHMS)}",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        parser.error(f"needs valgrind ({', '.join(missing)} not found): apt-get install valgrind")
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
