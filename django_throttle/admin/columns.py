"""What the admin's lists show in a column, in a word: a failure mode, a counting policy, a
match type, and a usage row's client by name with a link to its user or API key.

The change pages keep the long explanations (choice labels and help texts); a list repeats a
value on every row, so there it is one word, and the list keeps to the window's width.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.urls import NoReverseMatch, reverse
from django.utils.translation import pgettext_lazy

if TYPE_CHECKING:
    from django.contrib import admin
    from django.db.models import Model

__all__ = ["attach_client_links", "counts_word", "failure_mode_word", "match_word"]

# By stored value (the choices of :mod:`django_throttle.models`); a value written around the
# admin is shown as it is. The context "admin list" keeps these words ("open", "all")
# translated apart from the same words elsewhere.
_FAILURE_MODES: dict[str, Any] = {
    "": pgettext_lazy("admin list", "inherit"),
    "open": pgettext_lazy("admin list", "open"),
    "closed": pgettext_lazy("admin list", "closed"),
    "local": pgettext_lazy("admin list", "local"),
}
_COUNTS: dict[str, Any] = {
    "all": pgettext_lazy("admin list", "all"),
    "success": pgettext_lazy("admin list", "successes"),
    "failures": pgettext_lazy("admin list", "failures"),
}
_MATCH_TYPES: dict[str, Any] = {
    "scope": pgettext_lazy("admin list", "scope"),
    "route": pgettext_lazy("admin list", "route"),
    "path": pgettext_lazy("admin list", "path"),
}


def failure_mode_word(value: str) -> str:
    return str(_FAILURE_MODES.get(value, value))


def counts_word(value: str) -> str:
    return str(_COUNTS.get(value, value))


def match_word(value: str) -> str:
    return str(_MATCH_TYPES.get(value, value))


def attach_client_links(site: admin.AdminSite, rows: Iterable[Any]) -> None:
    """Set ``throttle_client_link`` (name, admin URL or ``None``) on rows counting a user
    (``user:<pk>``) or an API key (``key:<prefix>``) that still exists."""
    from django.contrib.auth import get_user_model

    from django_throttle.models import ApiKey

    rows = list(rows)
    wanted: dict[str, set[str]] = {"user": set(), "key": set()}
    for row in rows:
        kind, _sep, value = row.client.partition(":")
        if kind in wanted and value:
            wanted[kind].add(value)
    user_model = get_user_model()
    found: dict[tuple[str, str], tuple[str, Model]] = {}
    user_pks = [pk for pk in wanted["user"] if pk.isdigit()]
    for user in user_model._default_manager.filter(pk__in=user_pks):
        found["user", str(user.pk)] = (user.get_username(), user)
    for api_key in ApiKey.objects.filter(prefix__in=wanted["key"]):
        found["key", api_key.prefix] = (api_key.name, api_key)
    for row in rows:
        kind, _sep, value = row.client.partition(":")
        if (kind, value) not in found:
            continue
        name, target = found[kind, value]
        url = None
        if site.is_registered(type(target)):
            meta = target._meta
            try:
                url = reverse(
                    f"{site.name}:{meta.app_label}_{meta.model_name}_change", args=[target.pk]
                )
            except NoReverseMatch:
                url = None
        row.throttle_client_link = (name, url)
