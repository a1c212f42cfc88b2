"""Who a usage client label is, for the operator tools; and presented usernames kept private.

A usage report lists client labels as the backend counted them: ``user:2``, ``key:k_7f3a``,
``ip:203.0.113.7``, ``username:alice`` (a credential rule's counter by username). The
dashboard and ``manage.py throttle_usage`` show who that is (:func:`client_names`: the
username of ``user:2``, the name of an API key, and the admin page of either), in one query
per kind of label for all the rows shown, never one per row.

A username presented at a failed login is often a password typed in the wrong field, so it
is never shown or kept as typed unless it names an existing user (:func:`private_labels`):
any other ``username:`` label becomes ``username:#<digest>``, a keyed digest (HMAC with
``SECRET_KEY``, so a dictionary of common passwords cannot reverse it) that still tells one
presented name from another. The rollup stores only those, and reports read from the
backend show only those.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.db.models.functions import Lower
from django.urls import NoReverseMatch, reverse
from django.utils.crypto import salted_hmac
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_throttle.redaction import plain_text

#: Label prefix of a counter by presented username (``Identity("username", …).key``).
USERNAME = "username:"
#: Marks a digested username: ``username:#<hex>``.
DIGEST_MARK = "#"
_SALT = "django_throttle.usage.names.username"
#: The client that absorbs new ones while counts wait in a process (``accounting.OTHER``).
OTHER = "(other)"
#: Labels per database query (each costs two query parameters for usernames).
QUERY_BATCH = 250


@dataclass(frozen=True, slots=True)
class ClientName:
    """What to show for one client label: ``label`` as plain text (control characters
    removed; what ``throttle_inspect`` accepts), ``name`` the user's username or the API
    key's name (``""`` when the label names neither), ``url`` the admin page of that
    user or key (``""`` when there is none, or the admin does not register the model), and
    ``words`` what the client is, in words (:func:`describe`: "User alice", "Username at
    login: alice"), so a user's requests and the logins tried with their name read as the
    two different counters they are."""

    label: str
    name: str = ""
    url: str = ""
    words: str = ""


#: Label kind → how :func:`describe` names it, before the value.
KINDS = {
    "user": _("User"),
    "key": _("API key"),
    "ip": _("Address"),
    "username": _("Username at login:"),
    "device": _("Device"),
}
#: Longest value :func:`describe` shows whole; longer ones end with "…" (the label, in full,
#: is what the inspector takes).
SHOWN = 60


def describe(label: str, name: str = "") -> str:
    """``label`` (a usage client label) in words, as plain text: "User alice" (``user:2``,
    ``name`` the username), "API key dt_ab12… (partner feed)", "Address 127.0.0.1",
    "Username at login: alice", "Username at login: not a user (#1a2b3c4d)" (a digest);
    "User 999 (no such user)" when the label names no row; a label of another kind as it
    is. Plain text: the caller escapes it."""
    kind, colon, value = label.partition(":")
    value, name = plain_text(value), plain_text(name)
    if label == OTHER:
        return gettext("Other clients (counted together)")
    if kind == "unknown" and colon:
        return gettext("Unidentified address")
    if not colon:  # "<kind>#<digest>": a value too long to keep, or one of odd bytes
        for sep in ("#", "\x00", "\ufffd"):  # the rollup stores NUL as U+FFFD
            head, found, rest = label.partition(sep)
            if found and head in KINDS:
                digest = gettext("(long value, digest %s…)") % rest[:8]  # not in the f-string
                return f"{KINDS[head]} {digest}"
        return plain_text(label)
    if kind not in KINDS:
        return plain_text(label)
    shown = value if len(value) <= SHOWN else value[: SHOWN - 1] + "…"
    if kind == "user":
        return f"{KINDS[kind]} {name}" if name else gettext("User %s (no such user)") % shown
    if kind == "key":
        if not name:
            return gettext("API key %s… (no such key)") % shown
        return f"{KINDS[kind]} {shown}…" + ("" if name == value else f" ({name})")
    if kind == "username":
        if value.startswith(DIGEST_MARK):
            return gettext("Username at login: not a user (%s)") % value[:9]
        if not value:
            return gettext("Username at login: unreadable")
        return f"{KINDS[kind]} {name or shown}"
    return f"{KINDS[kind]} {shown}"


def username_digest(value: str) -> str:
    """``username:#<16 hex digits>`` for a presented username: keyed, stable while
    ``SECRET_KEY`` is, distinct for distinct names (64 bits)."""
    return USERNAME + DIGEST_MARK + salted_hmac(_SALT, value, algorithm="sha256").hexdigest()[:16]


def private_labels(labels: Iterable[str]) -> dict[str, str]:
    """Each ``username:`` label of ``labels`` → what may be kept and shown: the label itself
    when it names an existing user (the username field matched as typed, case-folded or
    NFKC-normalised), else :func:`username_digest`. Other labels are left out (they are
    kept as they are). One query per :data:`QUERY_BATCH` usernames."""
    presented = {
        label: label[len(USERNAME) :]
        for label in labels
        if label.startswith(USERNAME) and not label.startswith(USERNAME + DIGEST_MARK)
    }
    known = _users_by_username(set(presented.values()))
    return {
        label: label if value in known else username_digest(value)
        for label, value in presented.items()
    }


def client_names(labels: Iterable[str]) -> dict[str, ClientName]:
    """A :class:`ClientName` for each label: users and API keys looked up in one query per
    kind (never one per row); anything else is its plain label."""
    labels = list(dict.fromkeys(labels))
    users = _users({label[5:] for label in labels if label.startswith("user:")})
    keys = _keys({label[4:] for label in labels if label.startswith("key:")})
    named = _users_by_username(
        {label[len(USERNAME) :] for label in labels if label.startswith(USERNAME)}
    )
    result: dict[str, ClientName] = {}
    for label in labels:
        kind, _, value = label.partition(":")
        found = {"user": users, "key": keys, "username": named}.get(kind, {}).get(value)
        name, url = found if found is not None else ("", "")
        result[label] = ClientName(plain_text(label), plain_text(name), url, describe(label, name))
    return result


def _admin_url(model: Any, pk: Any) -> str:
    meta = model._meta
    try:
        return reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[pk])
    except NoReverseMatch:
        return ""


def _batches(values: Iterable[Any]) -> Iterator[list[Any]]:
    """``values`` sorted, in lists of at most :data:`QUERY_BATCH` (one query each)."""
    ordered = sorted(values)
    return (ordered[at : at + QUERY_BATCH] for at in range(0, len(ordered), QUERY_BATCH))


def _users(pks: set[str]) -> dict[str, tuple[str, str]]:
    """``str(pk)`` → (username, admin URL) of the users that exist."""
    model = get_user_model()
    valid = []
    for text in pks:
        try:
            valid.append(model._meta.pk.to_python(text))
        except (ValidationError, ValueError, TypeError):
            continue  # not a pk of this model: shown as its label
    return {
        str(user.pk): (user.get_username(), _admin_url(model, user.pk))
        for batch in _batches(valid)
        for user in model._default_manager.filter(pk__in=batch)
    }


def _users_by_username(values: set[str]) -> dict[str, tuple[str, str]]:
    """A presented username → (username, admin URL) of the user it names: the username
    field matched as typed, case-folded or NFKC-normalised and case-folded."""
    values = {value for value in values if not value.startswith(DIGEST_MARK)}
    model = get_user_model()
    field = getattr(model, "USERNAME_FIELD", "username")
    found: dict[str, tuple[str, str]] = {}
    for batch in _batches(values):
        folded = sorted({value.casefold() for value in batch})
        users = model._default_manager.annotate(folded_username=Lower(field)).filter(
            Q(**{f"{field}__in": batch}) | Q(folded_username__in=folded)
        )
        for user in users:
            name = user.get_username()
            entry = (name, _admin_url(model, user.pk))
            for spelling in (name, name.casefold(), unicodedata.normalize("NFKC", name).casefold()):
                if spelling in values:
                    found.setdefault(spelling, entry)
    return found


def _keys(prefixes: set[str]) -> dict[str, tuple[str, str]]:
    """A key prefix → (the key's name, admin URL) of the API keys that exist."""
    from django_throttle.models import ApiKey

    longest = ApiKey._meta.get_field("prefix").max_length or 0
    wanted = (p for p in prefixes if len(p) <= longest and "\x00" not in p)
    return {
        prefix: (name or prefix, _admin_url(ApiKey, pk))
        for batch in _batches(wanted)
        for pk, prefix, name in ApiKey.objects.filter(prefix__in=batch).values_list(
            "pk", "prefix", "name"
        )
    }
