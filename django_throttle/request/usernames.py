"""The username a credential request presents, read exactly as the authenticators will
read it, and the counters a limit counted by username counts it under.

The per-username counter is the only defence against guessing spread over many addresses,
so every spelling an authenticator accepts for an account must reach that account's counter
(same parsing as DRF and Django, same normalisation), and credentials the limiter cannot
read are counted in one shared counter rather than skipping the limit.

A browser that signed in before keeps its own allowance of attempts while its username is
under attack, through a device cookie (OWASP's "Slow down online guessing attacks with device
cookies"): a limit counted by username is also a lever, since anyone can keep a real user
locked out by spending the username's allowance. A successful sign-in through
:func:`~django_throttle.credentials.protect_credentials` sets a signed cookie naming the
account signed in to (by a digest of its username, ``get_username()``: the cookie shows no
name) and a random device id. A later attempt that presents a valid cookie and that username
itself (stripped and NFKC-normalised, as the login form reads it; every field and header
that names a user naming it) is counted in that device's own counter, with the same limits,
instead of the username's shared one; an absent, forged, expired or other account's cookie
counts in the shared counter as before. The cookie holds for its own account's name only,
never for another spelling that folds to the same counter: an account of the attacker's own
whose name folds to the victim's (``BF1``, ``bḟ1`` for ``bf1``) gives cookies that are worth
nothing against the victim, however many times the attacker signs in to it. A device cookie
that keeps failing is locked out on its own, like any counter; a stolen one is worth one
allowance, no more. A browser that never signed in (a new device, cookies cleared) has only the
shared counter and stays locked out while the attack lasts. The cookie is signed with
``SECRET_KEY`` (``django.core.signing``; ``SECRET_KEY_FALLBACKS`` are honoured), lives
:data:`MAX_AGE` seconds, is ``HttpOnly`` and ``SameSite=Lax``, ``Secure`` on HTTPS, and is at
most :data:`MAX_COOKIE_CHARS` long; a longer one is ignored unread.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import json
import re
import secrets
import unicodedata
from base64 import urlsafe_b64encode
from typing import Any

from django.core import signing

from django_throttle.identity import Identity

#: Longest username kept as it is: a longer one is written ``#<digest>`` (never cut: two long
#: names that start alike, or a name behind any amount of padding, keep counters of their own).
MAX_USERNAME = 256
#: Longest name read, in characters once stripped: a longer one is :data:`OVERLONG`. No account
#: comes near it (Django's names are at most 150 characters, an email 254), and folding takes
#: time in proportion to a name's length times what NFKC makes of it (up to 18 characters of
#: one: 800 kB of U+FDFA took seconds), so a body cannot buy a worker's CPU.
MAX_READ = 1024
#: The name every name longer than :data:`MAX_READ` is counted as: one counter shared by all of
#: them, so no padding (of characters a collation ignores, say) earns a counter of its own.
OVERLONG = "#overlong"
#: Most characters in a row that are combining marks (or decompose to nothing but marks) a
#: name read may hold: Unicode's Stream-Safe Text Format (UAX #15) allows 30. Python's NFKC
#: sorts such a run in time that grows with the square of its length (1,024 U+0F75 took
#: 3.5 ms a call, several calls a field), and no account's name has one: a name with a longer
#: run is :data:`OVERLONG`, unread, like a name too long to read.
MAX_NON_STARTERS = 30
#: Most characters a name read may decompose to (NFKD, what NFKC works on), as many as it
#: may hold. Folding takes time in proportion to it, and a character may decompose to 18
#: (U+FDFA): 1,000 of them took 4.4 ms to fold, a login naming five took 11 plain requests'
#: CPU with 4,096 allowed. A name that decomposes to more, which no account's does (an
#: e-mail address is 254 characters at most), is :data:`OVERLONG`.
MAX_DECOMPOSED = MAX_READ
#: Rounds of strip, NFKC and case-folding at most (one or two in practice): see
#: :func:`normalise_username`.
MAX_ROUNDS = 8
#: Bodies read through ``request.POST`` (Django's and DRF's form parsers read them alike).
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
#: The username the request presents, once read (see ``_presented``).
USERNAME_ATTRIBUTE = "throttle_presented_username"
#: The view's own username fields, read too (``protect_credentials(username_field=…)``).
USERNAME_FIELDS = "throttle_username_fields"
#: Set (true) by an authentication class that checks the ``Authorization`` header only, while
#: its check runs: the body is then not read for a username.
HEADER_ONLY = "throttle_credentials_in_header"


def presented_username(request: Any) -> str | None:
    """The username a credential request presents, normalised as :func:`normalise_username`
    does, or ``None`` when it presents none, several, or none that can be read (see
    :func:`username_counters` for what such a request is counted against).

    Read exactly as the authenticators read it, so that no spelling an authenticator
    accepts escapes the counter: the user part of ``Authorization: Basic`` decoded as DRF's
    ``BasicAuthentication`` decodes it (stray non-base64 characters dropped, UTF-8 else
    Latin-1); the body of any request that may present credentials
    (:func:`may_present_credentials`), whatever its ``Content-Type`` says (DRF matches media
    types case-insensitively, ``*/*`` selects one of its parsers, and a plain view may call
    ``json.loads(request.body)`` under any) and whatever its size (up to
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``: DRF parses any), as a form (``request.POST``, else
    parsed as DRF parses it) and as JSON (decoded with the charset its ``Content-Type`` names,
    else ``DEFAULT_CHARSET``, as DRF decodes it, and from its bytes alone, as ``json.loads``
    decodes them), every reading's names counted; a number or ``true`` is its text (DRF's
    ``CharField``, Django's model field). Fields looked at: the view's own
    (``protect_credentials(username_field=…)``), the user model's ``USERNAME_FIELD``,
    ``username`` and ``email``, in the body and in the query string. Never raises.
    """
    found = _presented(request)
    return found[0][0] if found is not None and len(found) == 1 else None


def username_counters(request: Any) -> tuple[str, ...]:
    """The client labels the request's limits counted by username are counted under; none
    when it presents no username (nothing for an authenticator to check either).

    - each username it presents, read as :func:`presented_username` reads it:
      ``username:<name>``, unless the request carries a valid device cookie for the account
      that name is (see the module docstring): then that device's own counter. A
      request naming several users (a Basic header and a body, or two fields, that
      disagree) is counted under each: an authenticator may check any of them;
    - credentials that cannot be read (a Basic header that does not decode, a body that
      parses neither as JSON nor as a form, or is over ``DATA_UPLOAD_MAX_MEMORY_SIZE``):
      :data:`UNREADABLE_COUNTER`, one counter shared by every such request, so sending
      something the limiter cannot read never skips the limit; beside the names the rest
      of the request presents, so that a garbled header never hides the body's name (a
      login form ignores the header) nor a garbled body the header's.
    """
    found = _presented(request)
    if found is None:
        return (UNREADABLE_COUNTER,)
    if not found:
        return ()
    counters = []
    for name, spellings in found:
        device = device_for(request, spellings)
        counters.append(
            Identity("username", name).key if device is None else Identity("device", device).key
        )
    return tuple(counters)


def normalise_username(name: str) -> str:
    """``name`` as its counter knows it. Every spelling an authenticator may accept for one
    account maps to one counter; two accounts may share one (``Bob`` and ``bob``, ``José``
    and ``jose``), which only ever limits more.

    Read in the authenticators' own order, over the whole name: stripped of Unicode
    whitespace as Django's and DRF's ``CharField`` strip it (``str.strip``), then
    NFKC-normalised (Django's ``UsernameField`` and ``AbstractBaseUser.normalize_username``:
    the fullwidth ``bf1`` is ``bf1``), then folded as the databases and backends that match
    without regard to case, accents or invisible characters fold it (:func:`_fold`);
    repeated until nothing changes, so that the name an authenticator resolves (already
    stripped, or NFKC-normalised) normalises to the same counter as the spelling that was
    sent. A name longer than :data:`MAX_USERNAME` characters after that is ``#`` and 128 bits
    of BLAKE2b over all of it: bounded, yet never cut, so no padding can push a name out of
    its counter and two long names never share one. A name longer than :data:`MAX_READ`
    once stripped, or that decomposes to more than :data:`MAX_DECOMPOSED` characters or holds
    more than :data:`MAX_NON_STARTERS` combining marks in a row (which no account's name
    does, and which would cost time out of proportion to it), is :data:`OVERLONG`, unread.
    """
    stripped = name.strip()
    if len(stripped) > MAX_READ or _too_costly(stripped):
        return OVERLONG
    for _ in range(MAX_ROUNDS):
        stripped = name.strip()
        kept = _without_collation_ignored(stripped)
        folded = _fold(unicodedata.normalize("NFKC", kept if kept.strip() else stripped))
        if folded == name:
            break
        name = folded
    if len(name) <= MAX_USERNAME:
        return name
    raw = name.encode("utf-8", "surrogatepass")  # a JSON body may hold lone surrogates
    return "#" + hashlib.blake2b(raw, digest_size=16).hexdigest()


#: What :func:`normalise_username` makes of a name longer than :data:`MAX_USERNAME`: ``#`` and
#: 32 hex digits. A counter's own name, unlike the 16 of a usage report's private label
#: (``username:#<16 hex>``), which the operator tools look up among the names presented.
LONG_NAME = re.compile(r"#[0-9a-f]{32}", re.IGNORECASE)


#: Categories of the characters a collation that ignores accents passes over: combining
#: marks (an accent written apart, or left by decomposing an accented letter), format
#: characters (zero-width space and joiners, soft hyphen, direction marks) and control
#: characters other than whitespace.
_IGNORED = frozenset(("Mn", "Me", "Cf", "Cc"))


def _fold(name: str) -> str:
    """``name`` (NFKC) folded as case- and accent-insensitive matching folds it:

    - case: upper-cased, then case-folded. ``casefold`` alone keeps the Turkish dotless i
      (U+0131) apart from ``i``, but PostgreSQL's ``iexact`` (``UPPER``) and a backend that
      compares ``.upper()`` match ``al\u0131ce`` to ``alice``;
    - accents and invisible characters: dropped (after NFKD), as MySQL's default collations
      (``utf8mb4_0900_ai_ci``, Django's ``username`` column on MySQL 8) and PostgreSQL's
      nondeterministic ICU collations ignore them: there ``alicé``, ``ali\u200bce`` and
      ``alice\u00ad`` are ``alice``; so are the other characters those collations pass over
      (:data:`COLLATION_IGNORED`: the Arabic tatweel, spacing signs such as the Devanagari
      visarga), dropped before NFKC too, since a DRF view hands the name to the database
      unnormalised. A name made of nothing else is :data:`PASSED_OVER` (it names an account
      of its own, and never counts under no counter);
    - digits of every script (Arabic-Indic ``\u0661``, Devanagari ``\u0967``, Hangzhou
      numerals…): the digit they stand for, since the Unicode Collation Algorithm weighs
      every digit as its value, so that there ``bf\u0661`` is ``bf1``; and the letters it
      weighs as a plain Latin letter that NFKC leaves alone (combining ``\u0363`` is ``a``,
      negative circled ``\U0001f150`` is ``a``, insular ``\ua77a`` is ``d``);
    - letters with a stroke or a bar, which have no decomposition but which the Unicode
      Collation Algorithm weighs as their base letter with a secondary (accent) difference,
      so that accent-insensitive collations match them to it (:data:`_BASE_LETTERS`: there
      ``łukasz`` is ``lukasz`` and ``søren`` is ``soren``), and ``æ``/``œ``, which it weighs
      as ``ae``/``oe``;
    - then NFKC again, which recomposes what is left.
    """
    name = name.upper().casefold()
    if name.isascii() and name.isprintable():  # nothing to drop (most names): no more work
        return name
    bare = _without_ignored(unicodedata.normalize("NFKD", name))
    if not bare.strip():
        return PASSED_OVER
    # ``l`` and a middle dot (what NFKC makes of ``\u0140``) are one ``l`` in the DUCET.
    bare = bare.replace("l\u00b7", "l") if "\u00b7" in bare else bare
    return unicodedata.normalize("NFKC", bare)


#: The counter of every name made of nothing but characters a collation passes over (``ـ``,
#: a valid Django username, ``ــ``, a zero-width space, an accent alone): where names are
#: compared so, they are all one name, so they share one counter (the single tatweel).
PASSED_OVER = "\u0640"


#: Letters (case-folded) that decompose to nothing but that the Unicode Collation Algorithm
#: (the DUCET behind MySQL's ``utf8mb4_0900_ai_ci`` and ``utf8mb4_unicode_ci``, and ICU's
#: collations) weighs as a base letter plus a secondary difference, so accent-insensitive
#: matching takes them for it: letters with a stroke or a bar (``ł``, ``ø``, ``đ``, ``ħ``,
#: ``ŧ``, ``ɨ``, ``ƀ``…), the eth, and the ligatures ``æ`` and ``œ``. Folding one a
#: collation keeps apart only makes two names share a counter, which only limits more.
_BASE_LETTERS = {
    "\u2c65": "a",  # ⱥ
    "\u0180": "b",  # ƀ
    "\u023c": "c",  # ȼ
    "\u0111": "d",  # đ
    "\u00f0": "d",  # ð
    "\u0247": "e",  # ɇ
    "\u01e5": "g",  # ǥ
    "\ua7a1": "g",  # ꞡ
    "\u0127": "h",  # ħ
    "\u0268": "i",  # ɨ
    "\u1d7b": "i",  # ᵻ
    "\u0249": "j",  # ɉ
    "\ua741": "k",  # ꝁ
    "\ua7a3": "k",  # ꞣ
    "\u0142": "l",  # ł
    "\u019a": "l",  # ƚ
    "\ua7a5": "n",  # ꞥ
    "\u00f8": "o",  # ø
    "\ua74b": "o",  # ꝋ
    "\u1d7d": "p",  # ᵽ
    "\ua751": "p",  # ꝑ
    "\ua757": "q",  # ꝗ
    "\u024d": "r",  # ɍ
    "\ua7a7": "r",  # ꞧ
    "\ua7a9": "s",  # ꞩ
    "\u0167": "t",  # ŧ
    "\u2c66": "t",  # ⱦ
    "\u0289": "u",  # ʉ
    "\u024f": "y",  # ɏ
    "\u01b6": "z",  # ƶ
    "\u00e6": "ae",  # æ
    "\u0153": "oe",  # œ
}
#: Most distinct ignored characters removed one ``str.replace`` each; more go through one
#: regular expression. Either way the work stays in C over the whole name (a body may hold a
#: name of megabytes): only the distinct characters are looked up one by one.
_REPLACED = 8


#: Characters outside the :data:`_IGNORED` categories that the Unicode Collation Algorithm
#: ignores at the first (base letter) level, the only level an accent- and case-insensitive
#: collation compares: ``[.0000…]`` in the DUCET (``allkeys.txt``, Unicode 13), which MySQL's
#: ``utf8mb4_0900_ai_ci`` and ICU's root collation follow. The information separators
#: U+001C-U+001F are whitespace to ``str.strip`` but ignored there, inside a name too.
COLLATION_IGNORED = frozenset(
    map(
        chr,
        (
            *range(0x1C, 0x20),
            0x0345,
            0x0640,
            0x07FA,
            0x0824,
            0x0828,
            0x0903,
            0x0982,
            0x0983,
            0x0A03,
            0x0A83,
            0x0B02,
            0x0B03,
            0x0C01,
            0x0C02,
            0x0C03,
            0x0C82,
            0x0C83,
            0x0D02,
            0x0D03,
            0x0D82,
            0x0D83,
            0x0F3E,
            0x0F3F,
            0x0F7F,
            0x1038,
            0x17C7,
            0x17C8,
            0x180A,
            0x1B04,
            0x1B82,
            0x1CD3,
            0x1CE1,
            0x1CF2,
            0x1CF3,
            0x1CF7,
            0x302E,
            0x302F,
            0xA880,
            0xA881,
            0xA983,
            0xABEC,
            *range(0xFC5E, 0xFC64),
            0xFCF2,
            0xFCF3,
            0xFCF4,
            *range(0xFE70, 0xFE75),
            *range(0xFE76, 0xFE80),
            0x11000,
            0x11002,
            0x11082,
            0x11182,
            0x11302,
            0x11303,
            0x11445,
            0x114C1,
            0x115BE,
            0x1163E,
            0x116AC,
            0x11838,
            0x119DE,
            0x119DF,
            0x11A39,
            0x11A97,
            0x11C3E,
            0x11D96,
            0x16FF0,
            0x16FF1,
            *range(0x1D165, 0x1D167),
            *range(0x1D16D, 0x1D173),
        ),
    )
)
#: Categories of the characters that may stand for a digit (``unicodedata.numeric``).
_NUMBERS = frozenset(("Nd", "Nl", "No"))


def _too_costly(name: str) -> bool:
    """Whether ``name`` (of :data:`MAX_READ` characters at most, but for whitespace) decomposes
    to more than :data:`MAX_DECOMPOSED` characters, or holds more than
    :data:`MAX_NON_STARTERS` characters in a row that decompose to combining marks only (see
    :func:`_non_starter`). One look at each character, and one regular expression over the
    name when some are marks."""
    if name.isascii():
        return False
    if sum(map(_decomposed_length, name)) > MAX_DECOMPOSED:
        return True
    marks = [char for char in set(name) if _non_starter(char)]
    if not marks:
        return False
    run = "[" + "".join(map(re.escape, marks)) + f"]{{{MAX_NON_STARTERS + 1}}}"
    return re.search(run, name) is not None


@functools.lru_cache(maxsize=4096)
def _decomposed_length(char: str) -> int:
    """How many characters ``char`` decomposes to (NFKD): a bound on what it makes of a
    name's NFKC form (composing only shortens it)."""
    return len(unicodedata.normalize("NFKD", char))


@functools.lru_cache(maxsize=4096)
def _non_starter(char: str) -> bool:
    """Whether ``char`` is, once NFKD-decomposed, nothing but characters of a non-zero
    combining class (what NFKC reorders: a combining accent, or U+0F75, whose own class is
    0 but which decomposes to two marks)."""
    if unicodedata.combining(char):
        return True
    decomposed = unicodedata.normalize("NFKD", char)
    return all(unicodedata.combining(part) for part in decomposed)


def _without_collation_ignored(name: str) -> str:
    """``name`` without the characters of :data:`COLLATION_IGNORED` (most names: no work
    beyond one look at each distinct character)."""
    if name.isascii() and name.isprintable():
        return name
    for char in COLLATION_IGNORED.intersection(name):
        name = name.replace(char, "")
    return name


#: Digits the collation weighs as a digit other than their value: the Tibetan half digits
#: (U+0F2A "half one", worth 0.5, weighs as 1; U+0F33 "half zero" as 0).
_HALF_DIGITS = {chr(0x0F2A + i): str(i + 1) for i in range(9)} | {"\u0f33": "0"}
#: Names of letters the collation weighs as a plain Latin letter that neither NFKC nor
#: :data:`_BASE_LETTERS` map to it: combining Latin letters written above another (which
#: would else be dropped as accents), negative circled and squared letters, insular letters.
_NAMED_LETTER = re.compile(
    r"(?:COMBINING |NEGATIVE CIRCLED |NEGATIVE SQUARED |SQUARED |CIRCLED |PARENTHESIZED )?"
    r"LATIN (?:SMALL|CAPITAL) LETTER (?:INSULAR )?([A-Z])"
)


#: The rest of what the DUCET (Unicode 13, ``allkeys.txt``) weighs at the first level as
#: plain Latin letters and digits, found by reading it whole (tests/test_usernames.py does so
#: again whenever Perl's copy is installed): combining letters written below or with an
#: accent of their own (``\u1dca`` is ``r``), ligatures and digraphs the table writes as
#: their letters (``\ua733`` is ``aa``), squared words and numbers (``\U0001f18a`` is ``p``).
#: Keys as :func:`_fold` meets them (upper-cased, case-folded, NFKD).
_COLLATION_LETTERS = {
    "\u24fe": "10",
    "\u277f": "10",
    "\u2789": "10",
    "\u2793": "10",
    "\u3248": "10",
    "\u24eb": "11",
    "\u24ec": "12",
    "\U0001f1a4": "120p",
    "\u24ed": "13",
    "\u24ee": "14",
    "\u24ef": "15",
    "\u24f0": "16",
    "\u24f1": "17",
    "\u24f2": "18",
    "\u24f3": "19",
    "\u24f4": "20",
    "\u3249": "20",
    "\U0001f19d": "2k",
    "\u324a": "30",
    "\U0001f19b": "3d",
    "\u324b": "40",
    "\U0001f19e": "4k",
    "\u324c": "50",
    "\u324d": "60",
    "\U0001f1a3": "60p",
    "\u324e": "70",
    "\u324f": "80",
    "\U0001f19f": "8k",
    "\u1dd3": "a",
    "\u1df2": "a",
    "\ua79b": "a",
    "\ua733": "aa",
    "\U0001f18e": "ab",
    "\u1dd4": "ae",
    "\u1dd5": "ao",
    "\ua735": "ao",
    "\ua737": "au",
    "\u1dd6": "av",
    "\ua739": "av",
    "\ua73b": "av",
    "\ua73d": "ay",
    "\u1dd7": "c",
    "\U0001f191": "cl",
    "\U0001f192": "cool",
    "\u1dd9": "d",
    "\u0238": "db",
    "\u02a3": "dz",
    "\U0001f193": "free",
    "\U0001f1a6": "hc",
    "\U0001f1a7": "hdr",
    "\U0001f18b": "ic",
    "\U0001f194": "id",
    "\u1efb": "ll",
    "\U0001f1a9": "lossless",
    "\u02aa": "ls",
    "\u02ab": "lz",
    "\U0001f195": "new",
    "\U0001f196": "ng",
    "\u1ded": "o",
    "\u1df3": "o",
    "\ua79d": "o",
    "\U0001f197": "ok",
    "\ua74f": "oo",
    "\U0001f18a": "p",
    "\U0001f18c": "pa",
    "\u0239": "qp",
    "\u1dca": "r",
    "\u1de5": "s",
    "\U0001f18d": "sa",
    "\U0001f1aa": "shv",
    "\U0001f198": "sos",
    "\u1d7a": "th",
    "\u01be": "ts",
    "\u02a6": "ts",
    "\ua729": "tz",
    "\u1df0": "u",
    "\u1df4": "u",
    "\ua79f": "u",
    "\U0001f1ab": "uhd",
    "\U0001f1ac": "vod",
    "\U0001f19a": "vs",
    "\ua761": "vy",
    "\u1abf": "w",
    "\U0001f18f": "wc",
    "\u018d": "zw",
}


def _base(char: str) -> str | None:
    """The ASCII letter(s) or digit a non-ASCII ``char`` is taken for (see :func:`_fold`),
    else ``None``: a letter of :data:`_BASE_LETTERS` or :data:`_COLLATION_LETTERS`, a digit
    of any script or a numeral worth 0-9 as its digit, a letter :data:`_NAMED_LETTER` names."""
    based = _BASE_LETTERS.get(char) or _HALF_DIGITS.get(char) or _COLLATION_LETTERS.get(char)
    if based is not None:
        return based
    if unicodedata.category(char) in _NUMBERS:
        value = unicodedata.numeric(char, None)
        return str(int(value)) if value is not None and value in range(10) else None
    named = _NAMED_LETTER.fullmatch(unicodedata.name(char, ""))
    return named[1].lower() if named else None


def _without_ignored(name: str) -> str:
    """``name`` without the characters of :data:`_IGNORED` categories (whitespace kept) and
    of :data:`COLLATION_IGNORED`, the letters and digits :func:`_base` knows as ASCII."""
    distinct = set(name)
    table = {ord(char): base for char in distinct if not char.isascii() and (base := _base(char))}
    ignored = [
        char
        for char in distinct
        if ord(char) not in table
        and (
            (unicodedata.category(char) in _IGNORED and not char.isspace())
            or char in COLLATION_IGNORED
        )
    ]
    if ignored and any(char.isspace() for char in distinct):
        # Whitespace right before them goes too: NFKC makes an Arabic presentation form
        # that the collation ignores (U+FE70, U+FC5E…) a space and marks, so the name a
        # login form passes on and the one a DRF view passes on unnormalised (where the
        # form is dropped whole, see :data:`COLLATION_IGNORED`) keep one counter.
        marks = "[" + "".join(map(re.escape, ignored)) + "]"
        name = re.sub(rf"\s+(?={marks})|{marks}+", "", name)
    elif len(ignored) > _REPLACED:
        name = re.sub("[" + "".join(map(re.escape, ignored)) + "]+", "", name)
    else:
        for char in ignored:
            name = name.replace(char, "")
    return name.translate(table) if table else name


#: The one counter of every request whose credentials cannot be read, in whole or in part:
#: the empty username, which no username read is counted under.
UNREADABLE_COUNTER = Identity("username", "").key
#: Most usernames one request is counted under: a Basic header and four fields, each read
#: from the query string, from a form and from JSON decoded two ways, is 17 at most; a
#: request naming more is counted as unreadable (:data:`UNREADABLE_COUNTER`), never under
#: some of its names only.
MAX_NAMES = 20

#: The sorted, distinct usernames presented (empty: none), each with the digests of the
#: spellings it was presented as (see :func:`_spelling`), or ``None``: credentials are
#: presented, but no username can be read from them.
_Found = tuple[tuple[str, frozenset[str]], ...] | None
#: Usernames as :func:`normalise_username` writes them, each with the digests of its spellings.
_Names = dict[str, set[str]]


def unread_username(request: Any, credentials: Any) -> str | None:
    """The key under which ``authenticate()`` was given a username (``credentials``, as
    ``user_login_failed`` sends them) for a request from which the check read none, else
    ``None``: the view takes the username from a field the limiter does not read, so no
    limit counted by username holds for it."""
    cached = getattr(request, USERNAME_ATTRIBUTE, None)
    if not cached or any(found != () for found in cached.values()):
        return None  # not checked by username, or a username (or unreadable) was counted
    if not isinstance(credentials, dict):
        return None
    for key, value in credentials.items():
        if key != "password" and isinstance(value, str) and normalise_username(value):
            return str(key)
    return None


def _presented(request: Any) -> _Found:
    """What the request presents, worked out once per request and reading (after the view,
    a body DRF has read can no longer be read again): the header only, or the header and
    the body's fields, with the fields the guard running names (a check made before it,
    which names none, must not hide the view's own field from it)."""
    header_only = bool(getattr(request, HEADER_ONLY, False))
    reading = (header_only, getattr(request, USERNAME_FIELDS, ()))
    cached: dict[tuple[bool, tuple[str, ...]], _Found] = getattr(request, USERNAME_ATTRIBUTE, {})
    if reading not in cached:
        cached[reading] = _read(request, header_only)
        with contextlib.suppress(AttributeError):  # a request object that takes no attributes
            setattr(request, USERNAME_ATTRIBUTE, cached)
    return cached[reading]


def _read(request: Any, header_only: bool) -> _Found:
    """The header's username and, unless ``header_only``, the body's. One that cannot be read
    never hides the other (a login form ignores a garbled Basic header; DRF's token view
    checks the header before it parses a body): the names read are counted, and with them
    the shared counter of credentials that cannot be read (the name ``""``)."""
    header = _basic_username(authorization(request.META))
    unreadable = header is None
    names: _Names = header or {}
    # A DRF authentication class checks the header only; a login view may check both (a
    # DRF token view also runs BasicAuthentication).
    if not header_only and may_present_credentials(request):
        body = _posted_usernames(request)
        if body is None:
            unreadable = True
        else:
            names = _merged(names, body)
        # A view may take them from the query string (``request.GET``, DRF's
        # ``query_params``), a GET's or a POST's.
        names = _merged(names, _query_usernames(request))
    if unreadable:
        if not names:
            return None
        names[""] = set()  # counted as UNREADABLE_COUNTER; no spelling, so never a device's
    if len(names) > MAX_NAMES:
        return None
    return tuple((name, frozenset(names[name])) for name in sorted(names))


#: Methods that carry no credentials unless the request has a body, an ``Authorization``
#: header or credentials in its query string (the GET that shows the login form): every
#: other method may (a view reading ``request.body`` reads it whatever the method, and DRF
#: parses the body of any method).
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")


def may_present_credentials(request: Any) -> bool:
    """Whether ``request`` may present credentials to a login view: any method but
    :data:`SAFE_METHODS`, and those too when they carry a body (a view that reads
    ``json.loads(request.body)`` reads a ``GET``'s, a ``PUT``'s or a ``DELETE``'s as it reads a
    ``POST``'s) or an ``Authorization`` header (DRF authenticates a ``GET``, a ``HEAD`` or an
    ``OPTIONS`` of the token view before it answers 405 or its metadata, and a view checking
    Basic credentials itself reads them whatever the method) or a query string naming a
    username field or a ``password`` (a view reading ``request.GET``). A body that cannot be
    read counts as one."""
    if request.method not in SAFE_METHODS or request.META.get("HTTP_AUTHORIZATION"):
        return True
    if request.META.get("QUERY_STRING") and _in_query(request):
        return True  # ``?username=…&password=…``: a view reading ``request.GET`` checks them
    try:
        return bool(request.body)
    except Exception:  # too big, already read, bad length: it may hold credentials
        return True


def _in_query(request: Any) -> bool:
    """Whether the query string names a username field (:func:`_field_names`) or a
    ``password``."""
    try:
        query = request.GET
        return any(field in query for field in (*_field_names(request), "password"))
    except Exception:  # too many fields: Django refuses it to the view too (400)
        return False


def _query_usernames(request: Any) -> _Names:
    """The usernames the query string presents, read as a form's fields are; none when it
    cannot be parsed (Django refuses it to a view reading it too)."""
    if not request.META.get("QUERY_STRING"):
        return {}
    try:
        return _fields(request.GET, request)
    except Exception:  # too many fields
        return {}


def _merged(names: _Names, more: _Names) -> _Names:
    """``names`` with ``more`` added (each name's spellings joined)."""
    for name, spellings in more.items():
        names.setdefault(name, set()).update(spellings)
    return names


def authorization(meta: Any) -> list[bytes]:
    """The ``Authorization`` header split as DRF's own classes split it (bytes, on any ASCII
    whitespace: a tab after ``Basic`` must not hide the credentials); empty for none."""
    header = meta.get("HTTP_AUTHORIZATION")
    return header.encode("latin-1", "replace").split() if isinstance(header, str) else []


def _basic_username(parts: list[bytes]) -> _Names | None:
    """The user part of ``Authorization: Basic`` (``parts``: see :func:`authorization`),
    parsed as DRF's ``BasicAuthentication`` parses it: empty for another scheme or no
    header, ``None`` when it cannot be read."""
    if not parts or parts[0].lower() != b"basic":
        return {}
    if len(parts) != 2:
        return None
    try:
        raw = base64.b64decode(parts[1])  # not validate=True: DRF drops stray characters
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError:
            decoded = raw.decode("latin-1")
        name, _ = decoded.split(":", 1)
    except (binascii.Error, ValueError):
        return None
    normalised = normalise_username(name)
    return {normalised: {_spelling(name)}} if normalised else {}


def _field_names(request: Any = None) -> tuple[str, ...]:
    """The body fields read: the view's own (see :data:`USERNAME_FIELDS`), the user model's
    ``USERNAME_FIELD``, ``username`` and ``email``."""
    from django.contrib.auth import get_user_model

    field = getattr(get_user_model(), "USERNAME_FIELD", "username")
    own = getattr(request, USERNAME_FIELDS, ())
    return tuple(dict.fromkeys((*own, field, "username", "email")))


def _posted_usernames(request: Any) -> _Names | None:
    """The distinct usernames a body presents (empty: none; ``None``: unreadable), in every
    way a login view may read them: a form through ``request.POST`` (a ``POST``'s), else
    parsed from the body as DRF's form parser does; and the same body as JSON, whatever the
    ``Content-Type`` says (a login view calling ``json.loads(request.body)`` never looks;
    DRF's ``*/*`` picks the view's first parser, the form parser on ``obtain_auth_token``).
    A body that reads both ways presents the names of both: reading one way only would let
    a form field hide the JSON's name, or a JSON field the form's."""
    meta = request.META
    media = str(meta.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()
    if media in FORM_TYPES and request.method == "POST":
        try:
            names: _Names | None = _fields(request.POST, request)
        except Exception:  # too many fields, a broken multipart: no view reads the form
            names = None
        if media != FORM_TYPES[0]:
            return names  # multipart: read from the stream, no view reads it otherwise
        try:
            body = request.body  # read already for ``request.POST``, even when it failed
        except Exception:
            return names
        in_json = _json_names(body, request)
        return None if names is None and in_json is None else _merged(names or {}, in_json or {})
    try:
        # Read whatever ``Content-Length`` says: under ASGI a chunked body has none, and
        # Django reads it whole for a view that reads ``request.body``.
        body = request.body  # bounded by DATA_UPLOAD_MAX_MEMORY_SIZE
    except Exception:  # unreadable body, body already read, too big, bad length
        return None
    if not body.strip():
        return {}
    if media == FORM_TYPES[1]:  # multipart under another method: DRF parses it, we do not
        return None
    in_json = _json_names(body, request)
    from django.http import QueryDict

    try:  # a form body (under another content type, ``*/*`` picks DRF's form parser)
        in_form = _fields(QueryDict(body, encoding=request.encoding), request)
    except Exception:
        in_form = None
    if in_json is None:
        return in_form or None  # text, XML, YAML…: a parser of its own may read a name
    return _merged(in_json, in_form or {})


def _json_names(body: bytes, request: Any) -> _Names | None:
    """The usernames of a JSON ``body`` (empty for a JSON list or number: no authenticator
    takes fields from it), or ``None`` when it is no JSON. Decoded both ways a login view
    decodes it: as DRF's JSONParser does, with the charset the Content-Type names (which
    Django keeps as ``request.encoding`` when Python knows it: ``utf-7`` too), else
    ``DEFAULT_CHARSET``; and as ``json.loads(request.body)`` does, from the bytes alone (a
    BOM, UTF-16 or UTF-32 told by its zero bytes, else UTF-8), whatever the charset says.
    The names of every reading that is JSON: a charset chosen so that one reading names
    another user never keeps the other's name from its counter."""
    found: _Names | None = None
    text: str | None = None
    try:
        text = body.decode(_charset(request))
        found = _json_fields(json.loads(text), request)
    # UnicodeDecodeError is a ValueError; RecursionError: nested deeper than json parses.
    except (ValueError, LookupError, RecursionError):
        pass
    try:
        # What ``json.loads(body)`` parses: the bytes decoded by what they look like.
        raw = body.decode(json.detect_encoding(body), "surrogatepass")
    except (ValueError, LookupError):
        return found
    if raw == text:
        return found  # the same text (a charset that reads the bytes alike): parsed once
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return found
    return _merged(found or {}, _json_fields(data, request))


def _json_fields(data: Any, request: Any) -> _Names:
    return _fields(data, request) if isinstance(data, dict) else {}


def _charset(request: Any) -> str:
    """The charset DRF's parsers decode the body with (``request.encoding`` or
    ``DEFAULT_CHARSET``)."""
    from django.conf import settings

    return str(getattr(request, "encoding", None) or settings.DEFAULT_CHARSET)


def _fields(data: Any, request: Any = None) -> _Names:
    names: _Names = {}
    for field in _field_names(request):
        value = data.get(field)
        if isinstance(value, (int, float)):
            # DRF's CharField takes numbers as their text; Django's model field a JSON
            # ``true`` as ``"True"`` (a plain view handing it to ``authenticate()``).
            value = str(value)
        if isinstance(value, str):
            name = normalise_username(value)
            if name:  # not blank, nor only what normalising removes
                names.setdefault(name, set()).add(_spelling(value))
    return names


def _spelling(name: str) -> str:
    """The digest of ``name`` as a login form gives it to ``authenticate()`` (stripped,
    NFKC-normalised: Django's ``UsernameField``), and as an account's username is stored
    (``normalize_username``): what a device cookie's account is compared with, exactly."""
    stripped = name.strip()
    if len(stripped) > MAX_READ or _too_costly(stripped):
        return OVERLONG  # no account's: never a cookie's (see normalise_username)
    return _name_digest(unicodedata.normalize("NFKC", stripped))


#: The cookie's name.
COOKIE_NAME = "throttle_device"
#: Seconds a device cookie stays valid after the last sign-in that set it (180 days).
MAX_AGE = 180 * 86400
#: Longest cookie value read; ours are about 80 characters.
MAX_COOKIE_CHARS = 200
#: Keeps these signatures apart from every other use of ``SECRET_KEY``. Changing it voids every
#: cookie issued: it was changed once, when cookies came to name the account signed in to
#: rather than the folded name presented (a cookie of before may be a look-alike account's).
SALT = "django_throttle.request.device_cookies.account"


def device_for(request: Any, spellings: frozenset[str]) -> str | None:
    """The device id of the request's valid device cookie when ``spellings`` (the digests of
    every spelling presented of one username, see :func:`_spelling`) is the one name of the
    cookie's account, else ``None``. Two spellings that fold to one counter (``bf1`` in the
    form, ``BF1`` as ``email``) are two accounts' names where names are compared as they
    are: the request is then counted in the shared counter."""
    cookies = getattr(request, "COOKIES", None)
    value = cookies.get(COOKIE_NAME) if cookies else None
    if not value or not isinstance(value, str) or len(value) > MAX_COOKIE_CHARS:
        return None
    try:
        signed = signing.TimestampSigner(salt=SALT).unsign(value, max_age=MAX_AGE)
    except signing.BadSignature:  # forged, garbled or expired (SignatureExpired)
        return None
    device, _, named = signed.partition(":")
    if not device or len(spellings) != 1:
        return None
    (spelling,) = spellings
    return device if hmac.compare_digest(named, spelling) else None


def remember(request: Any, response: Any, account: str) -> None:
    """Set (or renew) ``response``'s device cookie for the account whose username is
    ``account`` (``get_username()`` of the user signed in): a browser that already holds one
    for that account keeps its device id, and so its counter.

    None for an account whose stored name is not what a login form makes of a name typed
    (padded with whitespace, or not NFKC-normalised: saved without ``normalize_username``):
    the cookie compares names as the form reads them, so it would hold for another account's
    name (``bf1`` for an account of the attacker's own named ``bf1`` and a space, or a
    fullwidth ``bf1``, which a view that signs in without stripping and normalising lets
    them into), a fresh allowance of guesses at that account with every sign-in."""
    spelling = _spelling(account)
    if spelling != _name_digest(account):
        return
    device = device_for(request, frozenset((spelling,))) or secrets.token_urlsafe(12)
    value = signing.TimestampSigner(salt=SALT).sign(f"{device}:{spelling}")
    response.set_cookie(
        COOKIE_NAME,
        value,
        max_age=MAX_AGE,
        httponly=True,
        samesite="Lax",
        secure=bool(request.is_secure()),
    )


def _name_digest(username: str) -> str:
    """128 bits of BLAKE2b of the username: names the user without showing the name."""
    digest = hashlib.blake2b(username.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return urlsafe_b64encode(digest).rstrip(b"=").decode()
