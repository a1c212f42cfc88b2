"""Who a request is counted as: the user, else the client network, proxies trusted only if told."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest
from django.test import Client, RequestFactory

from django_throttle import identity as identity_module
from django_throttle.backends import get_backend
from django_throttle.backends.redis import RedisBackend
from django_throttle.identity import UNIDENTIFIED, Identity
from django_throttle.policy.live import get_resolver, resolve_identity
from django_throttle.rates import Limit
from tests.clients import AddressedAsyncClient
from tests.factories import with_shards

PROXIES = ["10.0.0.0/8", "2001:db8::/32"]


def my_resolver(request: HttpRequest) -> Identity:
    """A custom resolver the ``IDENTITY_RESOLVER`` tests point at: one API key per request."""
    return Identity("key", request.headers.get("X-Api-Key", "none"))


def text_resolver(request: HttpRequest) -> Any:
    """A resolver with a common mistake: it returns the key as text, not an ``Identity``."""
    return "tenant:acme"


def raising_resolver(request: HttpRequest) -> Identity:
    """A resolver with a bug: it raises on every request."""
    raise RuntimeError("the tenant table is gone")


def raw_key_resolver(request: HttpRequest) -> Identity:
    """A resolver that passes the header's raw bytes through, undecodable ones included."""
    raw = request.headers.get("X-Api-Key", "").encode("latin-1")
    return Identity("key", raw.decode("utf-8", "surrogateescape"))


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a fresh process as far as once-per-process warnings go."""
    monkeypatch.setattr(identity_module, "_warned", set())
    monkeypatch.setattr(identity_module, "_short_forwarded_logged", [float("-inf")])


def make_request(
    rf: RequestFactory,
    remote: str | None = "203.0.113.7",
    forwarded: str | None = None,
    **headers: str,
) -> HttpRequest:
    extra: dict[str, Any] = dict(headers)
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
    ("remote", "expected"),
    [
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("203.0.113.7", "203.0.113.7"),
        ("fe80::1%eth0", "fe80::/64"),
        ("[2001:db8::1]:443", "2001:db8::/64"),
        ("203.0.113.7:8080", "203.0.113.7"),
        # NAT64 (RFC 6052 well-known prefix) and other forms
        ("64:ff9b::198.51.100.9", "198.51.100.9"),
        ("64:ff9b::c633:6409", "198.51.100.9"),
        ("[64:ff9b::198.51.100.9]:443", "198.51.100.9"),
        ("64:ff9b:1::198.51.100.9", "64:ff9b:1::/64"),  # local-use prefix: IPv6
        ("::ffff:198.51.100.9", "198.51.100.9"),
        ("fe80::1%25eth0", "fe80::/64"),
        (" 203.0.113.7 ", "203.0.113.7"),
    ],
)
def test_client_network(
    rf: RequestFactory,
    settings: Any,
    remote: str,
    expected: str,
) -> None:
    """IPv4 clients are counted per address, IPv6 clients per /64 (``conf.IPV4_PREFIX``,
    ``conf.IPV6_PREFIX``)."""

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
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = proxies
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
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = proxies
    request = make_request(rf, "10.0.0.1", forwarded=forwarded)

    with caplog.at_level(logging.WARNING, logger="django_throttle.identity"):
        identity = resolve_identity(request)

    assert identity == Identity("ip", "10.0.0.1")
    [record] = [r for r in caplog.records if r.name == "django_throttle.identity"]
    assert record.levelno == logging.WARNING
    assert "DJANGO_THROTTLE_TRUSTED_PROXIES" in record.getMessage()


def test_missing_forwarded_header_falls_back_and_warns(
    rf: RequestFactory, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1

    with caplog.at_level(logging.WARNING, logger="django_throttle.identity"):
        identity = resolve_identity(make_request(rf, "10.0.0.1"))

    assert identity == Identity("ip", "10.0.0.1")
    assert "X-Forwarded-For" in caplog.text


@pytest.mark.django_db
def test_requests_that_skip_the_counted_proxies_log_one_warning_not_one_each(
    client: Client, settings: Any, caplog: pytest.LogCaptureFixture, backend: Any
) -> None:
    """A client that reaches the app directly sends no (or too short an) X-Forwarded-For on
    every request: it is counted by its address, and how much is logged is not its choice."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 2

    with caplog.at_level(logging.WARNING, logger="django_throttle.identity"):
        codes = [
            client.get("/hello/", REMOTE_ADDR="198.51.100.9", **extra).status_code
            for extra in [{}, {"HTTP_X_FORWARDED_FOR": "203.0.113.7"}] * 20
        ]

    assert codes == [200] * 5 + [429] * 35  # hello/ allows 5/min, all by REMOTE_ADDR
    records = [r for r in caplog.records if r.name == "django_throttle.identity"]
    assert len(records) == 1
    assert "DJANGO_THROTTLE_TRUSTED_PROXIES is 2" in records[0].getMessage()


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
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1
    request = make_request(rf, "10.0.0.1", forwarded=forwarded)

    assert resolve_identity(request) == Identity("ip", "10.0.0.1")


@pytest.mark.parametrize("proxies", [0, 1])
@pytest.mark.parametrize("remote", [None, "", "garbage", "1.2.3.999", "[::1", "x" * 10_000])
def test_unreadable_remote_addr_is_unidentified_not_a_shared_ip_bucket(
    rf: RequestFactory, settings: Any, proxies: int, remote: str | None
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = proxies
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

    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "django_throttle.policy.live.resolve_identity"
    assert get_resolver() is resolve_identity


def test_unimportable_resolver_raises_import_error(settings: Any) -> None:
    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "tests.nowhere.resolver"

    with pytest.raises(ImportError):
        get_resolver()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("resolver", "says"),
    [
        ("tests.test_identity.text_resolver", "returned str, not an Identity"),
        ("tests.test_identity.raising_resolver", "raised RuntimeError"),
        ("tests.nowhere.resolver", "raised ModuleNotFoundError"),
    ],
)
@pytest.mark.parametrize(
    ("path", "allowed"),
    [("/hello/", 5), ("/hello-async/", 2), ("/api/ping/", 3)],
)
def test_a_failing_resolver_counts_by_the_default_and_says_so(
    client: Client,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    resolver: str,
    says: str,
    path: str,
    allowed: int,
) -> None:
    """A resolver that cannot be imported, raises or returns no ``Identity`` is no 500 on
    the decorator (sync and async) or DRF: the request is counted by its address under its
    tier, and one ERROR names the setting and what it must return."""
    from django_throttle.request import core
    from tests.factories import tier

    tier("anonymous", "1/min", burst=3, is_default_anonymous=True)
    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = resolver
    monkeypatch.setattr(core, "_last_resolver_log", -core.UNIDENTIFIED_LOG_INTERVAL)

    with caplog.at_level(logging.ERROR, logger="django_throttle"):
        codes = [client.get(path).status_code for _ in range(allowed + 1)]

    assert codes == [200] * allowed + [429]
    errors = [r.getMessage() for r in caplog.records if "IDENTITY_RESOLVER" in r.getMessage()]
    assert len(errors) == 1, errors  # once a minute, not once a request
    assert resolver in errors[0] and says in errors[0]
    assert "django_throttle.identity.Identity(kind, value)" in errors[0]


# --- trusted proxies by network --------------------------------------------------------------


@pytest.mark.parametrize(
    ("remote", "forwarded", "expected"),
    [
        ("10.0.0.1", "198.51.100.9", "198.51.100.9"),
        # Walk from the right, skipping our own proxies; what the client wrote is left of it.
        ("10.0.0.1", "192.0.2.66, 198.51.100.9, 10.0.0.2", "198.51.100.9"),
        ("10.0.0.1", "10.0.0.3, 198.51.100.9, 10.1.0.2,10.0.0.2", "198.51.100.9"),
        ("10.0.0.1", "198.51.100.9, [2001:db8::7]:443", "198.51.100.9"),
        ("10.0.0.1", "198.51.100.9, , 10.0.0.2", "198.51.100.9"),
        ("10.0.0.1", "2001:db9:1:2::7", "2001:db9:1:2::/64"),
        ("2001:db8::1", "198.51.100.9", "198.51.100.9"),
        ("[2001:db8::1]:443", "198.51.100.9", "198.51.100.9"),
        ("::ffff:10.0.0.1", "198.51.100.9", "198.51.100.9"),
        ("64:ff9b::10.0.0.1", "198.51.100.9", "198.51.100.9"),
        # Every hop trusted (an internal client): the earliest.
        ("10.0.0.1", "10.9.9.9, 10.0.0.2", "10.9.9.9"),
        # Straight from a proxy with no header (a health check): the proxy.
        ("10.0.0.1", None, "10.0.0.1"),
        ("10.0.0.1", "", "10.0.0.1"),
        # A proxy that could not tell ("unknown") or garbage: REMOTE_ADDR, never a guess.
        ("10.0.0.1", "198.51.100.9, unknown", "10.0.0.1"),
        ("10.0.0.1", "198.51.100.9, garbage, 10.0.0.2", "10.0.0.1"),
    ],
)
def test_forwarded_for_through_trusted_networks(
    rf: RequestFactory, settings: Any, remote: str, forwarded: str | None, expected: str
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = PROXIES

    assert resolve_identity(make_request(rf, remote, forwarded)) == Identity("ip", expected)


@pytest.mark.parametrize("forwarded", ["198.51.100.9", "10.0.0.2", "1.2.3.4, 10.0.0.2"])
@pytest.mark.parametrize("remote", ["203.0.113.7", "2001:db9::1", "11.0.0.1"])
def test_forwarded_for_from_an_untrusted_peer_is_ignored(
    rf: RequestFactory, settings: Any, remote: str, forwarded: str
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = PROXIES

    identity = resolve_identity(make_request(rf, remote, forwarded))

    assert identity.value == (remote if ":" not in remote else "2001:db9::/64")


def test_the_network_list_follows_setting_changes(rf: RequestFactory, settings: Any) -> None:
    request = make_request(rf, "192.168.1.1", "198.51.100.9")
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert resolve_identity(request).value == "192.168.1.1"

    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = ["192.168.0.0/16"]
    assert resolve_identity(request).value == "198.51.100.9"

    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = []
    assert resolve_identity(request).value == "192.168.1.1"


def test_with_a_removed_count_beside_networks_the_peer_must_still_be_trusted(
    rf: RequestFactory, settings: Any
) -> None:
    """``TRUSTED_PROXY_COUNT`` is gone (system check E041): the network list decides."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXY_COUNT = 1
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = PROXIES

    assert resolve_identity(make_request(rf, "203.0.113.7", "198.51.100.9")).value == "203.0.113.7"
    assert resolve_identity(make_request(rf, "10.0.0.1", "198.51.100.9")).value == "198.51.100.9"


# --- a single client IP header ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("trust", "remote", "expected"),
    [
        ({"TRUSTED_PROXIES": PROXIES}, "10.0.0.1", "198.51.100.9"),
        ({"TRUSTED_PROXIES": PROXIES}, "203.0.113.7", "203.0.113.7"),  # not from our edge
        ({"TRUSTED_PROXIES": 1}, "203.0.113.7", "198.51.100.9"),
        ({}, "203.0.113.7", "203.0.113.7"),  # no proxy trusted: never read
    ],
)
def test_client_ip_header_is_read_only_from_a_trusted_proxy(
    rf: RequestFactory, settings: Any, trust: dict[str, Any], remote: str, expected: str
) -> None:
    settings.DJANGO_THROTTLE_CLIENT_IP_HEADER = "X-Real-IP"
    for name, value in trust.items():
        setattr(settings, f"DJANGO_THROTTLE_{name}", value)
    # X-Forwarded-For is what a client can forge; with the header set it is not read at all.
    request = make_request(rf, remote, "192.0.2.66", HTTP_X_REAL_IP="198.51.100.9")

    assert resolve_identity(request) == Identity("ip", expected)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "  ",
        "unknown",
        "garbage",
        "198.51.100.9, 192.0.2.66",
        "198.51.100.9,",
        "x" * 10_000,
    ],
)
def test_bad_client_ip_header_falls_back_to_remote_addr(
    rf: RequestFactory, settings: Any, value: str | None
) -> None:
    """Missing, empty, garbage, or sent twice (the server joins repeats with a comma)."""
    settings.DJANGO_THROTTLE_CLIENT_IP_HEADER = "X-Real-IP"
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = PROXIES
    headers = {} if value is None else {"HTTP_X_REAL_IP": value}

    assert resolve_identity(make_request(rf, "10.0.0.1", **headers)).value == "10.0.0.1"


def test_client_ip_header_normalises_like_any_address(rf: RequestFactory, settings: Any) -> None:
    settings.DJANGO_THROTTLE_CLIENT_IP_HEADER = "X-Real-IP"
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1

    request = make_request(rf, "10.0.0.1", HTTP_X_REAL_IP="[2001:db8:1:2::9]:443")

    assert resolve_identity(request).value == "2001:db8:1:2::/64"


# --- address forms ----------------------------------------------------------------------------


BAD_VALUES = [
    "",
    " , ,",
    "unknown",
    "garbage",
    "1.2.3.999",
    "[::1",
    "1.2.3.4:5:6",
    "203.0.113.7/24",
    "\x00",
    "\xff\xfe",  # undecodable bytes arrive latin-1 decoded
    "😀",
    "{x}",
    "x" * 10_000,
    "1.2.3.4\n5.6.7.8",
]


@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize(
    "trust",
    [
        {"TRUSTED_PROXIES": 1},
        {"TRUSTED_PROXIES": PROXIES},
        {"TRUSTED_PROXIES": 1, "CLIENT_IP_HEADER": "X-Real-IP"},
        {"TRUSTED_PROXIES": PROXIES, "CLIENT_IP_HEADER": "X-Real-IP"},
    ],
)
def test_bad_header_values_never_raise_and_fall_back_to_remote_addr(
    rf: RequestFactory, settings: Any, trust: dict[str, Any], value: str
) -> None:
    for name, setting in trust.items():
        setattr(settings, f"DJANGO_THROTTLE_{name}", setting)
    request = make_request(rf, "10.0.0.1", value, HTTP_X_REAL_IP=value)

    assert resolve_identity(request) == Identity("ip", "10.0.0.1")


def test_long_garbage_is_not_cached(rf: RequestFactory, settings: Any) -> None:
    """Attacker-chosen text must not fill the parse caches with 10 KB keys."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = PROXIES
    before = identity_module._parse_address.cache_info().currsize

    for n in range(50):
        resolve_identity(make_request(rf, "10.0.0.1", f"{n}" + "x" * 10_000))

    assert identity_module._parse_address.cache_info().currsize <= before + 1


# --- warnings: once per process, never per request ------------------------------------------


def test_forwarded_for_without_a_trusted_proxy_warns_once(
    rf: RequestFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_throttle.identity"):
        identities = {
            resolve_identity(make_request(rf, forwarded="198.51.100.9")) for _ in range(20)
        }

    assert identities == {Identity("ip", "203.0.113.7")}
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "the header is ignored" in message
    assert "set DJANGO_THROTTLE_TRUSTED_PROXIES (a count or the proxies' networks)" in message


@pytest.mark.parametrize(
    ("trust", "forwarded"),
    [({}, None), ({"TRUSTED_PROXIES": PROXIES}, "198.51.100.9")],
)
def test_no_warning_without_the_header_or_with_proxies_trusted(
    rf: RequestFactory,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    trust: dict[str, Any],
    forwarded: str | None,
) -> None:
    for name, value in trust.items():
        setattr(settings, f"DJANGO_THROTTLE_{name}", value)
    with caplog.at_level(logging.DEBUG, logger="django_throttle.identity"):
        resolve_identity(make_request(rf, forwarded=forwarded))

    assert caplog.records == []


@pytest.mark.django_db
def test_spoofed_forwarded_for_gets_no_fresh_bucket_through_a_view(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """``/hello/`` allows 5 a minute: rotating X-Forwarded-For does not reset it."""
    with caplog.at_level(logging.WARNING, logger="django_throttle.identity"):
        codes = [
            client.get("/hello/", HTTP_X_FORWARDED_FOR=f"198.51.100.{n}").status_code
            for n in range(7)
        ]

    assert codes == [200] * 5 + [429] * 2
    assert caplog.text.count("the header is ignored") == 1


@pytest.mark.django_db
def test_clients_behind_trusted_proxies_get_their_own_buckets_through_a_view(
    client: Client, settings: Any
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = PROXIES

    def codes(forwarded: str) -> list[int]:
        return [
            client.get(
                "/hello/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=forwarded
            ).status_code
            for _ in range(6)
        ]

    assert codes("198.51.100.1") == [200] * 5 + [429]
    assert codes("1.1.1.1, 198.51.100.2") == [200] * 5 + [429]
    # The client's own prefix does not buy it a new bucket: the proxy appended the real one.
    assert codes("1.1.1.2, 198.51.100.2")[0] == 429


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize(
    ("listed", "proxy"),
    [
        ("::ffff:10.0.0.0/104", "::ffff:10.0.0.1"),  # a dual-stack socket's REMOTE_ADDR
        ("::ffff:10.0.0.0/104", "10.0.0.1"),
        ("10.0.0.0/8", "::ffff:10.0.0.1"),
        ("64:ff9b::10.0.0.0/104", "10.0.0.1"),  # NAT64, read as the IPv4 it carries
    ],
)
def test_a_proxy_listed_in_ipv4_mapped_form_is_trusted_through_a_view(
    settings: Any, kind: str, listed: str, proxy: str
) -> None:
    """The client IP path reads ``::ffff:10.0.0.1`` as ``10.0.0.1``: a proxy listed in mapped
    form (``::ffff:10.0.0.0/104``, as a dual-stack server shows it) was never trusted, so every
    client behind it was counted as the proxy: one client's requests refused all of them."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = [listed]

    def codes(forwarded: str, address: str = proxy) -> list[int]:
        headers = {"X-Forwarded-For": forwarded}
        if kind == "wsgi":
            client = Client(REMOTE_ADDR=address)
            return [client.get("/hello/", headers=headers).status_code for _ in range(6)]

        async def run() -> list[int]:
            client = AddressedAsyncClient(address)
            return [(await client.get("/hello/", headers=headers)).status_code for _ in range(6)]

        return async_to_sync(run)()

    assert codes("198.51.100.1") == [200] * 5 + [429]
    assert codes("198.51.100.2") == [200] * 5 + [429]  # another client: a bucket of its own
    assert codes("1.1.1.1, 198.51.100.2")[0] == 429  # its own prefix buys it nothing
    # A peer outside the list: the header is ignored, whatever it says.
    assert codes("198.51.100.3", "::ffff:11.0.0.1") == [200] * 5 + [429]
    assert codes("198.51.100.4", "::ffff:11.0.0.1")[0] == 429


# --- identity strings as Redis keys -----------------------------------------------------------


NASTY_VALUES = [
    "{evil}",
    "}{",
    "a}b{c",
    "{}",
    "",
    "line\nbreak",
    "line break",
    "\r\n",
    "nul\x00byte",
    "nul",
    "x" * 10_240,
    "x" * 10_241,
    "😀",
    "😀😀",
    "\xff\xfe",  # invalid UTF-8 bytes as a WSGI server decodes them (latin-1)
    b"\xff\xfe".decode("utf-8", "surrogateescape"),  # ... or as a resolver might
    b"\xed\xb3\xbf".decode("utf-8", "surrogateescape"),
    "*",
    "?[a]",
    "dt:{0}",
]
IDENTITIES = [Identity(kind, value) for kind in ("user", "key", "ip") for value in NASTY_VALUES]
KEY_SHAPE = re.compile(r"(?P<prefix>[^{}]+):\{(?P<shard>[0-9]+)\}[A-Za-z0-9_-]{16}(?P<rest>.*)")


@pytest.fixture
def redis_backend() -> RedisBackend:
    backend = get_backend()
    assert isinstance(backend, RedisBackend)
    return backend


@pytest.mark.parametrize("shards", [1, 16, 1024])
def test_nasty_identities_make_bounded_keys_with_our_hash_tag_only(
    settings: Any, shards: int
) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = with_shards(settings.DJANGO_THROTTLE_REDIS_URL, shards)
    backend = get_backend()
    assert isinstance(backend, RedisBackend) and backend.shards == shards
    limit = Limit.build("per-minute", "5/m")
    keys = [backend.key(identity.key, limit) for identity in IDENTITIES]
    longest_tag = len(f"{backend.prefix}:{{{backend.shards - 1}}}")

    for key in keys:
        match = KEY_SHAPE.fullmatch(key)
        assert match is not None, key
        assert match["prefix"] == backend.prefix
        assert int(match["shard"]) < backend.shards
        assert match["rest"] == "tper-minute"  # the algorithm code, then the limit id
        assert len(key) <= longest_tag + 16 + len("tper-minute")
    assert len(set(keys)) == len(IDENTITIES), "two identities share a key"


def test_nasty_identities_are_counted_apart_in_redis(
    redis_backend: RedisBackend, redis_client: redis.Redis
) -> None:
    limit = Limit.build("burst", "2/h")
    denied = [
        [redis_backend.hit(identity.key, [limit]).allowed for _ in range(3)]
        for identity in IDENTITIES
    ]

    assert denied == [[True, True, False]] * len(IDENTITIES)
    keys = [key.decode() for key in redis_client.scan_iter(f"{redis_backend.prefix}:*")]
    bucket_keys = [key for key in keys if KEY_SHAPE.fullmatch(key) and key.endswith("tburst")]
    assert len(bucket_keys) == len(IDENTITIES)
    for key in bucket_keys:
        assert key.count("{") == 1
        assert key.count("}") == 1
        assert len(key) < 64
        assert redis_client.pttl(key) > 0


def test_undecodable_identity_keys_stay_distinct_and_encodable() -> None:
    surrogate = Identity("key", b"\xff".decode("utf-8", "surrogateescape"))
    latin1 = Identity("key", "\xff")

    assert surrogate.key == "key\x00edb3bf"  # "\\udcff" as surrogatepass UTF-8, in hex
    assert latin1.key == "key:\xff"
    assert surrogate.key != Identity("key", "\x00edb3bf").key


@pytest.mark.django_db
def test_a_resolver_returning_undecodable_text_is_counted_not_failed(
    client: Client, settings: Any
) -> None:
    settings.DJANGO_THROTTLE_IDENTITY_RESOLVER = "tests.test_identity.raw_key_resolver"

    def codes(key: bytes) -> list[int]:
        header = key.decode("latin-1")
        responses = [client.get("/hello/", HTTP_X_API_KEY=header) for _ in range(6)]
        assert all("X-RateLimit-Degraded" not in r for r in responses)
        return [r.status_code for r in responses]

    assert codes(b"\xff\xfe") == [200] * 5 + [429]
    assert codes(b"\xff\xfd") == [200] * 5 + [429]
    assert codes(b"ok") == [200] * 5 + [429]
