"""API keys: shown once, stored as a digest, verified from the policy snapshot with no query,
counted in their tier's bucket; anything else a client sends as a key is counted as anonymous."""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from django_throttle import identity
from django_throttle.checks import check_settings
from django_throttle.drf import ApiKeyAuthentication
from django_throttle.middleware import RateLimitHeadersMiddleware
from django_throttle.models import ApiKey, Tier
from django_throttle.models.api_keys import digest_hex
from django_throttle.policy import live as policy
from django_throttle.request import core
from tests.factories import tier

pytestmark = pytest.mark.django_db

ANONYMOUS_LIMIT = 3
KEY_LIMIT = 50
KEY_PATTERN = re.compile(r"dt_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


@pytest.fixture
def partner() -> Tier:
    """Hourly limits: the counts the tests read cannot refill while they run (3/h gets a
    token back every 20 minutes, 50/h every 72 s), however slow the machine."""
    tier("anonymous", f"{ANONYMOUS_LIMIT}/h", is_default_anonymous=True)
    tier("free", "100/h", is_default_authenticated=True)
    return tier("partner", f"{KEY_LIMIT}/h")


@pytest.fixture
def api_key(partner: Tier) -> tuple[ApiKey, str]:
    return ApiKey.objects.create_key(name="ci", tier=partner)


@pytest.fixture
def warm(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[[], policy.Policy]:
    """Compile the policy once, then never check the version during the test."""
    monkeypatch.setattr(policy, "REFRESH_INTERVAL", 3600)

    def compile_once() -> policy.Policy:
        compiled = policy.current()
        assert compiled.loaded
        return compiled

    return compile_once


def auth(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Api-Key {key}"}


def seen(response: Any) -> tuple[int, str, str, bytes]:
    """What a client sees of a response, minus anything that varies with the clock."""
    return (
        response.status_code,
        response.get("X-RateLimit-Limit", ""),
        response.get("X-RateLimit-Remaining", ""),
        response.content if response.status_code == 200 else b"",
    )


# Creating and storing -----------------------------------------------------------------------


def test_the_full_key_is_returned_once_and_only_its_digest_stored(
    api_key: tuple[ApiKey, str],
) -> None:
    row, full_key = api_key
    assert KEY_PATTERN.fullmatch(full_key)
    assert full_key.startswith(f"dt_{row.prefix}_")
    stored = ApiKey.objects.filter(pk=row.pk).values().get()
    assert (
        stored["hashed"]
        == hmac.new(b"tests-only-not-secret", full_key.encode(), "sha256").hexdigest()
    )
    assert not [value for value in stored.values() if full_key in str(value)]
    # The secret is url-safe base64 and may itself hold "_": take all of it after the prefix.
    secret_part = full_key.removeprefix(f"dt_{row.prefix}_")
    assert len(secret_part) >= 40
    assert not [value for value in stored.values() if secret_part[:16] in str(value)]


def test_keys_are_distinct_and_high_entropy(partner: Tier) -> None:
    keys = [ApiKey.objects.create_key(name=f"k{i}", tier=partner)[1] for i in range(20)]
    assert len(set(keys)) == 20
    assert len({key.split("_")[1] for key in keys}) == 20


def test_the_digest_is_keyed_by_the_api_key_secret_setting(
    api_key: tuple[ApiKey, str], settings: Any
) -> None:
    row, full_key = api_key
    settings.DJANGO_THROTTLE_API_KEY_SECRET = "x" * 40
    assert digest_hex(full_key) != row.hashed
    assert policy.verified_api_key(RequestFactory().get("/", **auth(full_key))) is None


# Counting -------------------------------------------------------------------------------------


def test_a_valid_key_gets_its_tier_through_a_drf_view(
    api_key: tuple[ApiKey, str], client: Client
) -> None:
    response = client.get("/api/ping/", **auth(api_key[1]))
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == str(KEY_LIMIT)
    assert response["X-RateLimit-Remaining"] == str(KEY_LIMIT - 1)


def test_a_valid_key_gets_its_tier_through_a_throttle_decorated_view(
    api_key: tuple[ApiKey, str], client: Client
) -> None:
    response = client.get("/login/", HTTP_X_API_KEY=api_key[1])
    assert response.status_code == 200
    assert response["X-RateLimit-Limit"] == str(KEY_LIMIT)


def test_the_key_has_its_own_bucket_apart_from_its_ip(
    api_key: tuple[ApiKey, str], client: Client
) -> None:
    assert [client.get("/api/ping/").status_code for _ in range(4)] == [200] * 3 + [429]
    assert client.get("/api/ping/", **auth(api_key[1])).status_code == 200
    assert client.get("/api/ping/", HTTP_X_API_KEY=api_key[1])["X-RateLimit-Remaining"] == str(
        KEY_LIMIT - 2
    )


def test_an_async_view_counts_a_key_in_its_own_bucket(
    api_key: tuple[ApiKey, str], client: Client, warm: Callable[[], object]
) -> None:
    """On the event loop the key is checked against the snapshot the process holds (no
    query there); ``hello-async`` has an inline 2/min limit."""
    warm()
    assert [client.get("/hello-async/").status_code for _ in range(3)] == [200, 200, 429]
    keyed = [client.get("/hello-async/", **auth(api_key[1])).status_code for _ in range(3)]
    assert keyed == [200, 200, 429]


def test_a_revoked_key_stops_at_once_on_an_async_view_with_an_inline_rate(
    api_key: tuple[ApiKey, str], client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    """The async ``@throttle(rate=...)`` path refreshes the snapshot as the admin-policy path
    does: it used to check keys against the last snapshot held, never refreshed there, so a
    revoked key kept a bucket of its own (apart from its IP's) in a process serving only such
    views, for as long as the process lived."""
    row, full_key = api_key
    assert client.get("/api/ping/", **auth(full_key))["X-RateLimit-Limit"] == str(KEY_LIMIT)
    with django_capture_on_commit_callbacks(execute=True):
        row.active = False
        row.save()
    anonymous = [client.get("/hello-async/").status_code for _ in range(2)]
    assert anonymous == [200, 200]  # hello-async: 2/min, the IP's bucket is now spent
    assert client.get("/hello-async/", **auth(full_key)).status_code == 429  # that bucket
    assert client.get("/hello-async/", HTTP_X_API_KEY=full_key).status_code == 429


def test_another_authorization_scheme_is_not_a_key(
    api_key: tuple[ApiKey, str], client: Client
) -> None:
    response = client.get("/api/ping/", HTTP_AUTHORIZATION=f"Bearer {api_key[1]}")
    assert response["X-RateLimit-Limit"] == str(ANONYMOUS_LIMIT)


def test_keys_are_read_from_authorization_and_x_api_key_only(
    api_key: tuple[ApiKey, str], client: Client, settings: Any
) -> None:
    """``conf.API_KEY_HEADERS``; the removed ``API_KEY_HEADERS`` setting changes nothing
    (system check E041 names it)."""
    settings.DJANGO_THROTTLE_API_KEY_HEADERS = ["X-Token"]
    assert client.get("/api/ping/", **auth(api_key[1]))["X-RateLimit-Limit"] == "50"
    assert client.get("/api/ping/", HTTP_X_API_KEY=api_key[1])["X-RateLimit-Limit"] == "50"
    assert client.get("/api/ping/", HTTP_X_TOKEN=api_key[1])["X-RateLimit-Limit"] == "3"


def bad_keys(row: ApiKey, full_key: str) -> dict[str, str]:
    return {
        "unknown prefix": f"dt_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}",
        "wrong secret": f"dt_{row.prefix}_{secrets.token_urlsafe(32)}",
        "truncated": full_key[:-1],
        "garbage": "not a key at all",
        "huge": "dt_" + "a" * 10_000,
    }


def test_invalid_revoked_and_expired_keys_get_exactly_what_no_key_gets(
    api_key: tuple[ApiKey, str], partner: Tier, client: Client
) -> None:
    row, full_key = api_key
    revoked, revoked_key = ApiKey.objects.create_key(name="old", tier=partner)
    revoked.active = False
    revoked.save()
    _, expired_key = ApiKey.objects.create_key(
        name="late", tier=partner, expires=timezone.now() - timedelta(seconds=1)
    )
    presented = {
        "none": None,
        **bad_keys(row, full_key),
        "revoked": revoked_key,
        "expired": expired_key,
    }
    outcomes = {}
    for i, (kind, key) in enumerate(presented.items()):
        extra = {"REMOTE_ADDR": f"198.51.100.{i + 1}"}
        if key is not None:
            extra.update(auth(key))
        outcomes[kind] = [seen(client.get("/api/ping/", **extra)) for _ in range(4)]
    expected = outcomes.pop("none")
    assert [status for status, *_ in expected] == [200, 200, 200, 429]
    assert outcomes == dict.fromkeys(outcomes, expected)


@pytest.mark.slow
def test_10000_random_keys_from_one_ip_get_no_more_than_the_anonymous_limit(
    api_key: tuple[ApiKey, str], warm: Callable[[], object]
) -> None:
    warm()
    row = api_key[0]
    factory = RequestFactory()
    allowed = 0
    for i in range(10_000):
        if i % 2:
            key = f"dt_{row.prefix}_{secrets.token_urlsafe(32)}"  # the real prefix, guessed secret
        else:
            key = f"dt_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
        allowed += core.check(factory.get("/api/ping/", **auth(key))).allowed
    assert allowed == ANONYMOUS_LIMIT


def test_unknown_prefix_and_wrong_secret_cost_the_same_work(
    api_key: tuple[ApiKey, str], warm: Callable[[], policy.Policy], monkeypatch: Any
) -> None:
    compiled = warm()
    row, full_key = api_key
    calls: list[str] = []
    real_digest, real_compare = policy.key_digest, hmac.compare_digest
    monkeypatch.setattr(policy, "key_digest", lambda *a: calls.append("hmac") or real_digest(*a))
    monkeypatch.setattr(
        policy.hmac, "compare_digest", lambda *a: calls.append("compare") or real_compare(*a)
    )
    for key in bad_keys(row, full_key).values():
        if len(key) <= policy.KEY_MAX_LENGTH:
            calls.clear()
            assert compiled.verify_key(key, b"tests-only-not-secret", 0.0) is None
            assert calls == ["hmac", "compare"]


# No SQL, revocation, expiry -------------------------------------------------------------------


class KeyPing(APIView):
    """Authenticates by key but never reads ``request.user``: the owner is never loaded."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response({"key": request.auth.prefix if request.auth else None})


def test_requests_with_keys_cost_zero_queries(
    partner: Tier,
    django_user_model: Any,
    warm: Callable[[], object],
    django_assert_num_queries: Any,
) -> None:
    owner = django_user_model.objects.create_user("bob")
    row, full_key = ApiKey.objects.create_key(name="bob's", tier=partner, owner=owner)
    warm()
    factory = APIRequestFactory()
    view = RateLimitHeadersMiddleware(KeyPing.as_view())
    with django_assert_num_queries(0):
        for _ in range(20):
            response = view(factory.get("/api/ping/", **auth(full_key)))
            assert response.data == {"key": row.prefix}
            assert response["X-RateLimit-Limit"] == str(KEY_LIMIT)
            assert core.check(factory.get("/api/ping/", HTTP_X_API_KEY=full_key)).allowed
            wrong = f"dt_{row.prefix}_{secrets.token_urlsafe(32)}"
            assert core.check(factory.get("/api/ping/", **auth(wrong))).limit is not None


def test_revoking_takes_effect_at_the_next_reload(
    api_key: tuple[ApiKey, str],
    warm: Callable[[], policy.Policy],
    django_capture_on_commit_callbacks: Any,
) -> None:
    row, full_key = api_key
    assert row.prefix in warm().api_keys
    request = RequestFactory().get("/", **auth(full_key))
    assert policy.resolve_identity(request).kind == "key"
    version = policy.current().version
    with django_capture_on_commit_callbacks(execute=True):
        row.active = False
        row.save()
    assert policy.resolve_identity(request).kind == "ip"
    assert policy.current().version != version  # other processes reload too


def test_deleting_a_key_takes_effect_at_the_next_reload(
    api_key: tuple[ApiKey, str], warm: Callable[[], policy.Policy]
) -> None:
    row, full_key = api_key
    warm()
    row.delete()
    request = RequestFactory().get("/", **auth(full_key))
    assert policy.resolve_identity(request).kind == "ip"


def test_expiry_is_checked_per_request_without_a_reload(
    partner: Tier,
    warm: Callable[[], object],
    monkeypatch: Any,
    django_assert_num_queries: Any,
) -> None:
    expires = timezone.now() + timedelta(hours=1)
    row, full_key = ApiKey.objects.create_key(name="temp", tier=partner, expires=expires)
    warm()
    request = RequestFactory().get("/", **auth(full_key))
    with django_assert_num_queries(0):
        assert policy.resolve_identity(request) == identity.Identity("key", row.prefix)
        monkeypatch.setattr(policy, "key_clock", lambda: expires.timestamp())
        assert policy.resolve_identity(request).kind == "ip"


# DRF authentication ----------------------------------------------------------------------------


class KeyOnlyPing(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated]

    def get(self, request: Request) -> Response:
        return Response({"user": request.user.get_username(), "key": request.auth.prefix})


def test_a_key_authenticates_as_its_owner(partner: Tier, django_user_model: Any) -> None:
    owner = django_user_model.objects.create_user("alice")
    row, full_key = ApiKey.objects.create_key(name="alice's", tier=partner, owner=owner)
    response = KeyOnlyPing.as_view()(APIRequestFactory().get("/", **auth(full_key)))
    assert response.status_code == 200
    assert response.data == {"user": "alice", "key": row.prefix}


def test_a_key_without_owner_or_a_bad_key_authenticates_no_user(
    api_key: tuple[ApiKey, str],
) -> None:
    """A valid key with no owner is authenticated, but as no user: IsAuthenticated refuses
    it (403); a bad key authenticates nothing (401 naming the scheme)."""
    view = KeyOnlyPing.as_view()
    factory = APIRequestFactory()
    assert view(factory.get("/", **auth(api_key[1]))).status_code == 403
    wrong = f"dt_{api_key[0].prefix}_{secrets.token_urlsafe(32)}"
    response = view(factory.get("/", **auth(wrong)))
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Api-Key"


# Admin -----------------------------------------------------------------------------------------


def test_the_admin_shows_the_new_key_once(partner: Tier, admin_client: Client) -> None:
    data = {"name": "mobile app", "tier": partner.pk, "active": "on"}
    response = admin_client.post(reverse("admin:django_throttle_apikey_add"), data, follow=True)
    assert response.status_code == 200
    [full_key] = KEY_PATTERN.findall(response.content.decode())
    row = ApiKey.objects.get()
    assert row.hashed == digest_hex(full_key)
    assert policy.verified_api_key(RequestFactory().get("/", **auth(full_key))) is not None
    for url in (
        reverse("admin:django_throttle_apikey_change", args=[row.pk]),
        reverse("admin:django_throttle_apikey_changelist"),
    ):
        page = admin_client.get(url).content.decode()
        assert row.prefix in page
        assert full_key not in page
        assert row.hashed not in page


def test_admin_bad_values_are_field_errors(partner: Tier, admin_client: Client) -> None:
    past = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%d")
    data = {"name": "x", "tier": partner.pk, "expires_0": past, "expires_1": "00:00:00"}
    response = admin_client.post(reverse("admin:django_throttle_apikey_add"), data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"expires"}
    response = admin_client.post(reverse("admin:django_throttle_apikey_add"), {"name": "x"})
    assert set(response.context["adminform"].form.errors) == {"tier"}
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize("change", [False, True])
def test_an_expiry_past_the_last_storable_time_is_a_field_error(
    partner: Tier, admin_client: Client, settings: Any, change: bool
) -> None:
    """9999-12-31 23:59 in a time zone behind UTC is past the last datetime there is once
    converted to UTC, as the database keeps it: the save failed (a 500), on the add page
    and on a key's change page."""
    settings.TIME_ZONE = "America/New_York"
    key, _full = ApiKey.objects.create_key(name="ci", tier=partner)
    url = reverse("admin:django_throttle_apikey_add")
    if change:
        url = reverse("admin:django_throttle_apikey_change", args=[key.pk])
    data = {
        "name": "x",
        "tier": partner.pk,
        "active": "on",
        "expires_0": "9999-12-31",
        "expires_1": "23:59:59",
    }
    response = admin_client.post(url, data)

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["expires"]
    assert "too far ahead" in str(errors["expires"])
    key.refresh_from_db()
    assert (ApiKey.objects.count(), key.name, key.expires) == (1, "ci", None)


def test_the_admin_revoke_action_deactivates_and_logs(
    api_key: tuple[ApiKey, str], admin_client: Client
) -> None:
    from django.contrib.admin.models import LogEntry

    row = api_key[0]
    response = admin_client.post(
        reverse("admin:django_throttle_apikey_changelist"),
        {"action": "revoke", "_selected_action": [row.pk]},
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.active is False
    assert LogEntry.objects.filter(object_id=str(row.pk)).exists()


# System checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("API_KEY_SECRET", "short", "E034"),
        ("API_KEY_SECRET", b"x" * 40, "E034"),
    ],
)
def test_bad_api_key_settings_are_system_check_errors(
    settings: Any, name: str, value: Any, check_id: str
) -> None:
    setattr(settings, f"DJANGO_THROTTLE_{name}", value)
    assert [error.id for error in check_settings()] == [f"django_throttle.{check_id}"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("API_KEY_SECRET", "s" * 50),
    ],
)
def test_good_api_key_settings_pass(settings: Any, name: str, value: Any) -> None:
    setattr(settings, f"DJANGO_THROTTLE_{name}", value)
    assert check_settings() == []


def test_a_bad_api_key_secret_is_reported_without_showing_it(settings: Any) -> None:
    settings.DJANGO_THROTTLE_API_KEY_SECRET = "hunter2-but-too-short"
    [error] = check_settings()
    assert error.id == "django_throttle.E034"
    assert "hunter2" not in error.msg
    assert "21 characters" in error.msg


# Who a key logs in as --------------------------------------------------------------------------


class KeyWhoAmI(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [AllowAny]

    def get(self, request: Request) -> Response:
        return Response(
            {
                "user": request.user.get_username(),
                "staff": request.user.is_staff,
                "superuser": request.user.is_superuser,
                "key": request.auth.prefix if request.auth else None,
            }
        )


class KeyOnlyAuthentication(ApiKeyAuthentication):
    acts_as_owner = False


class KeyOnlyWhoAmI(KeyWhoAmI):
    authentication_classes = [KeyOnlyAuthentication]


def test_a_key_logs_in_as_its_owner_with_all_the_owners_permissions(
    partner: Tier, django_user_model: Any
) -> None:
    """The documented default: a superuser's key is a superuser login."""
    owner = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    row, full_key = ApiKey.objects.create_key(name="root's", tier=partner, owner=owner)
    response = KeyWhoAmI.as_view()(APIRequestFactory().get("/", **auth(full_key)))
    assert response.data == {"user": "root", "staff": True, "superuser": True, "key": row.prefix}


def test_acts_as_owner_false_keeps_the_key_apart_from_its_owner(
    partner: Tier, django_user_model: Any
) -> None:
    owner = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    row, full_key = ApiKey.objects.create_key(name="root's", tier=partner, owner=owner)
    response = KeyOnlyWhoAmI.as_view()(APIRequestFactory().get("/", **auth(full_key)))
    assert response.data == {"user": "", "staff": False, "superuser": False, "key": row.prefix}
    # Still counted as the key, in the key's tier.
    view = RateLimitHeadersMiddleware(KeyOnlyWhoAmI.as_view())
    assert view(APIRequestFactory().get("/", **auth(full_key)))["X-RateLimit-Limit"] == str(
        KEY_LIMIT
    )


def _database_check(*databases: str) -> str:
    from io import StringIO

    from django.core.management import call_command

    out, err = StringIO(), StringIO()
    if databases:
        call_command("check", databases=list(databases), stdout=out, stderr=err)
    else:
        call_command("check", stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def test_the_database_check_warns_about_active_keys_of_superusers_and_staff(
    partner: Tier, django_user_model: Any
) -> None:
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    staff = django_user_model.objects.create_user("sam", is_staff=True)
    plain = django_user_model.objects.create_user("pat")
    ApiKey.objects.create_key(name="partner key of root", tier=partner, owner=root)
    ApiKey.objects.create_key(name="key of sam", tier=partner, owner=staff)
    ApiKey.objects.create_key(name="key of pat", tier=partner, owner=plain)
    ApiKey.objects.create_key(name="ownerless", tier=partner)
    ApiKey.objects.create_key(name="revoked", tier=partner, owner=root, active=False)
    ApiKey.objects.create_key(
        name="expired", tier=partner, owner=root, expires=timezone.now() - timedelta(days=1)
    )

    output = _database_check("default")

    assert output.count("django_throttle.W020") == 1
    assert "2 active API key(s)" in output
    assert "'partner key of root'" in output and "superuser" in output
    assert "'key of sam'" in output and "staff" in output
    for quiet in ("key of pat", "ownerless", "revoked", "expired"):
        assert f"'{quiet}'" not in output
    # Plain `check` (no database) never queries the key table.
    assert "W020" not in _database_check()


def test_the_database_check_is_quiet_without_privileged_keys(
    api_key: tuple[ApiKey, str], django_user_model: Any
) -> None:
    ApiKey.objects.create_key(
        name="key of pat", tier=api_key[0].tier, owner=django_user_model.objects.create_user("pat")
    )
    assert "W020" not in _database_check("default")


def test_the_database_check_names_five_keys_and_counts_the_rest(
    partner: Tier, django_user_model: Any
) -> None:
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    for i in range(7):
        ApiKey.objects.create_key(name=f"key {i}", tier=partner, owner=root)
    output = _database_check("default")
    assert "7 active API key(s)" in output and "and 2 more" in output
    assert "'key 4'" in output and "'key 5'" not in output


def test_keys_issued_before_a_secret_key_rotation_keep_working_from_its_fallbacks(
    partner: Tier, settings: Any, client: Client
) -> None:
    """Rotating ``SECRET_KEY`` as Django documents it (the old value moved to
    ``SECRET_KEY_FALLBACKS``) keeps the API keys issued before working, as it keeps sessions
    and signed values (before: every key fell to the anonymous tier at once); a key of the
    app's own has no fallbacks, and a fallback dropped ends the old keys."""
    old_secret = settings.SECRET_KEY
    _, full_key = ApiKey.objects.create_key(name="before", tier=partner)
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "n" * 50, [old_secret]
    _, new_key = ApiKey.objects.create_key(name="after", tier=partner)
    policy.reset()
    for key in (full_key, new_key):
        response = client.get("/api/ping/", **auth(key))
        assert response["X-RateLimit-Limit"] == str(KEY_LIMIT), key
    assert policy.verified_api_key(RequestFactory().get("/", **auth(full_key))) is not None
    settings.SECRET_KEY_FALLBACKS = []
    assert policy.verified_api_key(RequestFactory().get("/", **auth(full_key))) is None
    assert policy.verified_api_key(RequestFactory().get("/", **auth(new_key))) is not None
    settings.SECRET_KEY_FALLBACKS, settings.DJANGO_THROTTLE_API_KEY_SECRET = [old_secret], "o" * 40
    assert policy.verified_api_key(RequestFactory().get("/", **auth(full_key))) is None
