"""An operator's tools while Redis is down (nothing listens) or hung (SIGSTOP, behind the
package's short timeouts): every admin page of the app, the admin login, the management
commands, ``manage.py check`` and the policy file's import and export. None may be a 500 or
hang; each says plainly where it needed Redis and could not read it."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from django_throttle.models import ApiKey, Exemption, TierAssignment
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

DOWN = "redis://127.0.0.1:1/0"  # nothing listens
#: Seconds any one page or command may take with Redis hung (its short timeouts, not hangs).
PROMPT = 5.0


@pytest.fixture(params=["down", "hung"])
def outage(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "down":
        settings.DJANGO_THROTTLE_REDIS_URL = DOWN
        settings.DJANGO_THROTTLE_REDIS_OPTIONS = {}
        return request.param
    request.getfixturevalue("hung_redis")
    return request.param


def rows() -> dict[str, Any]:
    anon = tier("anonymous", "10/m", is_default_anonymous=True)
    rule = endpoint("search", "path", "/api/search/", limits={anon: "5/m"})
    user = User.objects.create_user("alice", password="pw")
    assignment = TierAssignment.objects.create(user=user, tier=anon)
    exemption = Exemption.objects.create(network="10.0.0.0/8")
    key, _ = ApiKey.objects.create_key(name="k", tier=anon)
    return {
        "tier": anon,
        "endpointrule": rule,
        "tierassignment": assignment,
        "exemption": exemption,
        "apikey": key,
    }


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_every_admin_page_answers(outage: str) -> None:
    made = rows()
    admin = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client(raise_request_exception=False)
    client.force_login(admin)
    base = "/admin/django_throttle/"
    urls = ["/admin/", base]
    for model in ("tier", "endpointrule", "tierassignment", "exemption", "apikey", "protection"):
        urls += [f"{base}{model}/", f"{base}{model}/add/"]
    for model, row in made.items():
        urls += [f"{base}{model}/{row.pk}/change/", f"{base}{model}/{row.pk}/history/"]
        urls.append(f"{base}{model}/{row.pk}/delete/")
    urls += [
        f"{base}usagecount/",
        f"{base}usagecount/?window=day",
        f"{base}usagecount/dashboard/",
        f"{base}usagecount/dashboard/?window=day",
        f"{base}usagecount/inspect/",
        f"{base}usagecount/inspect/?client=ip:1.2.3.4",
        f"{base}usagecount/inspect/?client=ip:1.2.3.4&path=/api/search/&method=GET",
        f"{base}usagecount/inspect/?client=user:{made['tierassignment'].user_id}",
        f"{base}usagecount/inspect/reset/?client=ip:1.2.3.4",
    ]
    problems = []
    for url in urls:
        response, elapsed = timed(lambda url=url: client.get(url))
        if response.status_code >= 500 or elapsed > PROMPT:
            problems.append((url, response.status_code, round(elapsed, 1)))
    response, elapsed = timed(
        lambda: client.post(f"{base}usagecount/inspect/reset/", {"client": "ip:1.2.3.4"})
    )
    if response.status_code >= 500 or elapsed > PROMPT:
        problems.append(("reset POST", response.status_code, round(elapsed, 1)))
    assert problems == []


def test_the_admin_login(outage: str) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client(raise_request_exception=False)
    response, elapsed = timed(lambda: client.get("/admin/login/"))
    assert response.status_code == 200, response.status_code
    response, elapsed = timed(
        lambda: client.post("/admin/login/?next=/admin/", {"username": "root", "password": "pw"})
    )
    assert elapsed < PROMPT
    assert response.status_code == 302, (response.status_code, response.content[:2000])
    assert client.get("/admin/").status_code == 200


COMMANDS = [
    ["throttle_inspect", "ip:1.2.3.4"],
    ["throttle_inspect", "alice"],
    ["throttle_explain", "--client", "ip:1.2.3.4", "--path", "/api/search/"],
    ["throttle_reset", "ip:1.2.3.4"],
    ["throttle_usage"],
    ["throttle_usage", "--by", "tier", "--format", "json"],
    ["throttle_usage", "--rollup"],
    ["throttle_adapt", "--clear"],
    ["throttle_adapt", "--once", "--signal", "tests.test_operator_outages.overloaded"],
    ["throttle_policy", "export"],
    ["throttle_policy", "import", "POLICY"],
    ["throttle_policy", "import", "EDITED"],
    ["throttle_policy", "from-drf", "--apply", "DRF"],
    ["check"],
    ["check", "--deploy"],
]


def overloaded() -> float:
    return 2.0


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.django_db(transaction=True)  # a change is published when it commits
def test_every_command_answers(
    outage: str,
    command: list[str],
    tmp_path: Path,
    settings: Any,
) -> None:
    rows()
    if "DRF" in command:
        settings.REST_FRAMEWORK = {"DEFAULT_THROTTLE_RATES": {"anon": "5/m"}}
        command = [part for part in command if part != "DRF"]
    if "POLICY" in command:
        policy_file = tmp_path / "policy.json"
        call_command("throttle_policy", "export", "--output", str(policy_file))
        command = [str(policy_file) if part == "POLICY" else part for part in command]
    if "EDITED" in command:
        policy_file = tmp_path / "policy.json"
        call_command("throttle_policy", "export", "--output", str(policy_file))
        policy_file.write_text(policy_file.read_text().replace("10/m", "20/m"))
        command = [str(policy_file) if part == "EDITED" else part for part in command]
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    try:
        call_command(*command, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = exc.code
    except CommandError as exc:
        # An error that names what could not be read, not a traceback.
        plain = exc.returncode == 3 or any(w in str(exc) for w in ("backend", "Redis"))
        code = 3 if plain else f"CommandError: {exc}"
    elapsed = time.monotonic() - started
    assert elapsed < PROMPT
    assert code in (0, 3), code


@pytest.mark.django_db(transaction=True)  # a change is published when it commits
def test_every_admin_write_answers(outage: str) -> None:
    from tests.test_admin_history import change_data

    made = rows()
    admin = User.objects.create_superuser("root", "root@example.com", "pw")
    client = Client(raise_request_exception=False)
    client.force_login(admin)
    base = "/admin/django_throttle/"
    key = made["apikey"]
    saved = "Redis is unreachable"  # the change is saved; the other processes learn late
    unreset = "The backend could not reset"
    posts = [
        (f"{base}{model}/{made[model].pk}/change/", change_data(model, made[model]), saved)
        for model in ("tier", "endpointrule", "apikey")
    ]
    chosen = {"_selected_action": [key.pk]}
    posts += [
        (f"{base}apikey/", {"action": "reset_buckets", **chosen}, ""),  # the confirmation
        (f"{base}apikey/", {"action": "reset_buckets", **chosen, "post": "yes"}, unreset),
        (f"{base}usagecount/inspect/reset/", {"client": f"key:{key.prefix}"}, unreset),
        (f"{base}apikey/", {"action": "revoke", **chosen}, saved),
        (f"{base}exemption/{made['exemption'].pk}/delete/", {"post": "yes"}, saved),
        (f"{base}tierassignment/{made['tierassignment'].pk}/delete/", {"post": "yes"}, saved),
    ]
    problems = []
    for url, data, says in posts:
        response, elapsed = timed(lambda url=url, data=data: client.post(url, data, follow=True))
        said = " ".join(str(m) for m in response.context["messages"]) if response.context else ""
        if response.status_code >= 500 or elapsed > PROMPT or says not in said:
            problems.append((url, response.status_code, round(elapsed, 1), said))
    assert problems == []
