"""Regional limits (issue 33): a tier's (or an endpoint rule's) limit rows that name regions
apply to clients from those regions instead of its rows that name none; the region comes
from a trusted edge's header (only from a trusted proxy) or from a GeoIP2 database, and
anything else (untrusted sender, garbage, an unknown region) meets the default limits.
Counted on the suite's own Redis."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.test import AsyncClient, Client

from django_throttle.checks import check_settings
from django_throttle.identity import region_code
from django_throttle.models import EndpointLimit, Tier, TierLimit
from django_throttle.policy import live as policy
from django_throttle.policy.files import PolicyFileError, export_policy, import_policy
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db

EDGE = "10.0.0.5"
OUTSIDE = "198.51.100.7"


@pytest.fixture
def header_source(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REGION_SOURCE = "header:CF-IPCountry"
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = ["10.0.0.0/8"]


@pytest.fixture
def anonymous() -> Tier:
    """Anonymous clients: 5 a minute, 2 a minute from FR or DE."""
    row = tier("anonymous", "5/m", is_default_anonymous=True)
    TierLimit.objects.create(tier=row, rate="2/m", regions="FR,DE")
    return row


def statuses(client: Client, path: str, count: int, **extra: str) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(count)]  # type: ignore[arg-type]


def limit_header(client: Client, path: str, **extra: str) -> str:
    return client.get(path, **extra)["X-RateLimit-Limit"]  # type: ignore[arg-type]


def test_region_codes_are_bounded_and_checked() -> None:
    assert region_code("fr") == "FR"
    assert region_code(" t1 ") == "T1"
    assert region_code("XX") == "XX"
    assert region_code("EU-WEST-1") == "EU-WEST-1"
    for bad in ("", "F R", "FR;DROP", "é", "A" * 17, "A" * 10_000, None, 7):
        assert region_code(bad) is None


def test_trusted_header_from_a_trusted_proxy_applies_the_regional_limit(
    header_source: None, anonymous: Tier
) -> None:
    client = Client()
    headers = {"REMOTE_ADDR": EDGE, "HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    assert statuses(client, "/api/ping/", 3, HTTP_CF_IPCOUNTRY="fr", **headers) == [200, 200, 429]
    # Another client behind the same edge, from a country with no rows: the default limit.
    other = {"REMOTE_ADDR": EDGE, "HTTP_X_FORWARDED_FOR": "203.0.113.10"}
    assert limit_header(client, "/api/ping/", HTTP_CF_IPCOUNTRY="US", **other) == "5"


def test_regional_rows_count_apart_from_the_default_rows(
    header_source: None, anonymous: Tier
) -> None:
    """The regional limit has its own counter: a client counted in FR, then seen with no
    region, starts the default limit afresh."""
    client = Client()
    headers = {"REMOTE_ADDR": EDGE, "HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    assert statuses(client, "/api/ping/", 2, HTTP_CF_IPCOUNTRY="DE", **headers) == [200, 200]
    assert statuses(client, "/api/ping/", 5, **headers) == [200] * 5
    ids = {limit.id for limit in policy.current().tiers[anonymous.id].limits}
    regional = policy.current().tiers[anonymous.id].by_region["DE"].limits
    assert {limit.id for limit in regional}.isdisjoint(ids)


def test_the_same_header_from_an_untrusted_address_is_ignored(
    header_source: None, anonymous: Tier
) -> None:
    client = Client()
    assert limit_header(client, "/api/ping/", REMOTE_ADDR=OUTSIDE, HTTP_CF_IPCOUNTRY="FR") == "5"


def test_without_trusted_proxies_the_header_is_ignored(settings: Any, anonymous: Tier) -> None:
    settings.DJANGO_THROTTLE_REGION_SOURCE = "header:CF-IPCountry"
    assert limit_header(Client(), "/api/ping/", REMOTE_ADDR=EDGE, HTTP_CF_IPCOUNTRY="FR") == "5"
    messages = [message.id for message in check_settings()]
    assert "django_throttle.W007" in messages


@pytest.mark.parametrize(
    "value",
    [
        *("", "ZZ", "X" * 5000, "FR,DE", "fr\x00", "../../etc", "T1 T1"),
        # Full-width letters, commas around a code, an escape sequence: no code, however near.
        *("\uff26\uff32", ",,FR,,", "FR\x1b[0m"),
    ],
)
def test_unknown_garbage_or_overlong_header_meets_the_default_limits(
    header_source: None, anonymous: Tier, value: str
) -> None:
    client = Client()
    headers = {"REMOTE_ADDR": EDGE, "HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    assert limit_header(client, "/api/ping/", HTTP_CF_IPCOUNTRY=value, **headers) == "5"
    # Nothing the client chose is a key of the snapshot's store.
    keys = [key for key in policy.current().compiled if isinstance(key, tuple)]
    assert keys and all(not value or value not in key for key in keys)


def test_regions_off_meets_the_default_limits(anonymous: Tier) -> None:
    client = Client()
    assert limit_header(client, "/api/ping/", REMOTE_ADDR=EDGE, HTTP_CF_IPCOUNTRY="FR") == "5"


def test_endpoint_rule_rows_per_region(header_source: None) -> None:
    """A rule's rows for a tier that name the region replace its rows that name none (for
    that counter); the tier's own limits are the tier's regional ones."""
    anonymous = tier("anonymous", "100/m", is_default_anonymous=True)
    rule = endpoint("ping", "route", "ping", limits={anonymous: "10/m"})
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="3/m", regions="BR")
    client = Client()
    brazil = {"REMOTE_ADDR": EDGE, "HTTP_X_FORWARDED_FOR": "203.0.113.9", "HTTP_CF_IPCOUNTRY": "br"}
    assert limit_header(client, "/api/ping/", **brazil) == "3"
    chile = {"REMOTE_ADDR": EDGE, "HTTP_X_FORWARDED_FOR": "203.0.113.11", "HTTP_CF_IPCOUNTRY": "CL"}
    assert limit_header(client, "/api/ping/", **chile) == "10"


@pytest.mark.django_db(transaction=True)  # the async view reads the rows in another thread
def test_async_decorator_path_picks_the_regional_limit(
    settings: Any, header_source: None, anonymous: Tier
) -> None:
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = ["127.0.0.0/8"]  # AsyncClient's own address
    rule = endpoint("seam", "scope", "seam", limits={anonymous: "10/h"})
    EndpointLimit.objects.create(rule=rule, tier=anonymous, rate="2/h", regions="fr")

    async def run(country: str, address: str) -> list[int]:
        client = AsyncClient()
        headers = {"X-Forwarded-For": address, "CF-IPCountry": country}
        return [
            (await client.get("/seams/view-async/", headers=headers)).status_code for _ in range(3)
        ]

    # async_to_sync, as Django's own tests do: the view's database reads run on this thread
    # (asyncio.run would open a connection in a worker thread that nothing closes, and
    # PostgreSQL then refuses to drop the test database).
    assert async_to_sync(run)("FR", "203.0.113.9") == [200, 200, 429]
    assert async_to_sync(run)("US", "203.0.113.10") == [200, 200, 200]


@pytest.fixture
def geoip_database(settings: Any, tmp_path: Path) -> Path:
    """A tiny GeoIP2 Country database: 203.0.113.0/24 in FR, 2001:db8::/32 in DE."""
    from mmdb_writer import MMDBWriter
    from netaddr import IPSet

    writer = MMDBWriter(ip_version=6, database_type="GeoLite2-Country", ipv4_compatible=True)
    writer.insert_network(IPSet(["203.0.113.0/24"]), {"country": {"iso_code": "FR"}})
    writer.insert_network(IPSet(["2001:db8::/32"]), {"country": {"iso_code": "DE"}})
    writer.to_db_file(str(tmp_path / "GeoLite2-Country.mmdb"))
    settings.GEOIP_PATH = str(tmp_path)
    settings.DJANGO_THROTTLE_REGION_SOURCE = "geoip"
    policy.forget_geoip()
    yield tmp_path
    policy.forget_geoip()


def test_geoip_database_applies_the_regional_limit(geoip_database: Path, anonymous: Tier) -> None:
    client = Client()
    assert statuses(client, "/api/ping/", 3, REMOTE_ADDR="203.0.113.9") == [200, 200, 429]
    assert limit_header(client, "/api/ping/", REMOTE_ADDR="2001:db8:1:2::5") == "2"
    # An address the database does not know: the default limits, no error.
    assert limit_header(client, "/api/ping/", REMOTE_ADDR=OUTSIDE) == "5"
    assert not [m for m in check_settings() if m.id == "django_throttle.E044"]


def test_geoip_database_is_opened_once_per_process(geoip_database: Path, anonymous: Tier) -> None:
    opened = []
    real = policy.open_geoip

    def counting() -> Any:
        opened.append(1)
        return real()

    policy.open_geoip = counting  # type: ignore[assignment]
    try:
        client = Client()
        for address in ("203.0.113.9", "203.0.113.10", OUTSIDE):
            client.get("/api/ping/", REMOTE_ADDR=address)
    finally:
        policy.open_geoip = real  # type: ignore[assignment]
    assert opened == [1]


def test_a_missing_geoip_database_is_a_check_error_never_a_500(
    settings: Any, tmp_path: Path, anonymous: Tier
) -> None:
    settings.DJANGO_THROTTLE_REGION_SOURCE = "geoip"
    settings.GEOIP_PATH = str(tmp_path / "nowhere")
    policy.forget_geoip()
    try:
        assert limit_header(Client(), "/api/ping/", REMOTE_ADDR="203.0.113.9") == "5"
        errors = [m for m in check_settings() if m.id == "django_throttle.E044"]
        assert errors and "REGION_SOURCE" in errors[0].msg
    finally:
        policy.forget_geoip()


@pytest.mark.parametrize("value", ["geo", "header:", "header:CF_IPCountry", "cookie:x", 3])
def test_a_bad_region_source_is_a_check_error_naming_the_setting(settings: Any, value: Any) -> None:
    settings.DJANGO_THROTTLE_REGION_SOURCE = value
    errors = [m for m in check_settings() if m.id == "django_throttle.E043"]
    assert errors and "DJANGO_THROTTLE_REGION_SOURCE" in errors[0].msg


def test_policy_file_round_trip_keeps_regions(anonymous: Tier) -> None:
    exported = export_policy()
    rows = json.dumps(exported)
    assert '"FR,DE"' in rows or "DE,FR" in rows
    TierLimit.objects.all().delete()
    import_policy(json.loads(rows))
    assert sorted(TierLimit.objects.values_list("rate", "regions")) == [
        ("2/m", "DE,FR"),
        ("5/m", ""),
    ]


def test_a_policy_file_giving_regions_as_a_number_is_no_traceback(anonymous: Tier) -> None:
    """A number where a limit's regions are text is read as the text the column saves of it
    (as Django's ``CharField`` reads a number): a code, or a problem naming the field. It
    was an AttributeError traceback (``int.split``) while the import looked for repeats."""
    document = export_policy()
    regional = next(row for row in document["tiers"][0]["limits"] if row["regions"])
    regional["regions"] = 1.5
    with pytest.raises(PolicyFileError, match=r"limits\[\d\]\.regions: '1\.5' is no region code"):
        import_policy(document)
    regional["regions"] = 44
    import_policy(document)
    assert TierLimit.objects.filter(rate="2/m").get().regions == "44"


def test_inspect_and_explain_name_the_region(header_source: None, anonymous: Tier) -> None:
    client = Client()
    headers = {"REMOTE_ADDR": EDGE, "HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    statuses(client, "/api/ping/", 2, HTTP_CF_IPCOUNTRY="FR", **headers)
    explain = ["throttle_explain", "--ip", "203.0.113.9", "--path", "/api/ping/"]
    out = io.StringIO()
    call_command(*explain, "--region", "fr", stdout=out)
    text = out.getvalue()
    assert "FR (its regional limits)" in text
    assert "anonymous 2/min [DE,FR]" in text and "denied (429)" in text
    out = io.StringIO()
    call_command(*explain, stdout=out)
    assert "none (the default limits)" in out.getvalue() and "allowed" in out.getvalue()
    out = io.StringIO()
    call_command(*explain, "--region", "US", stdout=out)
    assert "US (no limit names it: the default limits)" in out.getvalue()
    out = io.StringIO()
    call_command("throttle_inspect", "ip:203.0.113.9", "--region", "FR", stdout=out)
    assert "region FR (its regional limits)" in out.getvalue()
    assert "[DE,FR]" in out.getvalue()
    with pytest.raises(CommandError, match="region"):
        call_command(*explain, "--region", "F R;", stdout=io.StringIO())


@pytest.mark.parametrize(
    "command",
    [
        ("throttle_inspect", "ip:203.0.113.9"),
        ("throttle_explain", "--ip", "203.0.113.9", "--path", "/api/ping/"),
        ("throttle_reset", "ip:203.0.113.9"),
    ],
    ids=lambda command: command[0],
)
@pytest.mark.parametrize("value", ["<b>", "F R;", "x" * 30])
def test_a_bad_region_is_a_one_line_error_naming_the_option(
    header_source: None, anonymous: Tier, command: tuple[str, ...], value: str
) -> None:
    """The client is fine, the region is not: the error names ``--region`` and the form a
    region code takes, never "Unknown client"."""
    with pytest.raises(CommandError) as raised:
        call_command(*command, "--region", value, stdout=io.StringIO())
    message = str(raised.value)
    assert message.startswith("--region: ") and "\n" not in message
    assert f"{value!r} is not a region code (letters, digits and '-', at most 16" in message
    assert "client" not in message.lower()


def test_admin_form_error_for_a_bad_region_code_names_the_field(admin_client: Client) -> None:
    from django.urls import reverse

    from tests.test_admin import inline, limit_row, row_errors, tier_form

    add = reverse("admin:django_throttle_tier_add")
    rows = [limit_row("100/min"), limit_row("10/min", regions="FR, not a code!")]
    response = admin_client.post(add, tier_form() | inline(rows))
    assert response.status_code == 200
    errors = row_errors(response)
    assert (
        list(errors[1]) == ["regions"]
        and "'not a code!' is no region code" in errors[1]["regions"][0]
    )
    assert not Tier.objects.exists()
    # Codes are written one way: upper-cased, sorted, each once.
    rows = [limit_row("100/min"), limit_row("10/min", regions="fr, de,FR")]
    response = admin_client.post(add, tier_form() | inline(rows))
    assert response.status_code == 302
    assert sorted(TierLimit.objects.values_list("regions", flat=True)) == ["", "DE,FR"]


def test_the_admin_inspector_takes_a_region(
    admin_client: Client, header_source: None, anonymous: Tier
) -> None:
    from django.urls import reverse

    url = reverse("admin:django_throttle_usagecount_inspect")
    page = admin_client.get(url, {"client": "203.0.113.9", "region": "fr", "path": "/api/ping/"})
    text = page.content.decode()
    assert page.status_code == 200
    assert 'id="dt-region-counted"' in text and "<strong>FR</strong>" in text
    assert "its regional limits" in text and "[DE,FR]" in text
    page = admin_client.get(url, {"client": "203.0.113.9", "region": "F R!"})
    assert page.status_code == 200 and "is not a region code" in page.content.decode()
    # The error names the region field (its label), not the client, on the inspector and on
    # the reset page it links to.
    error = re.compile(r'<p class="errornote" id="dt-error">([^<]*)</p>')
    found = error.search(page.content.decode())
    bad_region = "From region: 'F R!' is not a region code (letters, digits and '-', at most 16"
    assert found is not None and html.unescape(found[1]) == f"{bad_region}, e.g. FR)."
    reset = reverse("admin:django_throttle_usagecount_inspect_reset")
    page = admin_client.get(reset, {"client": "203.0.113.9", "region": "F R!"}, follow=True)
    shown = [str(message) for message in page.context["messages"]]
    assert [text for text in shown if "region code" in text] == [f"{bad_region}, e.g. FR)."]
