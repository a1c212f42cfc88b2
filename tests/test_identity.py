"""Who a request is counted as: the user, else the client network, proxies trusted only if told."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest
from django.test import RequestFactory

from django_throttle.identity import UNIDENTIFIED, Identity, get_resolver, resolve_identity


def my_resolver(request: HttpRequest) -> Identity:
    """A custom resolver the ``IDENTITY_RESOLVER`` tests point at: one API key per request."""
    return Identity("key", request.headers.get("X-Api-Key", "none"))


def make_request(
    rf: RequestFactory, remote: str | None = "203.0.113.7", forwarded: str | None = None
) -> HttpRequest:
    extra: dict[str, Any] = {}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    request = rf.get("/api/", **extra)
    if remote is None:
        del request.META["REMOTE_ADDR"]
    else:
        request.META["REMOTE_ADDR"] = remote
    return request


def test_anonymous_ipv4(rf: RequestFactory) -> None:
    assert resolve_identity(make_request(rf)) == Identity("ip", "203.0.113.7")


def test_anonymous_user_object_counts_by_ip(rf: RequestFactory) -> None:
    request = make_request(rf)
    request.user = AnonymousUser()

    identity = resolve_identity(request)

    assert identity == Identity("ip", "203.0.113.7")
    assert identity.key == "ip:203.0.113.7"
    assert not identity.is_authenticated


@pytest.mark.django_db
def test_authenticated_user(rf: RequestFactory, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="ada", password="pw")
    request = make_request(rf)
    request.user = user

    identity = resolve_identity(request)

    assert identity == Identity("user", str(user.pk), user_id=user.pk)
    assert identity.user_id == user.pk
    assert identity.key == f"user:{user.pk}"
    assert identity.is_authenticated


@pytest.mark.parametrize(
    ("remote", "ipv4_prefix", "ipv6_prefix", "expected"),
    [
        ("2001:db8:1:2:3:4:5:6", 32, 64, "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", 32, 64, "2001:db8:1:2::/64"),
        ("2001:db8:1:2:3:4:5:6", 32, 48, "2001:db8:1::/48"),
        ("2001:db8:1:2:3:4:5:6", 32, 128, "2001:db8:1:2:3:4:5:6"),
        ("::ffff:203.0.113.7", 32, 64, "203.0.113.7"),
        ("::ffff:203.0.113.7", 24, 64, "203.0.113.0/24"),
        ("203.0.113.7", 24, 64, "203.0.113.0/24"),
        ("203.0.113.7", 32, 48, "203.0.113.7"),
        ("fe80::1%eth0", 32, 64, "fe80::/64"),
        ("[2001:db8::1]:443", 32, 64, "2001:db8::/64"),
        ("[2001:db8::1]:443", 32, 128, "2001:db8::1"),
        ("203.0.113.7:8080", 32, 64, "203.0.113.7"),
    ],
)
def test_client_network(
    rf: RequestFactory,
    settings: Any,
    remote: str,
    ipv4_prefix: int,
    ipv6_prefix: int,
    expected: str,
) -> None:
    settings.DJANGO_THROTTLE_IPV4_PREFIX = ipv4_prefix
    settings.DJANGO_THROTTLE_IPV6_PREFIX = ipv6_prefix

    assert resolve_identity(make_request(rf, remote)) == Identity("ip", expected)


def test_forwarded_for_ignored_by_default(rf: RequestFactory) -> None:
    request = make_request(rf, "10.0.0.1", forwarded="198.51.100.9")

    assert resolve_identity(request) == Identity("ip", "10.0.0.1")


@pytest.mark.parametrize(
    ("proxies", "forwarded", "expected"),
    [
        (1, "198.51.100.9", "198.51.100.9"),
        (1, "192.0.2.66, 198.51.100.9", "198.51.100.9"),
        (2, "192.0.2.66, 198.51.100.9, 10.0.0.2", "198.51.100.9"),
        (2, "198.51.100.9,10.0.0.2", "198.51.100.9"),
        (1, "192.0.2.66, [2001:db8::1]:443", "2001:db8::/64"),
        (1, "192.0.2.66, 198.51.100.9:5000", "198.51.100.9"),
    ],
)
def test_forwarded_for_through_trusted_proxies(
    rf: RequestFactory, settings: Any, proxies: int, forwarded: str, expected: str
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = proxies
    request = make_request(rf, "10.0.0.1", forwarded=forwarded)

    assert resolve_identity(request) == Identity("ip", expected)


@pytest.mark.parametrize(
    ("proxies", "forwarded"),
    [(2, "198.51.100.9"), (1, ""), (3, "192.0.2.66, 198.51.100.9"), (1, " , ,")],
)
def test_too_few_forwarded_addresses_falls_back_and_warns(
    rf: RequestFactory,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    proxies: int,
    forwarded: str,
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = proxies
    request = make_request(rf, "10.0.0.1", forwarded=forwarded)

    with caplog.at_level(logging.WARNING, logger="django_throttle.identity"):
        identity = resolve_identity(request)

    assert identity == Identity("ip", "10.0.0.1")
    [record] = [r for r in caplog.records if r.name == "django_throttle.identity"]
    assert record.levelno == logging.WARNING
    assert "DJANGO_THROTTLE_TRUSTED_PROXY_COUNT" in record.getMessage()


def test_missing_forwarded_header_falls_back_and_warns(
    rf: RequestFactory, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = 1

    with caplog.at_level(logging.WARNING, logger="django_throttle.identity"):
        identity = resolve_identity(make_request(rf, "10.0.0.1"))

    assert identity == Identity("ip", "10.0.0.1")
    assert "X-Forwarded-For" in caplog.text


@pytest.mark.parametrize(
    "forwarded",
    [
        "garbage",
        "1.2.3.999",
        "x" * 10_000,
        "[::1",
        "::1]",
        "unknown",
        "203.0.113.7/24",
        "2001:db8::zz",
        "\x00\xff",
        "1.2.3.4:5:6",
    ],
)
def test_malformed_forwarded_for_falls_back_to_remote_addr(
    rf: RequestFactory, settings: Any, forwarded: str
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = 1
    request = make_request(rf, "10.0.0.1", forwarded=forwarded)

    assert resolve_identity(request) == Identity("ip", "10.0.0.1")


@pytest.mark.parametrize("proxies", [0, 1])
@pytest.mark.parametrize("remote", [None, "", "garbage", "1.2.3.999", "[::1", "x" * 10_000])
def test_unreadable_remote_addr_is_unidentified_not_a_shared_ip_bucket(
    rf: RequestFactory, settings: Any, proxies: int, remote: str | None
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = proxies
    request = make_request(rf, remote, forwarded="not-an-ip")

    identity = resolve_identity(request)

    assert identity is UNIDENTIFIED
    assert identity.kind == "unknown"
    assert not identity.is_authenticated


def test_default_resolver(settings: Any) -> None:
    assert get_resolver() is resolve_identity


def test_resolver_setting_is_honoured(rf: RequestFactory, settings: Any) -> None:
    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "tests.test_identity.my_resolver"
    request = rf.get("/api/", HTTP_X_API_KEY="k-123")

    resolver = get_resolver()

    assert resolver is my_resolver
    assert resolver(request) == Identity("key", "k-123")


def test_resolver_follows_setting_changes(settings: Any) -> None:
    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "tests.test_identity.my_resolver"
    assert get_resolver() is my_resolver

    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "django_throttle.identity.resolve_identity"
    assert get_resolver() is resolve_identity


def test_unimportable_resolver_raises_import_error(settings: Any) -> None:
    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "tests.nowhere.resolver"

    with pytest.raises(ImportError):
        get_resolver()
