"""Naming a client as an operator types it, and saying which tier it is in and why, in
words: the first step of ``throttle_inspect``, ``throttle_explain``, ``throttle_reset`` and
the admin's inspector.

Every label a page, command or report shows is accepted as it is shown (an operator copies
it from the dashboard, the usage list or the docs): ``user:<username or id>``,
``key:<prefix>`` (also ``key:dt_<prefix>``, the whole key, or ``<prefix>…`` as the admin
writes a key), ``ip:<address or IPv6 /64 network>``, ``username:<name>``,
``username:#<digest>`` (a presented username kept private), ``username#<hex>`` (a long
one's counter), ``device:<id>``; the labels the tools print (``user alice``, ``API key
ab12cd34 (ci)``, ``IP 203.0.113.7``), a name followed by its label in brackets
(``alice (user:2)``), and a bare username, address or API key.

Off the request path: these query the database (the user, the API key, the assignments that
say *why* a client is in a tier); the tier itself comes from the compiled snapshot requests use.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _

from django_throttle.identity import KEY_SCHEME, MAX_KEY_BYTES, Identity, client_ip, key_prefix
from django_throttle.policy.live import Policy, TierPolicy
from django_throttle.redaction import plain_text

#: What the commands' help says a client may be written as.
CLIENT_HELP = (
    "any label the dashboard, usage list or a report shows (user:<name|id>, key:<prefix>, "
    "ip:<address>, username:<name>, username:#<digest>, device:<id>), or a bare username, "
    "address or API key"
)


class UnknownClient(ValueError):
    """The text names no user, API key or IP address; the message says what was tried."""


@dataclass(frozen=True)
class Subject:
    """A client as the limiter counts it, and how to name it to a person. ``address`` is
    the address an IP client was named by (its requests come from it)."""

    identity: Identity
    label: str
    user: Any = None
    api_key: Any = None
    address: str | None = None
    #: For a counter by presented username (or a device's): the backend's label of that
    #: counter, and the username when it is known (``None`` for a long name's digest).
    counter: str = ""
    username: str | None = None

    def __post_init__(self) -> None:
        # Shown on pages and in commands: a name that differs from another by a character
        # that shows nothing is written so it never looks like it (see redaction.plain_text).
        object.__setattr__(self, "label", plain_text(self.label))

    @property
    def client(self) -> str:
        return self.counter or self.identity.key

    @property
    def by_username(self) -> bool:
        """A login counter by presented username or by device, not a client."""
        return bool(self.counter)


# --- naming a client ------------------------------------------------------------------------


#: How the tools write a subject (``Subject.label``), and what each names.
_WORDS = (("API key ", "key"), ("username ", "username"), ("user ", "user"), ("IP ", "ip"))
#: ``name (kind:value)``: a name shown with its label.
_BRACKETED = re.compile(r"^.*\((?P<label>[a-z]+[:#].+)\)$", re.DOTALL)


def parse_client(text: str) -> Subject:
    """Read any label a page, command or report shows (see the module docstring), or a bare
    username, address or API key. Raises :class:`UnknownClient` saying what was tried."""
    text = (text or "").strip()
    if not text:
        raise UnknownClient(_("none was named (a username, an IP address or an API key)"))
    if "\0" in text or not _is_unicode(text):  # no database stores either: a clear error
        raise UnknownClient(
            _("%(value)r holds a NUL or bytes that are not UTF-8: no client is named so")
            % {"value": text}
        )
    # A label's own kind comes first: "user:<name>" names that user even when the name ends
    # like a bracketed label ("mallory (user:1)" would otherwise name user 1).
    bracketed = None if _KIND.match(text) else _BRACKETED.match(text)
    if bracketed is not None and _KIND.match(bracketed["label"]):
        text = bracketed["label"].strip()
    for word, kind in _WORDS:
        if text.startswith(word) and not _KIND.match(text):
            value = text[len(word) :].strip()
            if kind == "key":
                value = value.split(" (", 1)[0]  # "API key ab12cd34 (its name)"
            text = f"{kind}:{value}"
            break
    kind, sep, value = text.partition(":")
    if sep and kind in _PARSERS:
        return _PARSERS[kind](value.strip())
    if text.startswith("username#"):  # a long username's counter, as the backend labels it
        return _counter(text)
    if _is_address(text):
        return _address(text)
    try:
        return _user(text)
    except UnknownClient:
        try:  # a key (whole, dt_<prefix>, or as the admin writes it: "ci (ab12cd34…)")
            return _api_key(text.split(" (", 1)[-1].removesuffix(")") if text else text)
        except UnknownClient:
            pass
        raise


def _is_unicode(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: a command line's bytes that are not UTF-8 arrive
    as lone surrogates (``surrogateescape``), which no database query takes."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _user(value: str) -> Subject:
    model = get_user_model()
    user = None
    # as typed, then NFKC-normalised as Django stores and signs in a username (full-width
    # "\uff42\uff4f\uff42" is bob)
    for name in dict.fromkeys((value, unicodedata.normalize("NFKC", value))):
        user = model._default_manager.filter(**{model.USERNAME_FIELD: name}).first()
        if user is not None:
            break
    if user is None:
        try:  # an id as the model's primary key reads it: 42, or a UUID; "²" is no id
            pk = model._meta.pk.to_python(value)
        except (ValidationError, ValueError, TypeError):
            pk = None
        if pk is not None:
            user = model._default_manager.filter(pk=pk).first()
    if user is None:
        raise UnknownClient(_("no user with the username or id %(value)r") % {"value": value})
    return Subject(
        Identity("user", str(user.pk), user_id=user.pk), f"user {user.get_username()}", user=user
    )


def _api_key_row(prefix: str) -> Any:
    from django_throttle.models import ApiKey

    return ApiKey.objects.filter(prefix=prefix).select_related("tier").first()


def _api_key(value: str) -> Subject:
    value = value.rstrip("…").removesuffix("...")  # the admin writes "name (ab12cd34…)"
    shown = value.removeprefix(f"{KEY_SCHEME}_").rstrip("_")  # dt_ab12cd34: no secret
    row = _api_key_row(value) or _api_key_row(key_prefix(value)) or _api_key_row(shown)
    if row is None:
        raise UnknownClient(_("no API key with the prefix %(value)r") % {"value": value})
    return Subject(Identity("key", row.prefix), f"API key {row.prefix} ({row.name})", api_key=row)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_network(text.split("%", 1)[0], strict=False)
    except ValueError:
        return False
    return True


def _address(value: str) -> Subject:
    """The address's network as requests from it are counted (IPv6 by prefix, IPv4-mapped
    unwrapped): ``2001:db8::1`` and ``2001:db8::2`` are one client under a /64."""
    network = client_ip({"REMOTE_ADDR": value.split("/", 1)[0]}) if value else None
    if network is None:
        raise UnknownClient(_("%(value)r is not an IP address") % {"value": value})
    return Subject(Identity("ip", network), f"IP {network}", address=value.split("/", 1)[0])


def _username(value: str) -> Subject:
    """A counter by presented username: ``username:<name>`` (normalised as the request path
    counts it), ``username:#<digest>`` (the private label of one the usage counts saw), and
    ``username:#<32 hex>``, the counter of a name too long to keep, as the tools show it."""
    from django_throttle.request.usernames import LONG_NAME, normalise_username
    from django_throttle.usage.names import DIGEST_MARK, USERNAME

    if value.startswith(DIGEST_MARK) and not LONG_NAME.fullmatch(value):
        name = presented_username(USERNAME + value)
        if name is None:
            raise UnknownClient(
                _(
                    "no recent login presented the username of %(value)r (a digest names only "
                    "a username the usage counts still hold)"
                )
                % {"value": USERNAME + value}
            )
    else:
        name = normalise_username(value)
    if not name:
        raise UnknownClient(_("a username is needed after 'username:'"))
    identity = Identity("username", name)
    return Subject(identity, f"username {name}", counter=identity.key, username=name)


def _counter(label: str) -> Subject:
    """A counter known by its backend label only: a device's (``device:<id>``), or a long
    username's digest (``username#<hex>``)."""
    kind, _sep, value = label.replace("#", ":#", 1).partition(":")
    if not value or len(label.encode()) > MAX_KEY_BYTES or "\0" in label:
        raise UnknownClient(_("%(value)r is not a counter label") % {"value": label})
    words = _("device") if kind == "device" else _("username")
    return Subject(Identity(kind, value), f"{words} {value}", counter=label)


def _device(value: str) -> Subject:
    return _counter(f"device:{value}")


_PARSERS = {
    "user": _user,
    "key": _api_key,
    "ip": _address,
    "username": _username,
    "device": _device,
}
#: Text that starts with a label's kind (so ``user alice:x`` is not read as one).
_KIND = re.compile(r"^(?:user|key|ip|username|device)(?::|#)")


def tier_and_reason(subject: Subject, snapshot: Policy) -> tuple[TierPolicy | None, str]:
    """The client's tier as requests see it, and why, in words."""
    if subject.by_username:
        return None, _(
            "a login counter: every login presenting this username is counted here, under "
            "the rules that count by username, whoever sends it"
        )
    tier = snapshot.tier_for(subject.identity)
    name = f"'{tier.slug}'" if tier is not None else _("none")
    if subject.api_key is not None:
        if subject.identity.value not in snapshot.api_keys:
            return tier, _("the API key is revoked or expired: counted as anonymous (%(tier)s)") % {
                "tier": name
            }
        return tier, _("the API key's own tier (%(tier)s)") % {"tier": name}
    if subject.user is not None:
        from django_throttle.models import TierAssignment

        if tier is None:
            return None, _("no default tier for authenticated users: not limited")
        assigned = TierAssignment.objects.filter(tier_id=tier.id)
        if assigned.filter(user=subject.user).exists():
            return tier, _("assigned to %(tier)s directly") % {"tier": name}
        groups = subject.user.groups.all()
        group = assigned.filter(group__in=groups).select_related("group").first()
        if group is not None:
            return tier, _("member of group '%(group)s', assigned to %(tier)s") % {
                "group": group.group,
                "tier": name,
            }
        return tier, _("the default tier for authenticated users (%(tier)s)") % {"tier": name}
    if tier is None:
        return None, _("no default tier for anonymous clients: not limited")
    return tier, _("the default tier for anonymous clients (%(tier)s)") % {"tier": name}


def presented_username(label: str) -> str | None:
    """The username behind a ``username:#<digest>`` label (as the request path counts it),
    found among the presented usernames the backend's usage counts still hold (the rollup
    keeps only digests); ``None`` when none of them has that digest. For the operator tools,
    which must find the counter a report's row names. Raises ``BackendError``."""
    from django_throttle.usage import accounting
    from django_throttle.usage.names import DIGEST_MARK, USERNAME, username_digest
    from django_throttle.usage.reports import kept_minutes

    with closing(accounting.get_store()) as store:
        now = store.now_minute()
        minutes = store.read(range(now - kept_minutes() + 1, now + 1), totals=False, clients=True)
    for counts in minutes.values():
        for client in counts.clients:
            if (
                client.startswith(USERNAME)
                and not client.startswith(USERNAME + DIGEST_MARK)
                and username_digest(client[len(USERNAME) :]) == label
            ):
                return client[len(USERNAME) :]
    return None
