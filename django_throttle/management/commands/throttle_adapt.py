"""``manage.py throttle_adapt [--once] [--step SECONDS] [--clear]``: the adaptive load
controller. Every step it reads ``DJANGO_THROTTLE_LOAD_SIGNAL`` and shrinks the lowest-priority
tier's limits while the service is overloaded, giving them back highest priority first when
the load falls (see :mod:`django_throttle.policy.adaptive`). Run it as a sidecar (the loop) or
from cron (``--once``); several at once are safe, one moves the factors per step.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_throttle.backends import BackendError
from django_throttle.backends.adaptive_store import AdaptiveStore
from django_throttle.management import output
from django_throttle.policy.adaptive import SETTLE, Controller


class Command(output.CountersCommand):
    help = (
        "Run the adaptive load controller: read DJANGO_THROTTLE_LOAD_SIGNAL every step and "
        "scale the tiers' limits (lowest priority first), or --clear the automatic factors."
    )

    def add_arguments(self, parser: CommandParser) -> None:
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
        with output.one_line_errors((ValueError, "{}.")):
            controller = Controller(step=step, settle=options["settle"])
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
