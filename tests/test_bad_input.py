"""Bad input, as a client or an operator sends it, and what it gets: the rows of the README's
"Bad input" table that no other test module covers. Never a 500, never a lost or shared
bucket.

Each header case goes through a real throttled view (``/hello/``: 5 a minute per client) from
``REMOTE_ADDR`` 10.0.0.1: it must be counted in that address's bucket (5 x 200 then 429, and
the same bucket as a request without the header), and another address sending the same bad
value must have a bucket of its own.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_throttle.models import EndpointRule, Tier
from tests.clients import AddressedAsyncClient
from tests.factories import tier

pytestmark = pytest.mark.django_db

TEN_KB = "x" * 10_240
#: Bytes that are not UTF-8, as a WSGI or ASGI server hands them to Django (decoded as
#: latin-1: a header value never holds a character above U+00FF).
INVALID_UTF8 = b"\xff\xfe\xc3\x28".decode("latin-1")
#: An emoji as it arrives: its UTF-8 bytes, decoded as latin-1.
EMOJI = "\U0001f600".encode().decode("latin-1")

#: (header, value, settings): the proxy settings under which the header is read at all.
FORWARDED = {"TRUSTED_PROXIES": 1}
REAL_IP = {"TRUSTED_PROXIES": 1, "CLIENT_IP_HEADER": "X-Real-IP"}
HEADER_CASES = [
    pytest.param("HTTP_X_FORWARDED_FOR", "garbage", FORWARDED, id="xff-garbage"),
    pytest.param("HTTP_X_FORWARDED_FOR", "unknown", FORWARDED, id="xff-unknown"),
    pytest.param("HTTP_X_FORWARDED_FOR", "", FORWARDED, id="xff-empty"),
    pytest.param("HTTP_X_FORWARDED_FOR", " , , ", FORWARDED, id="xff-only-commas"),
    pytest.param("HTTP_X_FORWARDED_FOR", TEN_KB, FORWARDED, id="xff-10kb"),
    pytest.param("HTTP_X_FORWARDED_FOR", "2001:db8::1%" + "z" * 100, FORWARDED, id="xff-too-long"),
    pytest.param("HTTP_X_FORWARDED_FOR", "1.2.3.4\x00", FORWARDED, id="xff-nul"),
    pytest.param("HTTP_X_FORWARDED_FOR", EMOJI, FORWARDED, id="xff-emoji"),
    pytest.param("HTTP_X_FORWARDED_FOR", INVALID_UTF8, FORWARDED, id="xff-invalid-utf8"),
    pytest.param("HTTP_X_REAL_IP", "garbage", REAL_IP, id="real-ip-garbage"),
    pytest.param("HTTP_X_REAL_IP", "198.51.100.7, 203.0.113.9", REAL_IP, id="real-ip-twice"),
    pytest.param("HTTP_X_REAL_IP", TEN_KB, REAL_IP, id="real-ip-10kb"),
    pytest.param("HTTP_X_REAL_IP", "\x00", REAL_IP, id="real-ip-nul"),
    pytest.param("HTTP_X_REAL_IP", INVALID_UTF8, REAL_IP, id="real-ip-invalid-utf8"),
    pytest.param("HTTP_AUTHORIZATION", "Api-Key garbage", {}, id="authorization-garbage-key"),
    pytest.param("HTTP_AUTHORIZATION", "Api-Key", {}, id="authorization-scheme-only"),
    pytest.param("HTTP_AUTHORIZATION", f"Api-Key {TEN_KB}", {}, id="authorization-10kb"),
    pytest.param("HTTP_AUTHORIZATION", "Api-Key dt_\x00_\x00", {}, id="authorization-nul"),
    pytest.param("HTTP_AUTHORIZATION", f"Api-Key {EMOJI}", {}, id="authorization-emoji"),
    pytest.param(
        "HTTP_AUTHORIZATION", f"Api-Key {INVALID_UTF8}", {}, id="authorization-invalid-utf8"
    ),
    pytest.param("HTTP_X_API_KEY", "dt_", {}, id="x-api-key-garbage"),
    pytest.param("HTTP_X_API_KEY", TEN_KB, {}, id="x-api-key-10kb"),
    pytest.param("HTTP_X_API_KEY", "dt_1234abcd_\x00", {}, id="x-api-key-nul"),
    pytest.param("HTTP_X_API_KEY", f"dt_{EMOJI}_{EMOJI}", {}, id="x-api-key-emoji"),
    pytest.param("HTTP_X_API_KEY", INVALID_UTF8, {}, id="x-api-key-invalid-utf8"),
]


@pytest.fixture
def anonymous() -> Tier:
    """A key tier exists, so presented keys are looked up (and must fail) for real."""
    tier("partner", "1000/min")
    return tier("anonymous", "1000/min", is_default_anonymous=True)


@pytest.mark.parametrize(("header", "value", "trust"), HEADER_CASES)
def test_bad_header_is_counted_in_the_remote_addr_bucket(
    client: Client,
    settings: Any,
    anonymous: Tier,
    header: str,
    value: str,
    trust: dict[str, Any],
) -> None:
    for name, setting in trust.items():
        setattr(settings, f"DJANGO_THROTTLE_{name}", setting)
    if header != "HTTP_X_FORWARDED_FOR" and trust:
        bad = {header: value, "HTTP_X_FORWARDED_FOR": "10.0.0.1"}  # the proxy's own hop
    else:
        bad = {header: value}

    codes = [client.get("/hello/", REMOTE_ADDR="10.0.0.1", **bad).status_code for _ in range(6)]
    without = client.get("/hello/", REMOTE_ADDR="10.0.0.1").status_code
    other = client.get("/hello/", REMOTE_ADDR="10.0.0.2", **bad).status_code

    assert codes == [200] * 5 + [429]
    assert without == 429  # the same bucket: not a fresh one per bad value
    assert other == 200  # not shared with other clients sending the same value


#: What a client writes in front of the hop the trusted proxy appends, or as its key.
CLIENT_WRITTEN = [
    pytest.param("X-Forwarded-For", "garbage, {hop}", id="xff-garbage"),
    pytest.param("X-Forwarded-For", ", ".join(["198.51.100.7"] * 10_000) + ", {hop}", id="xff-10k"),
    pytest.param("X-Forwarded-For", "fe80::1%eth0, [::1]:80, 010.0.0.1, {hop}", id="xff-forms"),
    pytest.param("X-Forwarded-For", f"1.2.3.4\x00{EMOJI}, {{hop}}", id="xff-nul-emoji"),
    pytest.param("Authorization", "Api-Key dt_" + "a" * 10_000, id="authorization-10kb"),
    pytest.param("X-API-Key", f"dt_{EMOJI}_{INVALID_UTF8}", id="x-api-key-bytes"),
]


@pytest.mark.parametrize("path", ["/hello/", "/hello-async/", "/api/ping/", "/api/scoped-async-a/"])
@pytest.mark.parametrize("server", ["wsgi", "asgi"])
@pytest.mark.parametrize(("header", "value"), CLIENT_WRITTEN)
def test_what_a_client_writes_is_counted_by_its_address_on_every_kind_of_view(
    settings: Any, path: str, server: str, header: str, value: str
) -> None:
    """Through a proxy (``TRUSTED_PROXIES = 1``), on ``@throttle`` views sync and async, a
    DRF view and an adrf one, under WSGI and ASGI: whatever a client writes before the hop
    the proxy appends, or as a key, it is counted by that hop until refused, then a request
    without it is refused too (no counter of its own), and never a 500."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1
    tier("partner", "1000/min")
    tier("anonymous", "2/min", is_default_anonymous=True)
    hop = "203.0.113.9"
    headers = {"X-Forwarded-For": hop, header: value.format(hop=hop)}

    def get(headers: dict[str, str]) -> int:
        if server == "wsgi":
            return Client().get(path, REMOTE_ADDR="10.0.0.1", headers=headers).status_code
        client = AddressedAsyncClient("10.0.0.1")
        return int(async_to_sync(client.get)(path, headers=headers).status_code)

    codes: list[int] = []
    while 429 not in codes and len(codes) < 6:  # the views allow 2 to 5 a minute
        codes.append(get(headers))
    assert codes[-1] == 429 and set(codes[:-1]) == {200}
    assert get({"X-Forwarded-For": hop}) == 429


def test_duplicate_forwarded_for_headers_count_the_hop_the_proxy_appended(
    client: Client, settings: Any
) -> None:
    """A header sent twice reaches Django joined with ', ' (WSGI): the client's own copy is
    ignored, the trusted proxy's appended address is the client."""
    settings.DJANGO_THROTTLE_TRUSTED_PROXIES = 1

    def codes(forwarded: str) -> list[int]:
        return [
            client.get(
                "/hello/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=forwarded
            ).status_code
            for _ in range(6)
        ]

    assert codes("203.0.113.5, 198.51.100.7") == [200] * 5 + [429]
    assert codes("203.0.113.6, 198.51.100.7")[0] == 429  # rotating the client's part: same bucket


def test_bad_authorization_on_a_drf_view_is_anonymous_not_a_500(
    client: Client, anonymous: Tier
) -> None:
    """DRF's own Basic authentication refuses a malformed ``Basic`` header (403 here, where
    SessionAuthentication comes first and sends no challenge; 401 with Basic first), before
    any throttle runs; an ``Api-Key`` that verifies nothing is anonymous, counted by IP."""
    garbage_basic = "Basic " + base64.b64encode(b"\xff\xfe:\x00").decode()
    responses = [
        client.get("/api/ping/", HTTP_AUTHORIZATION=value)
        for value in ("Basic !!!", garbage_basic, f"Api-Key {TEN_KB}", f"Api-Key {EMOJI}")
    ]

    assert [r.status_code for r in responses] == [403, 403, 200, 200]
    assert responses[2]["X-RateLimit-Limit"] == "1000"  # the anonymous tier's limit


# Admin values not covered in test_admin.py --------------------------------------------------


def rule_data(**fields: str) -> dict[str, str]:
    return {
        "name": "login",
        "match_type": "scope",
        "pattern": "login",
        "methods": "",
        "cost": "1",
        "counts": "all",
        "criticality": "default",
        "enabled": "on",
        "limits-TOTAL_FORMS": "0",
        "limits-INITIAL_FORMS": "0",
        "limits-MIN_NUM_FORMS": "0",
        "limits-MAX_NUM_FORMS": "1000",
        **fields,
    }


@pytest.mark.parametrize("counts", ["sometimes", "", "ALL", "\x00"])
def test_admin_bad_counting_policy_is_an_error_on_counts(admin_client: Client, counts: str) -> None:
    response = admin_client.post(
        reverse("admin:django_throttle_endpointrule_add"), rule_data(counts=counts)
    )

    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["counts"]
    assert not EndpointRule.objects.exists()


@pytest.mark.parametrize("counted_by", ["everyone", "", "IP"])
def test_admin_bad_counted_by_is_an_error_on_that_row(
    admin_client: Client, anonymous: Tier, counted_by: str
) -> None:
    row = {
        "limits-TOTAL_FORMS": "1",
        "limits-0-tier": str(anonymous.pk),
        "limits-0-rate": "5/min",
        "limits-0-burst": "",
        "limits-0-algorithm": "token_bucket",
        "limits-0-counted_by": counted_by,
    }
    response = admin_client.post(
        reverse("admin:django_throttle_endpointrule_add"), rule_data(**row)
    )

    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert [list(errors) for errors in formset.errors] == [["counted_by"]]
    assert not EndpointRule.objects.exists()


@pytest.mark.parametrize("value", ["abc", "1.5", "\u0663x", "9" * 30])
@pytest.mark.parametrize(
    ("model", "field", "data"),
    [
        ("tierassignment", "user", {"note": ""}),
        ("tierassignment", "group", {"note": ""}),
        ("exemption", "user", {"network": "", "note": ""}),
        ("apikey", "owner", {"name": "ci", "active": "on"}),
    ],
)
def test_admin_a_related_id_that_is_no_id_is_an_error_on_its_field(
    admin_client: Client, anonymous: Tier, model: str, field: str, data: dict[str, str], value: str
) -> None:
    """The user, group and owner pickers send ids; a value no id can be (a hand-written or
    tampered POST) was a 500 while the form with its error was drawn: now that error, on the
    field, and nothing saved."""
    url = reverse(f"admin:django_throttle_{model}_add")
    response = admin_client.post(url, data | {"tier": str(anonymous.pk), field: value})

    assert response.status_code == 200
    form = response.context["adminform"].form
    assert field in form.errors
    assert not form.instance.pk


@pytest.mark.parametrize("value", ["", " ", "abc", "1.5", "nan", "\x00", "9" * 30])
@pytest.mark.parametrize(
    ("model", "action"),
    [
        ("tier", "delete_selected"),
        ("apikey", "delete_selected"),
        ("apikey", "revoke"),
        ("apikey", "reset_buckets"),
        ("exemption", "delete_selected"),
    ],
)
def test_admin_a_list_action_on_a_selection_that_is_no_id_changes_nothing(
    admin_client: Client, anonymous: Tier, model: str, action: str, value: str
) -> None:
    """A list action's checkboxes send ids; a value no id can be (a hand-written or tampered
    POST) was a 500 for every action, Django's "delete selected" too: now the valid ids are
    acted on, and with none, Django's "Items must be selected" and nothing changed."""
    from django_throttle.models import ApiKey

    key, _ = ApiKey.objects.create_key(name="ci", tier=anonymous)
    url = reverse(f"admin:django_throttle_{model}_changelist")
    for confirmed in ({}, {"post": "yes"}):
        data = {"action": action, "_selected_action": value, "index": "0"} | confirmed
        response = admin_client.post(url, data, follow=True)

        assert response.status_code == 200
        assert "Items must be selected in order to perform actions on them" in (
            response.content.decode()
        )
    key.refresh_from_db()
    assert key.active
    assert Tier.objects.filter(pk=anonymous.pk).exists()


def test_admin_a_list_action_acts_on_the_valid_ids_of_a_tampered_selection(
    admin_client: Client, anonymous: Tier
) -> None:
    from django_throttle.models import ApiKey

    key, _ = ApiKey.objects.create_key(name="ci", tier=anonymous)
    other, _ = ApiKey.objects.create_key(name="other", tier=anonymous)
    url = reverse("admin:django_throttle_apikey_changelist")
    data = {"action": "revoke", "_selected_action": ["1.5", str(key.pk)], "index": "0"}
    response = admin_client.post(url, data, follow=True)

    assert response.status_code == 200
    key.refresh_from_db()
    other.refresh_from_db()
    assert (key.active, other.active) == (False, True)


HUGE = "1" + "0" * 30


@pytest.mark.parametrize(
    ("model", "query"),
    [
        ("apikey", {"tier": HUGE}),
        ("tierassignment", {"tier": HUGE}),
        ("tierassignment", {"user": HUGE}),
        ("exemption", {"user": HUGE}),
        ("usagecount", {"window_start__year": HUGE}),
        ("usagecount", {"window_start__year": "2026", "window_start__month": HUGE}),
    ],
)
def test_admin_a_list_filtered_by_a_number_too_large_is_drawn_unfiltered(
    admin_client: Client, anonymous: Tier, model: str, query: dict[str, str]
) -> None:
    """A list's filter value beyond what the database's integers (or a date) hold, typed
    in the address bar: on SQLite it failed only when the query ran, a 500. Now Django's
    answer to a filter it cannot apply: the list unfiltered, with its "?e=1" note. PostgreSQL
    compares such a number as a numeric and draws the list filtered to nothing: no 500
    either."""
    from django_throttle.models import ApiKey

    ApiKey.objects.create_key(name="ci", tier=anonymous)
    url = reverse(f"admin:django_throttle_{model}_changelist")
    response = admin_client.get(url, query)

    if response.status_code == 302:
        assert response["Location"] == f"{url}?e=1"
        assert admin_client.get(response["Location"]).status_code == 200
    else:
        assert (response.status_code, connection.vendor) == (200, "postgresql")


def list_edit(rule_id: str, **fields: str) -> dict[str, str]:
    """The rule list's in-place edit of one row, as the page posts it."""
    return {
        "form-TOTAL_FORMS": "1",
        "form-INITIAL_FORMS": "1",
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "form-0-id": rule_id,
        "_save": "Save",
        **fields,
    }


@pytest.mark.parametrize("value", ["", "abc", "-1", "1.5", HUGE])
def test_admin_a_list_edit_of_a_row_that_is_no_id_is_an_error_and_changes_nothing(
    admin_client: Client, value: str
) -> None:
    """The rule list's enabled/shadow boxes post each row's id; a value no row's id can be
    (a tampered POST) was a 500: the rule's own check of its pattern, on the blank row it
    became, named a field the list does not have, and 30 digits failed the query."""
    rule = EndpointRule.objects.create(name="export", pattern="export")
    url = reverse("admin:django_throttle_endpointrule_changelist")
    response = admin_client.post(url, list_edit(value, **{"form-0-shadow": "on"}))

    assert response.status_code == 200
    assert response.context["cl"].formset.errors[0]["id"]
    rule.refresh_from_db()
    assert (rule.enabled, rule.shadow) == (True, False)


def test_admin_a_rule_the_policy_skips_can_be_switched_off_from_the_list(
    admin_client: Client, anonymous: Tier
) -> None:
    """A rule whose pattern was written around the admin (flagged in the list's "problems"
    column): unticking "enabled" in the list was a 500, the rule's check of the pattern
    naming a field the list does not show. The list saves what it edits; the pattern's
    error stays the change page's."""
    rule = EndpointRule.objects.create(name="export", match_type="path", pattern="/api/*")
    url = reverse("admin:django_throttle_endpointrule_changelist")
    response = admin_client.post(url, list_edit(str(rule.pk)))  # "enabled" unticked

    assert response.status_code == 302
    rule.refresh_from_db()
    assert not rule.enabled
    change = reverse("admin:django_throttle_endpointrule_change", args=[rule.pk])
    page = admin_client.get(change)
    assert page.status_code == 200


# Inline limit rows posted with ids that are not this page's rows ------------------------------


def change_page_data(admin_client: Client, url: str) -> dict[str, Any]:
    """What the change page posts back untouched: its form, and the inline's saved rows."""
    context = admin_client.get(url).context
    data: dict[str, Any] = {}
    forms = [context["adminform"].form]
    for inline in context["inline_admin_formsets"]:
        formset = inline.formset
        management = formset.management_form
        data |= {
            management.add_prefix(name): management[name].value() for name in management.fields
        }
        data[management.add_prefix("TOTAL_FORMS")] = len(formset.initial_forms)
        forms += formset.initial_forms
    for form in forms:
        for name in form.fields:
            value = form[name].value()
            if value is True:
                data[form.add_prefix(name)] = "on"
            elif value is not None and value is not False:
                data[form.add_prefix(name)] = value
    return data


def limit_pages(anonymous: Tier) -> dict[str, tuple[str, Any]]:
    """A tier with two limit rows and a rule with two: change page and rows, by model."""
    pro = tier("pro", "5/min", "100/hour")
    rule = EndpointRule.objects.create(name="export", pattern="export")
    rule.limits.create(tier=anonymous, rate="5/m")
    rule.limits.create(tier=pro, rate="5/m")
    return {
        "tier": (reverse("admin:django_throttle_tier_change", args=[pro.pk]), pro.limits),
        "endpointrule": (
            reverse("admin:django_throttle_endpointrule_change", args=[rule.pk]),
            rule.limits,
        ),
    }


def saved_rows(rows: Any) -> list[tuple[Any, ...]]:
    return list(rows.order_by("pk").values_list("pk", "tier_id", "rate"))


@pytest.mark.parametrize("model", ["tier", "endpointrule"])
def test_admin_a_limit_row_posted_twice_is_an_error_and_loses_no_row(
    admin_client: Client, anonymous: Tier, model: str
) -> None:
    """Two rows of the form carrying one row's id (a tampered or mangled POST) saved both
    into that one row: its own limit was silently overwritten by the other's copy, one
    limit lost, the other counted twice. Now an error on the repeated row, nothing saved."""
    url, rows = limit_pages(anonymous)[model]
    before = saved_rows(rows)
    data = change_page_data(admin_client, url)
    data["limits-1-id"] = data["limits-0-id"]

    response = admin_client.post(url, data)

    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert formset.errors[0] == {}
    assert "twice" in str(formset.errors[1]["__all__"])
    assert saved_rows(rows) == before


@pytest.mark.parametrize("model", ["tier", "endpointrule"])
def test_admin_a_limit_row_of_another_parent_is_an_error_and_changes_nothing(
    admin_client: Client, anonymous: Tier, model: str
) -> None:
    """A row posting the id of another tier's or rule's limit (a tampered POST, or one row
    moved meanwhile) was dropped without a word: "changed successfully", its edit lost.
    Now an error on that row, and neither row changed."""
    url, rows = limit_pages(anonymous)[model]
    other = tier("other", "1/min").limits.get()
    before = [*saved_rows(rows), (other.pk, other.tier_id, other.rate)]
    data = change_page_data(admin_client, url)
    data["limits-0-id"] = other.pk
    data["limits-0-rate"] = "9/min"

    response = admin_client.post(url, data)

    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert "reload" in str(formset.errors[0]["__all__"])
    assert [*saved_rows(rows), (other.pk, other.tier_id, "1/min")] == before


@pytest.mark.parametrize("model", ["tier", "endpointrule"])
def test_admin_a_limit_row_deleted_meanwhile_is_an_error_the_page_shows(
    admin_client: Client, anonymous: Tier, model: str
) -> None:
    """Two operators open the same page; one deletes a limit row, the other then saves an
    edit of it. The second save is refused (Django's error on the row's hidden id), and the
    page now says why, on that row, where it said only "Please correct the error below"."""
    url, rows = limit_pages(anonymous)[model]
    data = change_page_data(admin_client, url)
    first = admin_client.post(url, dict(data, **{"limits-0-DELETE": "on"}))
    assert first.status_code == 302
    after_first = saved_rows(rows)

    response = admin_client.post(url, dict(data, **{"limits-0-rate": "6/min"}))

    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert "reload" in str(formset.errors[0]["__all__"])
    assert "reload" in response.content.decode()
    assert saved_rows(rows) == after_first


@pytest.mark.parametrize("model", ["tier", "endpointrule"])
@pytest.mark.parametrize("initial", ["0", "1"])
def test_admin_saved_rows_posted_as_new_ones_are_an_error_and_copy_nothing(
    admin_client: Client, anonymous: Tier, model: str, initial: str
) -> None:
    """A page whose count of saved rows was lowered (a tampered POST) posts saved rows as
    new ones: a tier got a copy of each limit, a rule a 500 (the database's unique
    constraint). Now an error on those rows, nothing saved."""
    url, rows = limit_pages(anonymous)[model]
    before = saved_rows(rows)
    data = change_page_data(admin_client, url) | {"limits-INITIAL_FORMS": initial}

    response = admin_client.post(url, data)

    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert "reload" in str(formset.errors[-1]["__all__"])
    assert saved_rows(rows) == before


@pytest.mark.parametrize("model", ["tier", "endpointrule"])
def test_admin_the_same_new_row_saved_from_two_pages_is_an_error_the_second_time(
    admin_client: Client, anonymous: Tier, model: str
) -> None:
    """Two operators open the same page and add the same limit row. The second save made the
    tier count that limit twice (a copy the policy ignores, W106), and was a 500 for a rule
    (the database's unique constraint). Now the second save is an error on its rate."""
    url, rows = limit_pages(anonymous)[model]
    data = change_page_data(admin_client, url)
    new = {
        "limits-TOTAL_FORMS": 3,
        "limits-2-rate": "7/min",
        "limits-2-algorithm": "token_bucket",
        "limits-2-counted_by": "client",
    } | ({"limits-2-tier": anonymous.pk} if model == "endpointrule" else {})
    assert admin_client.post(url, data | new).status_code == 302
    after_first = saved_rows(rows)

    response = admin_client.post(url, data | new)

    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert "since the page was opened" in str(formset.errors[2]["rate"])
    assert saved_rows(rows) == after_first


def post_rule_rows(
    admin_client: Client, tiers: dict[str, Tier], rows: list[tuple[str, str]], changes: list[Any]
) -> tuple[Any, EndpointRule, list[Any], list[tuple[str, str]]]:
    """Make a rule with limit ``rows`` (tier, rate), then post its page with ``changes``
    (one dict of fields per row, in the order made; then (tier, rate) of rows to add)."""
    rule = EndpointRule.objects.create(name="export", pattern="export")
    made = [rule.limits.create(tier=tiers[slug], rate=rate) for slug, rate in rows]
    url = reverse("admin:django_throttle_endpointrule_change", args=[rule.pk])
    data = change_page_data(admin_client, url)
    index = {data[f"limits-{i}-id"]: i for i in range(len(made))}
    for row, change in zip(made, changes, strict=False):
        for field, value in change.items():
            data[f"limits-{index[row.pk]}-{field}"] = tiers[value].pk if field == "tier" else value
    added = changes[len(made) :]
    for i, (slug, rate) in enumerate(added, start=len(made)):
        data |= {
            f"limits-{i}-tier": tiers[slug].pk,
            f"limits-{i}-rate": rate,
            f"limits-{i}-algorithm": "token_bucket",
            f"limits-{i}-counted_by": "client",
        }
    data["limits-TOTAL_FORMS"] = len(made) + len(added)
    return admin_client.post(url, data), rule, made, added


@pytest.mark.parametrize(
    ("rows", "changes"),
    [
        # (tier, rate) of the rows, then what the form changes in each, then rows it adds
        ([("anonymous", "5/m"), ("pro", "5/m")], [{"tier": "pro"}, {"tier": "anonymous"}]),
        ([("anonymous", "5/m"), ("anonymous", "10/m")], [{"rate": "10/m"}, {"rate": "20/m"}]),
        ([("anonymous", "5/m"), ("anonymous", "10/m")], [{"rate": "10/m"}, {"DELETE": "on"}]),
        (
            [("anonymous", "5/m"), ("anonymous", "10/m"), ("anonymous", "20/m")],
            [{"rate": "10/m"}, {"rate": "20/m"}, {"rate": "5/m"}],
        ),
        (
            [("anonymous", "5/m"), ("pro", "5/m")],
            [{"tier": "pro", "burst": "3"}, {"tier": "anonymous", "burst": "9"}],
        ),
        ([("anonymous", "5/m")], [{"DELETE": "on"}, ("anonymous", "5/m")]),
        ([("anonymous", "5/m")], [{"rate": "10/m"}, ("anonymous", "5/m")]),
    ],
    ids=[
        "swap-tiers",
        "pass-on-rate",
        "take-deleted-rate",
        "rotate-three-rates",
        "swap-tiers-and-bursts",
        "new-row-takes-deleted-rate",
        "new-row-takes-moved-rate",
    ],
)
def test_admin_rule_rows_passing_on_their_values_in_one_save_are_saved(
    admin_client: Client, anonymous: Tier, rows: list[tuple[str, str]], changes: list[Any]
) -> None:
    """Rule rows are saved one after the other; one taking the values another row gives up
    in the same save met the unique constraint half way: a 500 (Django 5.2), though the rows
    as posted differ; Django 6 checked each row against the rows as stored and refused the
    edit. Now saved as posted, each row keeping its id (its counters)."""
    tiers = {"anonymous": anonymous, "pro": tier("pro")}

    response, rule, made, added = post_rule_rows(admin_client, tiers, rows, changes)

    assert response.status_code == 302
    expected = {
        row.pk: (tiers[change.get("tier", row.tier.slug)].pk, change.get("rate", row.rate))
        for row, change in zip(made, changes, strict=False)
        if "DELETE" not in change
    }
    saved = {pk: (t, r) for pk, t, r in saved_rows(rule.limits)}
    assert {pk: saved[pk] for pk in expected} == expected
    new = sorted(row for pk, row in saved.items() if pk not in expected)
    assert new == sorted((tiers[slug].pk, rate) for slug, rate in added)
    bursts = [change["burst"] for change in changes if "burst" in change]
    if bursts:
        assert [str(row.burst) for row in rule.limits.order_by("pk")] == bursts


@pytest.mark.parametrize(
    "changes",
    [
        [{"rate": "10/m"}, {}],
        [{"rate": "10/m"}, {"rate": "10/m"}],
        [{"DELETE": "on"}, {}, ("anonymous", "10/m")],
    ],
    ids=["onto-a-row-that-stays", "two-rows-onto-one-rate", "new-row-onto-a-row-that-stays"],
)
def test_admin_rule_rows_colliding_as_posted_are_an_error_and_change_nothing(
    admin_client: Client, anonymous: Tier, changes: list[Any]
) -> None:
    """Rows that are the same limit as posted (one moving onto a row that keeps its rate, two
    moving onto one rate) are refused on both Django 5.2 and 6, by the check across the
    posted rows (rows of one rule are not checked one by one against the stored rows)."""
    rows = [("anonymous", "5/m"), ("anonymous", "10/m")]
    tiers = {"anonymous": anonymous}

    response, rule, made, _ = post_rule_rows(admin_client, tiers, rows, changes)

    before = [(row.pk, anonymous.pk, row.rate) for row in made]
    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert "duplicate" in str(formset.non_form_errors()), formset.errors
    assert saved_rows(rule.limits) == before
