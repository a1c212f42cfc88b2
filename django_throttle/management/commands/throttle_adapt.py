"""``manage.py throttle_adapt --signal PATH [--once] [--step SECONDS] [--clear]``: the
adaptive load controller. Every step it calls the load signal ``--signal`` names (the dotted
path of ``callable() -> float | None``, the load as a ratio to its target) and shrinks the
lowest-priority tier's limits while the service is overloaded, giving them back highest
priority first when the load falls (see :mod:`django_throttle.policy.adaptive`). Run it as a
sidecar (the loop) or from cron (``--once``); several at once are safe, one moves the factors
per step. The signal is this command's option, not a setting: no other process reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from django.core.management.base import CommandError, CommandParser
from django.utils.module_loading import import_string

from django_throttle.backends import BackendError
from django_throttle.backends.adaptive_store import AdaptiveStore
from django_throttle.management import output
from django_throttle.policy.adaptive import SETTLE, Controller


class Command(output.CountersCommand):
    help = (
        "Run the adaptive load controller: call the --signal callable every step and scale "
        "the tiers' limits (lowest priority first), or --clear the automatic factors."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--signal",
            metavar="PATH",
            help="dotted path of the load signal, a callable taking no argument that returns "
            "the load as a ratio to its target (1.0 at target, above 1 overloaded) or None for "
            "no data; e.g. myproject.load.p95_latency (needed except with --clear)",
        )
        parser.add_argument("--once", action="store_true", help="run one step and exit (cron)")
        parser.add_argument(
            "--step", type=float, default=10.0, help="seconds between steps (default 10)"
        )
        parser.add_argument(
            "--settle",
            type=float,
            default=SETTLE,
            help=f"seconds after a move in which no further move is made: set it to the load "
            f"signal's window plus a second or two (default {SETTLE:g})",
        )
        parser.add_argument(
            "--clear",
            action="store_true",
            help="forget the automatic factors and their history: every tier whole again",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.refuse_in_process_backend()
        if options["clear"]:
            with output.one_line_errors((BackendError, "The backend did not answer: {}")):
                store = AdaptiveStore(self.backend())
                store.clear()
                self.backend().bump_policy_version()
            self.stdout.write("Automatic factors cleared: every tier is whole again.")
            return
        step = options["step"]
        signal = import_signal(options["signal"])
        with output.one_line_errors((ValueError, "{}.")):
            controller = Controller(signal, step=step, settle=options["settle"])
        if options["once"]:
            with output.one_line_errors((BackendError, "The backend did not answer: {}")):
                result = controller.run_once()
            if not result.acquired:
                self.stdout.write("Another controller holds this step; nothing done.")
            elif result.moved is None:
                self.stdout.write(f"Load {result.signal}: factors held.")
            else:
                self.stdout.write(f"Load {result.signal}: tier {result.moved} moved.")
            return
        self.stdout.write(f"Adapting every {step:g} s (Ctrl-C stops).")
        try:
            controller.run()
        except KeyboardInterrupt:
            return

    def backend(self) -> Any:
        from django_throttle.backends import get_backend

        backend = get_backend()
        if AdaptiveStore.of(backend) is None:
            raise CommandError(
                f"The backend {type(backend).__name__} keeps no shared state: adaptive limits "
                "need the Redis backend."
            )
        return backend


def import_signal(path: Any) -> Callable[[], Any]:
    """The callable ``--signal`` names, or a one-line ``CommandError`` saying what to give:
    no path, a path that does not import (a typo, a module that raises on import), or a
    name that is not callable (a step would log and hold forever)."""
    if not isinstance(path, str) or not path.strip():
        raise CommandError(
            "Give the load signal: --signal <dotted path> of a callable taking no argument "
            "that returns the load as a ratio to its target (1.0 at target) or None for no data."
        )
    try:
        signal = import_string(path.strip())
    except Exception as exc:  # no such module or name; a module that raises on import
        reason = " ".join(str(exc).split())
        raise CommandError(
            f"--signal {path!r} cannot be imported ({type(exc).__name__}: {reason})."
        ) from exc
    if not callable(signal):
        raise CommandError(
            f"--signal {path!r} names a {type(signal).__name__}, not a callable: give the "
            "dotted path of a callable taking no argument."
        )
    return cast("Callable[[], Any]", signal)
