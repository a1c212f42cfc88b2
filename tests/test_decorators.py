"""``@throttle`` on plain Django views: sync, async and class-based."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory
from django.utils.decorators import method_decorator
from django.views import View

from django_throttle.decorators import throttle
from django_throttle.rates import UNLIMITED, Algorithm, Decision, InvalidRate, Limit, rate_text
from django_throttle.request import core
from tests.factories import endpoint, tier

pytestmark = pytest.mark.django_db


def test_inline_rate_on_a_sync_view(client: Client) -> None:
    codes = [client.get("/hello/").status_code for _ in range(6)]
    assert codes == [200] * 5 + [429]
    response = client.get("/hello/")
    assert response["Content-Type"] == "application/json"
    # The public name is the rate, not the view's module path.
    assert response.json()["limit"] == "5/min"
    assert int(response["Retry-After"]) >= 1
    assert response["X-RateLimit-Limit"] == "5"


def test_headers_on_allowed_responses(client: Client) -> None:
    response = client.get("/hello/")
    assert response["X-RateLimit-Limit"] == "5"
    assert response["X-RateLimit-Remaining"] == "4"
    assert response["X-RateLimit-Reset"] == "12"


def test_inline_rate_on_an_async_view(async_client: AsyncClient) -> None:
    async def three_requests() -> list[int]:
        return [(await async_client.get("/hello-async/")).status_code for _ in range(3)]

    assert async_to_sync(three_requests)() == [200, 200, 429]


def test_class_based_view_through_method_decorator(client: Client) -> None:
    assert [client.get("/cbv/").status_code for _ in range(2)] == [200, 429]


def test_scope_applies_admin_rules(client: Client) -> None:
    anon = tier("anonymous", "100/m", is_default_anonymous=True)
    endpoint("login", "scope", "login", limits={anon: "2/m"})
    assert [client.get("/login/").status_code for _ in range(3)] == [200, 200, 429]


def test_bad_rate_fails_at_decoration_time() -> None:
    with pytest.raises(InvalidRate, match="month"):
        throttle(rate="100/month")


def test_decorator_needs_a_scope_or_a_rate() -> None:
    with pytest.raises(TypeError):
        throttle()


def test_the_decorator_without_its_parentheses_fails_at_decoration_time() -> None:
    # @throttle on its own would hand the view in as the scope and return a decorator as
    # the view: every request a 500.
    with pytest.raises(TypeError, match=r"@throttle\(rate='…'\).*with the parentheses"):
        throttle(ok)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["5/min", "100/h", "10 / s", "20/15m"])
def test_a_rate_given_as_the_scope_fails_at_decoration_time(text: str) -> None:
    # @throttle("5/min") named admin rules of scope "5/min": no limit at all without a word.
    with pytest.raises(TypeError, match=rf"write throttle\(rate='{text}'\)"):
        throttle(text)


def test_a_method_of_a_class_based_view_fails_at_decoration_time() -> None:
    # Its first argument is the view instance: every request was a 500 (AttributeError:
    # the view has no META).
    with pytest.raises(TypeError, match=r"@method_decorator\(throttle\(…\), name='get'\)"):

        class Report(View):
            @throttle(rate="5/min")
            def get(self, request: Any) -> HttpResponse:
                return HttpResponse("report")


def test_the_method_decorator_form_is_taken(client: Client) -> None:
    class Report(View):
        @method_decorator(throttle(rate="1/min"))
        def get(self, request: Any) -> HttpResponse:
            return HttpResponse("report")

    view = Report.as_view()
    codes = [view(RequestFactory().get("/")).status_code for _ in range(2)]
    assert codes == [200, 429]


def test_a_scope_that_is_not_a_rate_is_taken() -> None:
    throttle("login")
    throttle("exports/v2")
    throttle("5/min", rate="5/min")  # a scope shared by views with one inline limit


def test_unscoped_class_based_views_each_get_their_own_bucket(client: Client) -> None:
    # Both classes inherit View.dispatch: under method_decorator they used to share one bucket.
    assert client.get("/cbv-a/").status_code == 200
    assert client.get("/cbv-b/").status_code == 200
    assert client.get("/cbv-a/").status_code == 429
    denied = client.get("/cbv-b/")
    assert denied.status_code == 429
    assert denied.json()["limit"] == "1/min"
    assert "django.views" not in denied.content.decode()


def test_one_class_based_view_keeps_one_bucket_across_requests(client: Client) -> None:
    # method_decorator decorates on every request; the bucket must not change with it.
    assert [client.get("/cbv-a/").status_code for _ in range(3)] == [200, 429, 429]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": "5/m", "cost": 0}, "cost must be between 1"),
        ({"rate": "5/m", "cost": 6}, "could never pass"),
        ({"rate": "5/m", "burst": 0}, "burst must be between 1"),
        ({"rate": "5/m", "failure_mode": "sideways"}, "failure_mode"),
    ],
)
def test_bad_arguments_fail_at_decoration_time(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        throttle(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # Each used to be taken, and then every request to the view failed: a 500 (a scope
        # that is not text) or a 503 (a cost Redis refuses), or a bare TypeError of Python's.
        ({"scope": 5}, r"throttle\(scope=5\): a scope is the name"),
        ({"scope": ["login"]}, r"throttle\(scope=\['login'\]\): a scope is the name"),
        ({"scope": ""}, r"throttle\(scope=''\): a scope is the name"),
        ({"scope": "  ", "rate": "5/m"}, r"throttle\(scope='  '\): a scope is the name"),
        ({"scope": "login", "cost": 2.5}, r"throttle\(cost=2.5\): cost is a whole number"),
        ({"scope": "login", "cost": "2"}, r"throttle\(cost='2'\): cost is a whole number"),
        ({"rate": "5/m", "cost": True}, r"throttle\(cost=True\): cost is a whole number"),
    ],
)
def test_arguments_of_the_wrong_kind_fail_at_decoration_time(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        throttle(**kwargs)  # type: ignore[arg-type]


# Algorithms ---------------------------------------------------------------------------------


def inline_limit(monkeypatch: pytest.MonkeyPatch, view: Any, request: Any = None) -> Limit:
    """The one inline limit ``view`` hands to ``core.check`` for a request."""
    seen: list[Limit] = []

    def check(request: Any, *, limits: Any = None, **kwargs: Any) -> Decision:
        seen.extend(limits)
        return UNLIMITED

    monkeypatch.setattr(core, "check", check)
    view(request or RequestFactory().get("/"))
    [limit] = seen
    return limit


def ok(request: Any) -> HttpResponse:
    return HttpResponse("ok")


@pytest.mark.parametrize(
    ("kwargs", "algorithm", "capacity"),
    [
        ({"rate": "10/s", "burst": 50, "algorithm": "gcra"}, Algorithm.GCRA, 50),
        ({"rate": "10/s", "algorithm": Algorithm.LEAKY_BUCKET}, Algorithm.LEAKY_BUCKET, 10),
        ({"rate": "100/h", "algorithm": "fixed_window"}, Algorithm.FIXED_WINDOW, 100),
        ({"rate": "100/h", "algorithm": "sliding_window_log"}, Algorithm.SLIDING_LOG, 100),
        ({"rate": "9/m", "algorithm": "sliding_window_counter"}, Algorithm.SLIDING_COUNTER, 9),
    ],
)
def test_the_inline_limit_counts_with_the_chosen_algorithm(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], algorithm: str, capacity: int
) -> None:
    limit = inline_limit(monkeypatch, throttle(**kwargs)(ok))
    assert (limit.algorithm, limit.capacity, limit.timezone) == (algorithm, capacity, "")
    assert limit.name == rate_text(kwargs["rate"])


def test_a_calendar_quota_counts_in_its_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    view = throttle(rate="10000/month", algorithm="calendar_quota", timezone="Europe/Berlin")(ok)
    limit = inline_limit(monkeypatch, view)
    assert (limit.algorithm, limit.timezone, limit.calendar_unit) == (
        Algorithm.CALENDAR,
        "Europe/Berlin",
        "month",
    )
    assert limit.name == "10000/month"


def test_a_calendar_quota_without_a_zone_follows_the_setting(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    view = throttle(rate="500/day", algorithm="calendar_quota")(ok)
    settings.TIME_ZONE = "Asia/Tokyo"
    assert inline_limit(monkeypatch, view).timezone == "Asia/Tokyo"
    settings.TIME_ZONE = "UTC"
    assert inline_limit(monkeypatch, view).timezone == "UTC"


def test_the_inline_limit_id_differs_per_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = {
        algorithm: inline_limit(monkeypatch, throttle(rate="60/m", algorithm=algorithm)(ok)).id
        for algorithm in ("token_bucket", "gcra", "fixed_window", "sliding_window_counter")
    }
    assert len(set(ids.values())) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"rate": "100/m", "burst": 20, "algorithm": "fixed_window"},
            "throttle(rate='100/m', burst=20, algorithm='fixed_window'): the fixed window has "
            "no burst: it admits 100 per window; leave the burst empty",
        ),
        (
            {"rate": "100/month"},
            "throttle(rate='100/month'): '100/month': months vary in length; choose the "
            "calendar quota algorithm",
        ),
        (
            {"rate": "100/h", "algorithm": "calendar_quota"},
            "throttle(rate='100/h', algorithm='calendar_quota'): '100/h': a calendar quota "
            "counts per day, week, month or year",
        ),
        (
            {"rate": "1/d", "algorithm": "calendar_quota", "timezone": "Berlin"},
            "unknown time zone 'Berlin'",
        ),
        ({"rate": "1/d", "timezone": "UTC"}, "only a calendar quota has a time zone"),
        (
            {"rate": "20000/h", "algorithm": "sliding_window_log"},
            "use the sliding window counter",
        ),
        ({"rate": "15000/s", "algorithm": "gcra"}, "use the token bucket for this rate"),
        ({"rate": "5/s", "algorithm": "leaky"}, "unknown algorithm 'leaky'; use one of"),
    ],
)
def test_bad_algorithm_arguments_fail_at_decoration_time(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidRate) as info:
        throttle(**kwargs)
    assert message in str(info.value)


def test_a_window_limit_below_the_cost_asks_for_a_larger_count() -> None:
    with pytest.raises(ValueError, match="holding 5; raise the rate's count or lower the cost"):
        throttle(rate="5/m", algorithm="fixed_window", cost=6)


def test_algorithm_without_an_inline_rate_is_refused() -> None:
    with pytest.raises(TypeError, match="give rate='…' too"):
        throttle(scope="login", algorithm="gcra")


def test_a_fixed_window_view_end_to_end() -> None:
    view = throttle(rate="2/m", algorithm="fixed_window")(ok)
    codes = [view(RequestFactory().get("/")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
