"""Create the demo's tiers, endpoint rules and users; running it again changes nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from django_throttle.models import (
    EndpointLimit,
    EndpointRule,
    Protection,
    Tier,
    TierAssignment,
    TierLimit,
)

#: slug → (name, description, priority, default for anonymous, default for authenticated,
#: [(rate, burst, algorithm)]). "2/s" with burst 10 is the reference token bucket: capacity 10,
#: refilling 2 tokens a second.
TIERS: dict[str, tuple[str, str, int, bool, bool, list[tuple[str, int | None, str]]]] = {
    "anonymous": (
        "Anonymous",
        "Clients that are not logged in, counted per IP address.",
        0,
        True,
        False,
        [("2/s", 10, "token_bucket")],
    ),
    "free": (
        "Free",
        "Every logged-in user without an assignment.",
        10,
        False,
        True,
        [("60/min", 60, "token_bucket"), ("1000/day", None, "token_bucket")],
    ),
    # Clients that send an API key (run_demo issues one): counted by key, whatever their address.
    "partner": (
        "Partner",
        "Servers of partners, identified by API key.",
        15,
        False,
        False,
        [("300/min", None, "token_bucket")],
    ),
    # A request of a pro user meets three algorithms at once, still in one Redis call: a token
    # bucket (bursts up to 600), GCRA (no more than 20 a second) and a calendar quota (reset on
    # the 1st of each month, UTC).
    "pro": (
        "Pro",
        "Paying customers.",
        20,
        False,
        False,
        [
            ("600/min", 600, "token_bucket"),
            ("20/s", None, "gcra"),
            ("100000/month", None, "calendar_quota"),
        ],
    ),
}
#: Regional tier limits: slug → [(regions, rate, burst, algorithm)]. Anonymous clients from
#: Brazil (the CF-IPCountry header, believed from the demo's trusted edge: loopback) get a
#: bucket of 5 refilling 1 a second instead of the default 10 refilling 2, on a counter of
#: their own.
REGIONAL_LIMITS: dict[str, list[tuple[str, str, int | None, str]]] = {
    "anonymous": [("BR", "1/s", 5, "token_bucket")],
}
#: Adaptive limits: slug → (load factor %, floor %). Every tier whole (100 %); the floor is
#: what ``manage.py throttle_adapt`` always leaves a tier under overload: anonymous (lowest
#: priority) shrinks first down to 20 %, then free down to 50 %; partner and pro (floor 100)
#: are never shrunk automatically.
LOAD_FACTORS: dict[str, tuple[int, int]] = {
    "anonymous": (100, 20),
    "free": (100, 50),
    "partner": (100, 100),
    "pro": (100, 100),
}
#: Endpoint rules, each matched by its scope (``throttle_scope``), in the order they are
#: seeded: name → (the rule's own fields, [(tier slug, rate, the limit's other fields)]).
RULES: dict[str, tuple[dict[str, Any], list[tuple[str, str, dict[str, Any]]]]] = {
    # Every POST to a view with throttle_scope "export" costs 10 tokens, so free users get two
    # exports in a row, pro users twenty.
    "export": (
        {"methods": "POST", "cost": 10},
        [("free", "20/h", {"burst": 20}), ("pro", "200/h", {"burst": 200})],
    ),
    # A slow streamed export that may run only so many at a time. "1/min" concurrency is one
    # download in flight per user, its slot free again within a minute should the worker die;
    # the free tier's token bucket on the same rule is counted in the same call (and neither is
    # taken when either refuses).
    "export-download": (
        {"methods": "GET", "cost": 1},
        [
            ("free", "1/min", {"algorithm": "concurrency"}),
            ("free", "30/h", {"algorithm": "token_bucket"}),
            ("pro", "3/min", {"algorithm": "concurrency"}),
        ],
    ),
    # GCRA that delays instead of refusing at once (nginx's limit_req with burst and delay).
    # Anonymous callers get 2 a second with a burst of 6: the first 3 of a burst at once, the
    # next 3 each half a second after the one before, the 7th refused; signed-in users the
    # same at 5 a second.
    "search": (
        {"methods": "GET", "cost": 1},
        [
            ("anonymous", "2/s", {"algorithm": "gcra", "burst": 6, "delay": 2, "max_wait": 2.0}),
            ("free", "5/s", {"algorithm": "gcra", "burst": 10, "delay": 4, "max_wait": 2.0}),
            ("pro", "5/s", {"algorithm": "gcra", "burst": 10, "delay": 4, "max_wait": 2.0}),
        ],
    ),
    # Credential rules for anonymous clients, each counting failed attempts only: "login"
    # guards /accounts/login/ and /api/token/ (``protect_credentials``), "admin-login" the
    # admin's login page, "authentication" the API's Basic and Token authentication.
    **{
        scope: (
            {"methods": "", "cost": 1, "counts": EndpointRule.Counts.FAILURES},
            [
                ("anonymous", "5/min", {"counted_by": "ip"}),
                ("anonymous", "10/h", {"counted_by": "username"}),
            ],
        )
        for scope in ("login", "admin-login", "authentication")
    },
}
#: Criticality of the rules (the rest are default): the load shedder refuses sheddable
#: requests first and keeps capacity for the critical ones.
CRITICALITY: dict[str, str] = {
    "export-download": "sheddable",
    "search": "sheddable",
    "login": "critical",
    "admin-login": "critical",
    "authentication": "critical",
}
#: Service protection: the demo serves 20 requests at once; default traffic may take 90 % of
#: that, sheddable traffic 50 %; each worker sheds on its own once its event loop (ASGI) runs
#: 200 ms late.
PROTECTION: dict[str, Any] = {
    "enabled": True,
    "in_flight": 20,
    "default_share": 90,
    "sheddable_share": 50,
    "lease": 60,
    "worker_lag_ms": 200,
}
#: username (= password) → (superuser, tier slug assigned directly or None for the default).
USERS: dict[str, tuple[bool, str | None]] = {
    "admin": (True, None),
    "alice": (False, None),
    "bob": (False, "pro"),
}


class Command(BaseCommand):
    help = (
        "Create the demo tiers (anonymous, free, partner, pro; anonymous limited lower for "
        "region BR; floors for adaptive limits), the 'export', 'export-download', "
        "'search', 'login', 'admin-login' and 'authentication' endpoint rules (downloads and "
        "searches sheddable, logins critical), the service protection (20 requests in flight) "
        "and the users admin/admin, alice/alice (free) and bob/bob (pro). Safe to run again."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        self.changes: Counter[str] = Counter()
        with transaction.atomic():
            tiers = self._seed_tiers()
            self._seed_rules(tiers)
            self._seed_protection()
            self._seed_users(tiers)
        summary = ", ".join(f"{n} {what}" for what, n in sorted(self.changes.items()))
        self.stdout.write(self.style.SUCCESS(f"Demo data ready ({summary})."))

    def _seed_tiers(self) -> dict[str, Tier]:
        tiers: dict[str, Tier] = {}
        for slug, (name, description, priority, anonymous, authenticated, limits) in TIERS.items():
            # At most one tier may be each kind of default; hand the flag over to ours.
            for flag, wanted in (
                ("is_default_anonymous", anonymous),
                ("is_default_authenticated", authenticated),
            ):
                if wanted:
                    Tier.objects.filter(**{flag: True}).exclude(slug=slug).update(**{flag: False})
            load_factor, min_factor = LOAD_FACTORS[slug]
            tiers[slug] = tier = self._upsert(
                Tier,
                {"slug": slug},
                name=name,
                description=description,
                priority=priority,
                is_default_anonymous=anonymous,
                is_default_authenticated=authenticated,
                load_factor=load_factor,
                min_factor=min_factor,
            )
            # The default rows (regions empty), then the regional ones.
            for regions, rate, burst, algorithm in [
                *(("", rate, burst, algorithm) for rate, burst, algorithm in limits),
                *REGIONAL_LIMITS.get(slug, []),
            ]:
                self._upsert(
                    TierLimit,
                    {"tier": tier, "rate": rate, "regions": regions},
                    burst=burst,
                    algorithm=algorithm,
                    timezone="UTC" if algorithm == "calendar_quota" else "",
                )
        return tiers

    def _seed_rules(self, tiers: dict[str, Tier]) -> None:
        for name, (fields, limits) in RULES.items():
            rule = self._upsert(
                EndpointRule,
                {"name": name},
                match_type=EndpointRule.MatchType.SCOPE,
                pattern=name,
                enabled=True,
                shadow=False,
                **fields,
            )
            for slug, rate, values in limits:
                self._upsert(
                    EndpointLimit, {"rule": rule, "tier": tiers[slug], "rate": rate}, **values
                )

    def _seed_protection(self) -> None:
        """The rules' criticality and the one Service protection row."""
        for name, criticality in CRITICALITY.items():
            self._upsert(EndpointRule, {"name": name}, criticality=criticality)
        first = Protection.objects.order_by("pk").first()
        self._upsert(Protection, {"pk": first.pk if first is not None else 1}, **PROTECTION)

    def _seed_users(self, tiers: dict[str, Tier]) -> None:
        User = get_user_model()
        for username, (superuser, tier_slug) in USERS.items():
            user = self._upsert(
                User,
                {"username": username},
                email=f"{username}@example.com",
                is_staff=superuser,
                is_superuser=superuser,
                is_active=True,
            )
            if not user.check_password(username):
                user.set_password(username)
                user.save(update_fields=["password"])
                self.changes["passwords set"] += 1
            if tier_slug is not None:
                self._upsert(TierAssignment, {"user": user}, tier=tiers[tier_slug])

    def _upsert(self, model: type[Any], lookup: dict[str, Any], **values: Any) -> Any:
        """Like ``update_or_create``, but saves only when a value differs, so a rerun writes
        nothing (and does not make every process reload the policy)."""
        obj, created = model.objects.get_or_create(**lookup, defaults=values)
        if created:
            self.changes["created"] += 1
            return obj
        changed = [name for name, value in values.items() if getattr(obj, name) != value]
        if changed:
            for name in changed:
                setattr(obj, name, values[name])
            obj.save(update_fields=changed)
            self.changes["updated"] += 1
        else:
            self.changes["unchanged"] += 1
        return obj
