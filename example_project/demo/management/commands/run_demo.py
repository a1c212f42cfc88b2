"""The one command a newcomer runs: Redis, database, demo data, banner, development server.

It records its Redis URL next to the database (:mod:`example_project.demo_state`), so
``manage.py`` commands in another terminal count in the same Redis, and removes the record on
exit. A Redis password is shown masked, in the banner as in errors.
"""

from __future__ import annotations

import os
import signal
import socket
import textwrap
from pathlib import Path
from types import FrameType
from typing import Any

import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.signals import setting_changed

from django_throttle.backends.redis_clients import client_for
from django_throttle.redaction import redact_url
from example_project import demo_state
from example_project.demo.tryit import try_lines, typed_python
from example_project.private_redis import PrivateRedis

HOST = "127.0.0.1"


class Command(BaseCommand):
    help = (
        "Run the demo: start a private redis-server unless REDIS_URL is set, migrate, seed the "
        "demo data, print what to try, and serve on 127.0.0.1:8000 until Ctrl-C."
    )
    requires_system_checks: list[str] = []  # runserver runs them once the settings are final

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("PORT", "8000")),
            help="port of the development server (default: $PORT or 8000)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        port: int = options["port"]
        verbosity: int = options["verbosity"]
        # runserver exits the process without cleanup when it cannot bind; find out first.
        check_port_free(port)
        state_file = Path(settings.RUN_DEMO_STATE_FILE)
        running = demo_state.read(state_file)
        if running is not None:
            raise CommandError(
                f"Another run_demo (process {running['pid']}) uses this database: stop it "
                "first, or give this one its own database with DATABASE_URL (its record: "
                f"{state_file})."
            )
        # SIGTERM (kill, a test harness, docker stop) must stop our redis-server as Ctrl-C does.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        private: PrivateRedis | None = None
        try:
            url = os.environ.get("REDIS_URL")
            if url:
                _check_redis(url)
                where = f"{redact_url(url)} (from REDIS_URL)"
            else:
                try:
                    private = PrivateRedis().start()
                except RuntimeError as exc:
                    raise CommandError(str(exc)) from exc
                url = private.url
                where = f"{url} (private redis-server, stopped on exit)"
            _use_redis(url)
            demo_state.record(
                state_file, url, getattr(settings, "DJANGO_THROTTLE_KEY_PREFIX", "dt")
            )

            call_command("migrate", interactive=False, verbosity=max(0, verbosity - 1))
            call_command("seed_demo", verbosity=verbosity)
            self.stdout.write(banner(port, where, _demo_api_key()))
            # With DEBUG off (the default) runserver serves the admin's CSS and scripts only
            # when told to; the demo's server is a development server on 127.0.0.1 anyway.
            call_command("runserver", f"{HOST}:{port}", use_reloader=False, insecure_serving=True)
        except KeyboardInterrupt:
            pass
        finally:
            demo_state.forget(state_file)
            if private is not None:
                private.stop()
                self.stdout.write("Stopped the private redis-server.")
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def check_port_free(port: int) -> None:
    """Refuse a port something listens on. Connections a stopped server closed (TIME_WAIT
    for a minute) do not count: runserver binds over them, so the demo restarts at once."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as runserver's socket
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise CommandError(
                f"{HOST}:{port} is not free ({exc.strerror}): pass another port, e.g. "
                f"'manage.py run_demo --port {port + 1}'"
            ) from exc


def _check_redis(url: str) -> None:
    """PING the Redis at ``url`` (any topology the throttle's URL setting takes)."""
    client: Any = None
    try:
        client = client_for(url, {"socket_connect_timeout": 2, "socket_timeout": 2})
        client.ping()
    except ValueError as exc:
        raise CommandError(f"REDIS_URL={redact_url(url)} {exc}") from exc
    except redis.RedisError as exc:
        raise CommandError(
            f"Redis at REDIS_URL={redact_url(url)} does not answer ({exc}): start it, fix "
            "REDIS_URL, or "
            "unset REDIS_URL to let run_demo start a private redis-server."
        ) from exc
    finally:
        if client is not None:
            client.close()


def _use_redis(url: str) -> None:
    """Count in the Redis at ``url``, although the settings were read before it was known.

    ``setting_changed`` makes django-throttle drop any backend it already built.
    """
    os.environ["REDIS_URL"] = url
    name = "DJANGO_THROTTLE_REDIS_URL"
    setattr(settings, name, url)
    setting_changed.send(sender=type(settings), setting=name, value=url, enter=True)


def _demo_api_key() -> str:
    """A fresh key of the partner tier: a key is shown only when it is made, so each run of
    the demo replaces the previous one."""
    from django_throttle.models import ApiKey, Tier

    ApiKey.objects.filter(name=DEMO_KEY_NAME).delete()
    _, key = ApiKey.objects.create_key(name=DEMO_KEY_NAME, tier=Tier.objects.get(slug="partner"))
    return key


#: The API key run_demo issues (and replaces on the next run).
DEMO_KEY_NAME = "demo partner"


def banner(port: int, redis_where: str, api_key: str) -> str:
    """What run_demo prints before serving: where the admin, Redis and users are, the API key
    it just made, and the curl lines to try (the home page's too, from ``tryit``)."""
    base = f"http://{HOST}:{port}"
    lines = textwrap.indent(try_lines(base, api_key, typed_python()), "  ")
    return (
        textwrap.dedent(
            f"""
            ─────────────────────────── django-throttle demo ───────────────────────────
            Admin      {base}/admin/   log in as admin / admin
                       edit tiers and endpoint rules; the server picks changes up within 1 s
            Redis      {redis_where}
                       manage.py commands in another terminal count here too, e.g.
                       manage.py throttle_inspect alice, manage.py throttle_reset alice
            Users      alice / alice (tier free), bob / bob (tier pro)
            API key    {api_key} (tier partner; a new one each run)
            Home page  {base}/ lists what to try, as below

            Try, in another terminal:

            """
        )
        + lines
        + "─────────────────────────────────────────────────────────────────────────────\n"
    )
