"""Shipped translations: what a client reads in a 429 and what an operator reads in the admin,
in German and French, chosen per request by Django's LocaleMiddleware."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.factories import tier

pytestmark = pytest.mark.django_db


@pytest.fixture
def localized(settings: Any) -> None:
    middleware = list(settings.MIDDLEWARE)
    middleware.insert(
        middleware.index("django.middleware.common.CommonMiddleware"),
        "django.middleware.locale.LocaleMiddleware",
    )
    settings.MIDDLEWARE = middleware
    settings.LANGUAGES = [("en", "English"), ("de", "Deutsch"), ("fr", "Français")]


@pytest.mark.parametrize(
    ("language", "detail"),
    [
        ("de", "Die Anfrage wurde gedrosselt. Voraussichtlich wieder verfügbar in"),
        ("fr", "Requête ralentie. Disponible à nouveau dans"),
        ("en", "Request was throttled. Expected available in"),
    ],
)
def test_the_429_body_speaks_the_clients_language(
    client: Any, localized: None, language: str, detail: str
) -> None:
    for _ in range(2):
        response = client.get("/hello/", HTTP_ACCEPT_LANGUAGE=language)
    for _ in range(5):
        response = client.get("/hello/", HTTP_ACCEPT_LANGUAGE=language)
    assert response.status_code == 429
    assert response.json()["detail"].startswith(detail)


@pytest.mark.parametrize(
    ("language", "title"), [("de", "Einen Client untersuchen"), ("fr", "Inspecter un client")]
)
def test_the_admin_pages_are_translated(
    client: Any, localized: None, language: str, title: str
) -> None:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    tier("anonymous", "5/h", is_default_anonymous=True)
    html = client.get(
        "/admin/django_throttle/usagecount/inspect/", HTTP_ACCEPT_LANGUAGE=language
    ).content.decode()
    assert title in html


def translations(po: str) -> list[tuple[str, list[str]]]:
    """(msgid, its msgstr values) for each entry of a .po file, continuation lines joined."""
    entries = []
    for block in po.split("\n\n"):
        fields = _fields(block)
        if fields.get("msgid"):
            entries.append(
                (fields["msgid"], [v for k, v in fields.items() if k.startswith("msgstr")])
            )
    return entries


def test_every_message_is_translated_in_both_catalogues() -> None:
    from pathlib import Path

    import django_throttle

    root = Path(django_throttle.__file__).parent / "locale"
    for language in ("de", "fr"):
        po = (root / language / "LC_MESSAGES" / "django.po").read_text(encoding="utf-8")
        assert (root / language / "LC_MESSAGES" / "django.mo").exists()
        assert "#, fuzzy" not in po
        entries = translations(po)
        assert len(entries) > 150
        untranslated = [msgid for msgid, values in entries if not values or not all(values)]
        assert untranslated == [], f"{language}: untranslated: {untranslated[:5]}"


def catalogued(language: str) -> set[str]:
    """The msgids of the package's catalogue for ``language``, unescaped."""
    from pathlib import Path

    import django_throttle

    po = Path(django_throttle.__file__).parent / "locale" / language / "LC_MESSAGES" / "django.po"
    entries = translations(po.read_text("utf-8"))
    return {msgid.replace('\\"', '"').replace("\\n", "\n") for msgid, _ in entries}


def test_every_message_the_code_marks_is_in_both_catalogues() -> None:
    """Each literal the package passes to ``gettext`` (``_``, ``gettext_lazy``, ...) has an
    entry in both catalogues: an operator reading the admin in German or French never meets
    a message that was added in English only (the inspector's field errors, the warning
    after a policy edit Redis could not publish)."""
    import ast
    from pathlib import Path

    import django_throttle

    root = Path(django_throttle.__file__).parent
    marks = {"_", "gettext", "gettext_lazy", "pgettext", "pgettext_lazy"}
    marked: set[str] = set()
    for source in root.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args:
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                text = node.args[-1] if name.startswith("pgettext") else node.args[0]
                if name in marks and isinstance(text, ast.Constant):
                    marked.add(str(text.value))
    assert len(marked) > 50
    for language in ("de", "fr"):
        # Missing although makemessages ran? xgettext does not read a gettext call inside an
        # f-string's braces: take it out of the f-string.
        assert sorted(marked - catalogued(language)) == [], language


def test_every_message_the_templates_mark_is_in_both_catalogues() -> None:
    """The same for the templates: each ``{% translate "..." %}`` literal, and each
    ``{% blocktranslate %}`` text as makemessages writes its msgid (``{{ n }}`` becomes
    ``%(n)s``, a literal ``%`` becomes ``%%``; with ``count``, the singular)."""
    import re
    from pathlib import Path

    import django_throttle

    root = Path(django_throttle.__file__).parent / "templates"
    translate = re.compile(r"""{%\s*trans(?:late)?\s+(["'])(.*?)\1""")
    block = re.compile(
        r"{%\s*blocktrans(?:late)?\b(.*?)%}(.*?){%\s*(?:plural|endblocktrans(?:late)?)\s*%}",
        re.DOTALL,
    )
    marked: set[str] = set()
    for template in root.rglob("*.html"):
        html = template.read_text(encoding="utf-8")
        marked.update(text for _quote, text in translate.findall(html))
        for options, text in block.findall(html):
            if "trimmed" in options.split():
                text = " ".join(line.strip() for line in text.splitlines() if line.strip())
            marked.add(re.sub(r"{{\s*(\w+)\s*}}", r"%(\1)s", text.replace("%", "%%")))
    assert len(marked) > 50
    for language in ("de", "fr"):
        assert sorted(marked - catalogued(language)) == [], language


@pytest.mark.parametrize(
    ("language", "verdict"),
    [
        ("de", "sein Fehlermodus, da Redis nicht antworten kann — local: in diesem Prozess"),
        ("fr", "son mode de défaillance, Redis ne pouvant répondre — local : comptée dans"),
    ],
)
def test_with_redis_down_the_explained_failure_mode_is_translated(
    client: Any, localized: None, settings: Any, language: str, verdict: str
) -> None:
    """Down, the inspector's explained request says the failure mode it meets in the
    operator's language."""
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    tier("anonymous", "5/h", is_default_anonymous=True)
    settings.DJANGO_THROTTLE_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens
    html = client.get(
        "/admin/django_throttle/usagecount/inspect/",
        {"client": "203.0.113.9", "path": "/api/ping/"},
        HTTP_ACCEPT_LANGUAGE=language,
    ).content.decode()
    assert verdict in html


def test_the_compiled_catalogues_hold_every_message_of_their_sources() -> None:
    """Each ``django.mo`` answers every message of its ``django.po`` as the ``.po`` says: a
    merge that keeps one side's compiled file, or a ``compilemessages`` that found the ``.mo``
    newer than its source, ships messages the site never translates."""
    import gettext
    from pathlib import Path

    import django_throttle

    def unescape(text: str) -> str:
        return text.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")

    root = Path(django_throttle.__file__).parent / "locale"
    for language in ("de", "fr"):
        folder = root / language / "LC_MESSAGES"
        with (folder / "django.mo").open("rb") as compiled:
            catalogue = gettext.GNUTranslations(compiled)
        po = (folder / "django.po").read_text(encoding="utf-8")
        stale = []
        for block in po.split("\n\n"):
            fields = _fields(block)
            if "msgid_plural" in fields or not fields.get("msgid"):
                continue
            msgid, msgstr = unescape(fields["msgid"]), unescape(fields["msgstr"])
            if "msgctxt" in fields:
                found = catalogue.pgettext(unescape(fields["msgctxt"]), msgid)
            else:
                found = catalogue.gettext(msgid)
            if found != msgstr:
                stale.append(msgid)
        assert stale == [], f"{language}: django.mo lacks {len(stale)}: {stale[:3]}"


def _fields(block: str) -> dict[str, str]:
    """The fields of one .po entry (msgctxt, msgid, msgstr...), continuation lines joined."""
    fields: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith('"'):
            if current is not None:
                fields[current] += line[1:-1]
            continue
        current, _, value = line.partition(" ")
        fields[current] = value[1:-1]
    return fields
