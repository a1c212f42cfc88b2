"""The checks that read stored rows: every policy row the compiler would skip (E101…E105)
and every limit row repeating another (W106), rules that count only successes or failures
without the settling middleware (W003), a credential rule that limits some tiers only (W005)
and an active API key owned by a superuser or staff user (W020).

Rows written around the admin (fixtures, SQL, ``QuerySet.update``) can hold values the admin
refuses: the compiler skips such a row and logs it, and E101…E105 make it visible before a
deploy. Each check reads in a savepoint and reports nothing when the tables or the database
are missing, so ``manage.py check`` never breaks before ``migrate``.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import Any, TypeVar

from django.conf import settings
from django.core import checks
from django.core.exceptions import FieldError
from django.db import DatabaseError, transaction

_MIDDLEWARE_PATH = "django_throttle.middleware.RateLimitHeadersMiddleware"
#: Check id of a policy row the compiler skips, per model.
_ROW_CHECK_IDS = {
    "Tier": "django_throttle.E101",
    "TierLimit": "django_throttle.E102",
    "EndpointRule": "django_throttle.E103",
    "EndpointLimit": "django_throttle.E104",
    "Exemption": "django_throttle.E105",
}
_Read = TypeVar("_Read")


def _read(
    alias: str, read: Callable[[], _Read], missing: tuple[type[Exception], ...] = (Exception,)
) -> _Read | None:
    """``read()`` in a savepoint (a missing table cannot break a surrounding transaction);
    ``None`` when it raises one of ``missing``: by default anything, as with no tables yet, no
    database, or database access refused (test runners)."""
    try:
        with transaction.atomic(using=alias):
            return read()
    except missing:
        return None


def check_rows(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E101…E105: a policy row the compiler skips, naming the row, the field and the fix;
    W106: a limit row repeating an earlier one of the same tier or rule (same counter: see
    ``duplicate_key``), which the compiler counts once but an operator should delete."""
    from django_throttle.models import EndpointLimit, EndpointRule, Exemption, Tier, TierLimit
    from django_throttle.policy.files import repeats

    querysets = (
        Exemption.objects.all(),
        Tier.objects.all(),
        TierLimit.objects.select_related("tier"),
        EndpointRule.objects.all(),
        EndpointLimit.objects.select_related("rule", "tier"),
    )
    tables: list[list[Any]] | None = _read(
        Tier.objects.db, lambda: [list(rows.order_by("pk")) for rows in querysets]
    )
    if tables is None:
        return []
    messages: list[checks.CheckMessage] = []
    for row in chain.from_iterable(tables):
        if problems := row.row_problems():
            model = type(row).__name__
            what = "; ".join(f"{field}: {reason}" for field, reason in problems.items())
            messages.append(
                checks.Error(
                    f"{model} pk={row.pk} cannot be used, so the throttle policy skips it: {what}.",
                    hint=f"Correct or delete it in the admin ({model} {row.pk}).",
                    obj=row,
                    id=_ROW_CHECK_IDS[model],
                )
            )
    for row, original in chain(repeats(tables[2]), repeats(tables[4])):
        model = type(row).__name__
        parent = f"tier '{row.tier.slug}'" if model == "TierLimit" else f"rule '{row.rule.name}'"
        messages.append(
            checks.Warning(
                f"{model} pk={row.pk} repeats {model} pk={original.pk} of {parent} "
                f"({row}): the policy counts that limit once and ignores the copy.",
                hint=f"Delete one of them in the admin ({parent}).",
                obj=row,
                id="django_throttle.W106",
            )
        )
    return messages


def check_settling_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    """W003: a rule counts only successes or failures, but DRF views' reservations are given
    back by the middleware, which is not installed (``@throttle`` settles by itself)."""
    if _MIDDLEWARE_PATH in (getattr(settings, "MIDDLEWARE", None) or ()):
        return []
    from django_throttle.models import EndpointRule

    rules = EndpointRule.objects.filter(enabled=True).exclude(counts=EndpointRule.Counts.ALL)
    names = _read(EndpointRule.objects.db, lambda: list(rules.values_list("name", flat=True)[:5]))
    if not names:
        return []
    return [
        checks.Warning(
            f"Endpoint rules count only successes or failures ({', '.join(names)}), but "
            f"{_MIDDLEWARE_PATH} is not in MIDDLEWARE: DRF views under them count every "
            "request.",
            hint=f"Add '{_MIDDLEWARE_PATH}' to MIDDLEWARE (it gives back the tokens of "
            "requests the rule does not count), or set the rules' 'counts' to 'all'.",
            id="django_throttle.W003",
        )
    ]


def check_concurrency_middleware(**kwargs: Any) -> list[checks.CheckMessage]:
    """W006: a concurrency limit is set, but DRF views give their slots back through the
    middleware, which is not installed (``@throttle`` gives its own back)."""
    if _MIDDLEWARE_PATH in (getattr(settings, "MIDDLEWARE", None) or ()):
        return []
    from django_throttle.models import EndpointLimit, Protection, TierLimit
    from django_throttle.rates import Algorithm

    def read() -> list[str]:
        rules = EndpointLimit.objects.filter(algorithm=Algorithm.CONCURRENCY, rule__enabled=True)
        tiers = TierLimit.objects.filter(algorithm=Algorithm.CONCURRENCY)
        named = [f"rule {name}" for name in rules.values_list("rule__name", flat=True)[:5]]
        named += [f"tier {slug}" for slug in tiers.values_list("tier__slug", flat=True)[:5]]
        shedding = Protection.objects.filter(enabled=True, in_flight__isnull=False).exists()
        return named + ["service protection (load shedding)"] * shedding

    names = _read(EndpointLimit.objects.db, read)
    if not names:
        return []
    return [
        checks.Warning(
            f"Concurrency limits are set ({', '.join(dict.fromkeys(names))}), but "
            f"{_MIDDLEWARE_PATH} is not in MIDDLEWARE: a DRF view's slot is held until its "
            "request object is collected instead of when its response ends.",
            hint=f"Add '{_MIDDLEWARE_PATH}' to MIDDLEWARE (it gives the slots back when the "
            "response ends); views under @throttle give their own back.",
            id="django_throttle.W006",
        )
    ]


def check_credential_rules(**kwargs: Any) -> list[checks.CheckMessage]:
    """W005: a credential rule limits some tiers only.

    A credential rule is one with a limit counted by username, or one counting failures (a
    login or token endpoint's; :attr:`~django_throttle.policy.live.EndpointPolicy.credential`).
    Its limits counted by IP address or username apply to every caller whatever the tier
    (they protect the account and the server); its limits counted by client apply only to
    the tiers they are given for, so signed-in users and API keys of the other tiers meet
    none of them there."""
    from django_throttle.models import EndpointLimit, EndpointRule, Tier

    def read() -> tuple[dict[int, str], dict[int, tuple[str, str]], list[tuple[int, int, str]]]:
        enabled = EndpointRule.objects.filter(enabled=True).values_list("pk", "name", "counts")
        rules = {pk: (name, counts) for pk, name, counts in enabled}
        rows = EndpointLimit.objects.filter(rule__in=list(rules)).order_by("pk")
        return (
            dict(Tier.objects.order_by("pk").values_list("pk", "slug")),
            rules,
            list(rows.values_list("rule_id", "tier_id", "counted_by")),
        )

    found = _read(EndpointRule.objects.db, read)
    if found is None:
        return []
    tiers, rules, rows = found
    credential = {pk for pk, (_, counts) in rules.items() if counts == "failures"}
    client_tiers: dict[int, set[int]] = {}
    for rule_id, tier_id, counted_by in rows:
        if counted_by == "username":
            credential.add(rule_id)
        elif counted_by == "client":
            client_tiers.setdefault(rule_id, set()).add(tier_id)
    warnings: list[checks.CheckMessage] = []
    for rule_id, limited in sorted(client_tiers.items()):
        unlimited = [slug for pk, slug in tiers.items() if pk not in limited]
        if rule_id not in credential or not unlimited:
            continue
        given = ", ".join(slug for pk, slug in tiers.items() if pk in limited)
        warnings.append(
            checks.Warning(
                f"Credential rule {rules[rule_id][0]!r} limits its callers by client for tier(s) "
                f"{given} only: callers of tier(s) {', '.join(unlimited)} (signed-in users, "
                "API keys) meet none of those limits on that login or token endpoint. Its "
                "limits counted by IP address and username apply whatever the tier.",
                hint="Give the rule a limit counted by client for every tier, or count it "
                "by IP address or username instead.",
                id="django_throttle.W005",
            )
        )
    return warnings


def check_api_key_owners(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W020: an active API key owned by a superuser or a staff user.

    ``ApiKeyAuthentication`` logs a key in as its owner, with every permission the owner has,
    so such a key is a superuser's (or staff) login in the hands of whoever holds it. A
    database check (``manage.py check --database default``, ``migrate``, the test runner):
    it reads the key table (two small queries), so plain ``manage.py check`` stays quiet.
    """
    if not databases:
        return []
    from django.db.models import Q
    from django.utils import timezone

    from django_throttle.models import ApiKey

    messages: list[checks.CheckMessage] = []
    for alias in databases:
        privileged = (
            ApiKey.objects.using(alias)
            .filter(active=True)
            .filter(Q(expires__isnull=True) | Q(expires__gt=timezone.now()))
            .filter(Q(owner__is_superuser=True) | Q(owner__is_staff=True))
        )
        # Nothing when there are no tables yet (before migrate), or the user model has no
        # is_superuser/is_staff.
        total = _read(alias, privileged.count, (DatabaseError, FieldError))
        if not total:
            continue
        shown = list(privileged.select_related("owner").order_by("pk")[:5])
        named = ", ".join(_privileged_key(key) for key in shown)
        more = f" and {total - len(shown)} more" if total > len(shown) else ""
        messages.append(
            checks.Warning(
                f"{total} active API key(s) in database {alias!r} are owned by a superuser "
                f"or staff user: {named}{more}. ApiKeyAuthentication logs a key in as its "
                "owner, with all the owner's permissions.",
                hint="Give each key an owner with only the permissions its holder needs (or no "
                "owner: the key then selects its tier only), revoke it, or authenticate keys "
                "with a subclass of ApiKeyAuthentication that sets acts_as_owner = False.",
                id="django_throttle.W020",
            )
        )
    return messages


def _privileged_key(key: Any) -> str:
    owner = key.owner
    kind = "superuser" if getattr(owner, "is_superuser", False) else "staff"
    return f"{key.name!r} ({key.prefix}, owner {owner.get_username()!r}, {kind})"
