"""The limiter keys on what the authenticator authenticates: for every entry point a login can
come through (Django's login form, DRF's token endpoint as a form and as JSON, in UTF-8 or a
declared Latin-1, and DRF's Basic authentication), the username counter the limiter computes
for a request is the counter of the username the authenticator then passes to
``authenticate()``, whatever whitespace, compatibility characters, case or length it was
spelled with.

The authenticator's name is caught where it leaves the authenticator: Django's
``user_login_failed`` signal carries the credentials ``authenticate()`` was given.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import re
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.test import RequestFactory
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from rest_framework.authentication import BasicAuthentication
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from django_throttle.identity import MAX_KEY_BYTES, Identity
from django_throttle.request.usernames import (
    MAX_DECOMPOSED,
    MAX_NON_STARTERS,
    MAX_READ,
    MAX_USERNAME,
    OVERLONG,
    normalise_username,
    username_counters,
)

pytestmark = pytest.mark.django_db

#: Every character ``str.strip`` removes (what Django's and DRF's ``CharField`` strip).
WHITESPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())
#: Compatibility spellings NFKC folds, letters case-folding changes, and both at once.
SPECIAL = "ｂｆ１ＡＢ𝐛𝐟𝟏ﬁﬂßẞΣσςİıǅⅨ①㎏ﹽ﹉ͅ"

#: Repeats of the padding: none, a little, and past every bound (MAX_USERNAME, the old
#: 1,024-character cut, 4,096).
REPEATS = [0, 1, 3, MAX_USERNAME + 1, 1_025, 4_097]

usernames = st.builds(
    lambda left, n, core, right, m, case: (left * n) + case(core) + (right * m),
    st.text(alphabet=WHITESPACE, min_size=1, max_size=4),
    st.sampled_from(REPEATS),
    st.text(
        alphabet=st.one_of(
            st.sampled_from(SPECIAL), st.characters(codec="utf-8", exclude_characters=":\0")
        ),
        min_size=1,
        max_size=12,
    )
    .filter(str.strip)  # a blank name: no authenticator checks it
    .map(lambda core: core * 40 if len(core) % 5 == 0 else core),  # some past MAX_USERNAME
    st.text(alphabet=WHITESPACE, min_size=1, max_size=4),
    st.sampled_from(REPEATS),
    st.sampled_from([str, str.upper, str.lower, str.swapcase, str.title]),
)


@pytest.fixture
def authenticated() -> Iterator[list[str]]:
    """The usernames ``authenticate()`` was called with (every call fails: no user exists)."""
    names: list[str] = []

    def caught(sender: Any, credentials: dict[str, Any], **kwargs: Any) -> None:
        names.append(credentials["username"])

    user_login_failed.connect(caught)
    yield names
    user_login_failed.disconnect(caught)


factory = RequestFactory()


def form_login(name: str) -> Any:
    request = factory.post("/login/", {"username": name, "password": "x"})
    return request, lambda: AuthenticationForm(request, data=request.POST).is_valid()


def token_form(name: str) -> Any:
    request = factory.post("/token/", {"username": name, "password": "x"})
    return request, lambda: obtain_auth_token(request)


def token_json(name: str) -> Any:
    body = json.dumps({"username": name, "password": "x"}, ensure_ascii=False)
    request = factory.post("/token/", body, content_type="application/json")
    return request, lambda: obtain_auth_token(request)


def token_latin1(name: str) -> Any:
    """A Latin-1 body where the name allows, else JSON's escapes (ASCII, still Latin-1)."""
    data = {"username": name, "password": "x"}
    try:
        json.dumps(data, ensure_ascii=False).encode("latin-1")
        body = json.dumps(data, ensure_ascii=False)
    except UnicodeEncodeError:
        body = json.dumps(data)
    request = factory.post("/token/", body, content_type="application/json; charset=latin-1")
    return request, lambda: obtain_auth_token(request)


def basic(name: str) -> Any:
    header = "Basic " + base64.b64encode(f"{name}:x".encode()).decode()
    request = factory.get("/basic/", HTTP_AUTHORIZATION=header)

    def check() -> None:
        with contextlib.suppress(AuthenticationFailed):  # no such user: it fails
            BasicAuthentication().authenticate(Request(request))

    return request, check


ENTRY_POINTS: dict[str, Callable[[str], Any]] = {
    "form login": form_login,
    "token form": token_form,
    "token json": token_json,
    "token latin-1 json": token_latin1,
    "basic": basic,
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=usernames)
@example(name=" " * 1_100 + "bf1")
@example(name="\t" * 1_100 + "BF1" + "\u3000" * 5)
@example(name="\u3000\u00a0\u2003\u1680\x1c\x1d\x1e\x1f" * 200 + "ｂｆ１")  # noqa: RUF001
@example(name="\u00a0" * 1_100 + "Caf\u00e9")  # a Latin-1 body: é is one byte, 0xe9
@example(name="ﬁ" * 600)
@example(name="﹉bob")
@example(name="b\ufe70f1")  # NFKC: a space and a mark; unnormalised: ignored whole
@example(name="b\ufc5e\ufc5ef1")
@example(name="bf\u03451")  # a mark upper() would make a capital iota
@example(name="\u00c2\u0080")  # in Latin-1 the bytes C2 80: UTF-8 too, for U+0080
def test_the_limiter_counts_the_name_the_authenticator_authenticates(
    entry: str, name: str, authenticated: list[str]
) -> None:
    """The counter the limiter computes before the view runs is the counter of the name
    the authenticator then checks, for every name it checks."""
    authenticated.clear()
    request, authenticate = ENTRY_POINTS[entry](name)
    counters = username_counters(request)  # before the view, as the middleware does
    authenticate()
    event(f"authenticate() called: {bool(authenticated)}")
    for checked in authenticated:
        if checked.strip():  # a blank name signs nobody in; not counted by username either
            expected = Identity("username", normalise_username(checked)).key
            assert expected in counters
            if entry != "token latin-1 json":
                assert counters == (expected,)
            # A Latin-1 body whose bytes are UTF-8 too names a second user, the one a view
            # calling ``json.loads(request.body)`` reads: counted under both.


@given(name=usernames)
@settings(max_examples=200, deadline=None)
def test_a_normalised_name_is_bounded_and_stable(name: str) -> None:
    """Normalising twice changes nothing, and a counter's label stays bounded however long
    the name (a long name is digested over all of it, never cut)."""
    once = normalise_username(name)
    assert normalise_username(once) == once
    assert len(once) <= MAX_USERNAME
    assert len(Identity("username", once).key.encode()) <= MAX_KEY_BYTES


def test_two_long_names_that_start_alike_keep_two_counters() -> None:
    common = "a" * (MAX_READ - 1)
    assert normalise_username(common + "b") != normalise_username(common + "c")
    assert normalise_username(" " * 5_000 + common) == normalise_username(common)


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("Łódź", "lodz"),
        ("Ørsted", "orsted"),
        ("ǿrsted", "orsted"),  # ø with an accent: the accent goes, then the stroke
        ("Đoković", "dokovic"),
        ("ĦŦƗɃ", "htib"),
        ("Ⱥⱦ", "at"),
        ("Ægir", "aegir"),
        ("cœur", "coeur"),
    ],
)
def test_letters_a_collation_weighs_as_their_base_letter_fold_to_it(name: str, base: str) -> None:
    """No decomposition, yet the Unicode Collation Algorithm weighs them as their base
    letter with a secondary difference (``æ`` and ``œ`` as two letters): counted apart, each
    was a fresh budget for one account on MySQL."""
    assert normalise_username(name) == base


@pytest.mark.parametrize(
    "spelling",
    [
        "bf\u0661",  # Arabic-Indic digit one
        "bf\u06f1",  # extended Arabic-Indic
        "bf\u0967",  # Devanagari
        "bf\u0e51",  # Thai
        "bf\u3021",  # Hangzhou numeral one (Nl)
        "bf\u0f2a",  # Tibetan "half one", weighed as one
        "bf\U000104a1",  # Osmanya
        "b\u0640f1",  # Arabic tatweel, ignored by the collation
        "b\u0640\u0640\u0640f\u0640\u06401",
        "bf\u07fa1",  # NKo lajanyalan
        "b\u0903f1",  # Devanagari visarga (a spacing sign, Mc)
        "b\U0001d165f1",  # musical combining stem (Mc)
        "b\x1cf\x1f1",  # information separators: whitespace to str.strip, ignored inside
        "b\ufc5ef1",  # an Arabic presentation form NFKC makes a space and two marks
        "\U0001f151f1",  # negative circled B
        "b\ua77c1",  # insular f
    ],
)
def test_spellings_a_collation_takes_for_the_name_share_its_counter(spelling: str) -> None:
    """MySQL's ``utf8mb4_0900_ai_ci`` and ICU's root collation weigh a digit of any script
    as its value and pass over the tatweel, spacing signs and other characters of no weight:
    there each of these signs in as ``bf1``. Counted apart (before: every one of them), each
    spelling was a fresh allowance of guesses at one account, and a tatweel can be repeated
    anywhere, so the allowance had no end."""
    assert normalise_username(spelling) == "bf1"


def test_a_combining_latin_letter_counts_as_its_letter() -> None:
    """The collation weighs a combining Latin letter as the letter (``bf`` + combining ``a``
    is ``bfa``), not as an accent to drop."""
    assert normalise_username("bf\u0363") == normalise_username("bfa") == "bfa"
    assert normalise_username("bf\u0363\u0301") == "bfa"  # the accent on it still goes


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("ca\u1dcal", "carl"),  # combining r below: a letter written below, not an accent
        ("\u1dd7arl", "carl"),  # combining c cedilla
        ("ca\u1abfl", "cawl"),  # combining w below
        ("\u1dd4on", "aeon"),  # combining ae
        ("\U0001f18aat", "pat"),  # crossed negative squared P
        ("car\u0140", "carl"),  # l with middle dot: NFKC makes it l and a middle dot
        ("CAR\u013f", "carl"),
        ("carl\u00b7", "carl"),  # the middle dot after an l: the DUCET's contraction
        ("carl\u0387", "carl"),
        ("\ua733ron", "aaron"),  # the letter aa
    ],
)
def test_letters_the_collation_weighs_as_latin_letters_fold_to_them(
    spelling: str, name: str
) -> None:
    """Each is one or more plain Latin letters at the first level of the Unicode Collation
    Algorithm (the only level an accent- and case-insensitive collation compares): counted
    apart, each was a fresh allowance of guesses at the account (``ca\u1dcal`` is ``carl``
    where usernames are compared as MySQL's ``utf8mb4_0900_ai_ci`` compares them)."""
    assert normalise_username(spelling) == name


#: The Unicode Collation Algorithm's table (the DUCET) as Perl's ``Unicode::Collate`` ships it.
ALLKEYS = sorted(glob.glob("/usr/share/perl/*/Unicode/Collate/allkeys.txt"))
_ENTRY = re.compile(r"^([0-9A-F ]+);\s*((?:\[[.*][0-9A-F.]+\])+)")
_PRIMARY = re.compile(r"\[[.*]([0-9A-F]+)\.")


def _ducet() -> dict[str, tuple[int, ...]]:
    """Each string the DUCET lists, with its non-zero primary weights."""
    with open(ALLKEYS[-1], encoding="utf-8") as table:
        found = (_ENTRY.match(line) for line in table)
        return {
            "".join(chr(int(point, 16)) for point in entry[1].split()): tuple(
                weight for weight in map(lambda w: int(w, 16), _PRIMARY.findall(entry[2])) if weight
            )
            for entry in found
            if entry
        }


@pytest.mark.skipif(not ALLKEYS, reason="Perl's Unicode::Collate (allkeys.txt) is not installed")
def test_every_string_the_collation_weighs_as_latin_letters_and_digits_folds_to_them() -> None:
    """Every character (and contraction) whose first-level weights in the DUCET are those of
    ASCII letters and digits, or none at all, folds to those letters: where usernames are
    compared at that level (``utf8mb4_0900_ai_ci``, ICU at primary strength), ``b<it>f1``
    signs in as ``b<letters>f1``, so a spelling counted apart would be a fresh allowance of
    guesses at the account."""
    ducet = _ducet()
    plain = {ducet[char][0]: char for char in "0123456789abcdefghijklmnopqrstuvwxyz"}
    apart = []
    for text, weights in ducet.items():
        if text.isascii() or not all(weight in plain for weight in weights):
            continue
        letters = "".join(plain[weight] for weight in weights)
        if normalise_username(f"b{text}f1") != f"b{letters}f1":
            apart.append(f"U+{'+'.join(f'{ord(c):04X}' for c in text)} ({letters or 'ignored'})")
    assert apart == []


def test_names_of_characters_a_collation_passes_over_share_one_counter() -> None:
    """Where a collation passes over them, a name of nothing else is the empty name, however
    many there are: one counter for all such names, never none (``ـ`` is a valid Django
    username: the tatweel is a letter to its validator)."""
    names = ["\u0640", "\u0640\u0640", "\u07fa", "\u200b", "\u0301", "\ufe71", "\u0640 \u200b"]
    counters = {normalise_username(name) for name in names}
    assert len(counters) == 1
    assert counters != {""}
    (counter,) = counters
    assert normalise_username(counter) == counter


@pytest.mark.parametrize("reader", [form_login, token_form, token_json, basic])
def test_a_name_longer_than_any_account_is_counted_unread_in_one_counter(
    reader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folding took time in proportion to a name's length times what NFKC makes of it: a login
    naming 800 kB of U+FDFA (18 characters each once normalised) cost the worker seconds of
    CPU per field read, and a body of 2.5 MB (Django's upload bound) more. A name longer than
    any account's, once stripped, is now counted unread in one shared counter, whatever pads
    it (characters a collation ignores included): no counter of its own, no fold."""
    lengths: list[int] = []
    normalize = unicodedata.normalize

    def measured(form: str, text: str) -> str:
        lengths.append(len(text))
        return normalize(form, text)

    monkeypatch.setattr(unicodedata, "normalize", measured)
    for name in ("\ufdfa" * 270_000, "bob" + "\u200b" * 5_000, "x" * (MAX_READ + 1)):
        request, _ = reader(name)
        assert username_counters(request) == (Identity("username", OVERLONG).key,)
    assert max(lengths, default=0) <= MAX_READ
    # Whitespace is stripped first: a name behind any amount of it is read as the name.
    request, _ = reader(" " * 5_000 + "bob" + " " * 5_000)
    assert username_counters(request) == (Identity("username", "bob").key,)


@pytest.mark.parametrize(
    "name", ["\ufdfa" * 1000, "\ufdfa" * 227, "\u3353" * 1024, "\u0f75" * 1000]
)
def test_folding_a_name_works_on_a_bounded_amount_of_text(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folding takes time in proportion to the text NFKC makes of a name: 1,000 U+FDFA (18
    characters each once normalised), within MAX_READ, handed 90,000 characters to
    ``unicodedata.normalize`` and took 4.4 ms per field read, more than 10 plain requests'
    CPU for a login naming a few of them. A name that decomposes to more than
    MAX_DECOMPOSED characters, which no account's does, is counted unread (OVERLONG), so a
    name read never costs more than a few passes over that many."""
    normalize = unicodedata.normalize
    lengths: list[int] = []

    def measured(form: str, text: str) -> str:
        lengths.append(len(text))
        return normalize(form, text)

    monkeypatch.setattr(unicodedata, "normalize", measured)
    folded = normalise_username(name)
    assert sum(lengths) <= 6 * MAX_DECOMPOSED
    if sum(len(normalize("NFKD", char)) for char in name) > MAX_DECOMPOSED:
        assert folded == OVERLONG


def _longest_marks_run(text: str, normalize: Callable[[str, str], str]) -> int:
    """The most characters in a row of ``text`` that decompose to combining marks only: what
    NFKC sorts, in time growing with the square of the run."""
    longest = run = 0
    for char in text:
        marks = all(unicodedata.combining(part) for part in normalize("NFKD", char))
        run = run + 1 if marks else 0
        longest = max(longest, run)
    return longest


@pytest.mark.parametrize("reader", [form_login, token_form, token_json, basic])
def test_a_long_run_of_combining_marks_is_counted_unread_and_never_sorted(
    reader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFKC sorts a run of combining marks in time that grows with the square of its length:
    1,024 U+0F75 (a character of combining class 0 that decomposes to two marks), within
    MAX_READ, cost 3.5 ms per normalisation, several per field read, 7 ms per field and
    more than 10 plain requests' CPU per request. No account's name holds more marks in a
    row than Unicode's stream-safe 30: such a name is counted unread (OVERLONG), and no run
    longer than that ever reaches NFKC, so the work stays linear in the name's length."""
    normalize = unicodedata.normalize
    runs: list[int] = []

    def measured(form: str, text: str) -> str:
        if len(text) > 1:
            runs.append(_longest_marks_run(text, normalize))
        return normalize(form, text)

    for name in ("\u0f75" * 1000, "bob" + "\u0301\u0316" * 200, "bob" + "\u0344" * 31):
        request, _ = reader(name)
        monkeypatch.setattr(unicodedata, "normalize", measured)
        assert username_counters(request) == (Identity("username", OVERLONG).key,)
        monkeypatch.setattr(unicodedata, "normalize", normalize)
    assert max(runs, default=0) <= MAX_NON_STARTERS
    # Within the bound a name is read as before: its accents are folded away.
    request, _ = reader("bob" + "\u0301" * MAX_NON_STARTERS)
    assert username_counters(request) == (Identity("username", "bob").key,)
