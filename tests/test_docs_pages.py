"""The operator pages keep up with the code: every management command has a section with
examples in the commands reference, and every system check id the package can raise is on the
troubleshooting page, with what to do. A new command or check without its docs fails here.

The pages are read as text (no Sphinx build): the commands reference must have, for each
command, a ``Examples`` heading and a ``$ python manage.py <command>`` line under the
command's own section, and the ``.. throttle-commands:: <command>`` directive that renders its
``--help``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.management import find_commands

import django_throttle
from django_throttle import checks

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

COMMANDS_PAGE = DOCS / "reference" / "commands.rst"
TROUBLESHOOTING_PAGE = DOCS / "howto" / "troubleshooting.md"
PRODUCTION_PAGE = DOCS / "howto" / "production.md"


def command_names() -> list[str]:
    """The package's management commands, as ``docs/_ext`` finds them (no Sphinx here)."""
    return sorted(find_commands(str(Path(django_throttle.__file__).parent / "management")))


def _sections(text: str) -> dict[str, str]:
    """Each ``\\`\\`name\\`\\``` section of the commands page (underlined with ``-``), by name."""
    heads = list(re.finditer(r"^``(\w+)``\n-+\n", text, re.MULTILINE))
    ends = [m.start() for m in heads[1:]] + [len(text)]
    return {m[1]: text[m.end() : end] for m, end in zip(heads, ends, strict=True)}


def test_the_package_has_commands() -> None:
    assert "throttle_usage" in command_names()


@pytest.mark.parametrize("name", command_names())
def test_every_command_has_examples_and_its_help(name: str) -> None:
    sections = _sections(COMMANDS_PAGE.read_text())
    assert name in sections, f"docs/reference/commands.rst has no section for {name}"
    body = sections[name]
    assert re.search(r"^Examples\n~+\n", body, re.MULTILINE), f"{name}: no Examples heading"
    assert f"$ python manage.py {name}" in body, f"{name}: no example invocation"
    assert f".. throttle-commands:: {name}\n" in body, f"{name}: its --help is not rendered"


def _check_ids_in_code() -> set[str]:
    source = "\n".join(path.read_text() for path in (ROOT / "django_throttle").rglob("*.py"))
    found = set(re.findall(r"django_throttle\.([EW]\d{3})", source))
    # The settings checks build their ids from the SETTINGS table ("E002", ...).
    return found | {check_id for check_id, _, _ in checks.SETTINGS}


def test_every_check_id_in_the_code_is_on_the_troubleshooting_page() -> None:
    ids = _check_ids_in_code()
    assert {"E002", "E018", "E041", "E042", "E101", "W001", "W004", "W020", "W106"} <= ids
    page = TROUBLESHOOTING_PAGE.read_text()
    written = set(re.findall(r"django_throttle\.([EW]\d{3})", page))
    assert ids - written == set()


def test_the_operator_pages_are_in_the_toctree() -> None:
    index = (DOCS / "index.md").read_text()
    for page in (TROUBLESHOOTING_PAGE, PRODUCTION_PAGE):
        assert page.exists()
        assert f"\n{page.relative_to(DOCS).with_suffix('')}\n" in index


#: How the README spells a count of settings.
NUMBER_WORDS = {
    10: "Ten",
    11: "Eleven",
    12: "Twelve",
    13: "Thirteen",
    14: "Fourteen",
    15: "Fifteen",
    16: "Sixteen",
    17: "Seventeen",
}


def test_the_readme_counts_the_settings_there_are() -> None:
    """The README's "Settings" section says how many ``DJANGO_THROTTLE_*`` settings there are:
    the number of :class:`~django_throttle.conf.Setting` attributes of ``Settings`` (it said
    thirteen while there were fifteen)."""
    from django_throttle.conf import Setting, Settings

    count = sum(isinstance(value, Setting) for value in vars(Settings).values())
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("## Settings", 1)[1].split("\n## ", 1)[0]
    assert f"{NUMBER_WORDS[count]} `DJANGO_THROTTLE_*` settings" in " ".join(section.split())


def _headings(table: str) -> list[str]:
    """A rich table's column headings (a heading wrapped over lines joined again)."""
    lines = table.split("┏", 1)[1].split("┡", 1)[0].splitlines()[1:]
    cells = [
        [cell.strip() for cell in line.strip().strip("┃").split("┃")]
        for line in lines
        if "┃" in line
    ]
    return [" ".join(filter(None, parts)) for parts in zip(*cells, strict=True)]


def _labels(block: str) -> list[str]:
    """The ``Label: value`` lines above a table (``throttle_explain``'s summary)."""
    head = block.split("┏", 1)[0]
    return re.findall(r"^ *([A-Z][a-z]+(?: [a-z]+)*): ", head, re.MULTILINE)


def _example(name: str, invocation: str) -> str:
    """The output shown under ``$ python manage.py <invocation>`` in command ``name``'s
    section: up to the next prompt or the end of the literal block."""
    body = _sections(COMMANDS_PAGE.read_text())[name]
    after = body.split(f"$ python manage.py {invocation}", 1)[1].split("\n", 1)[1]
    return re.split(r"\n   \$ |\n\n(?! )", after, maxsplit=1)[0]


@pytest.mark.django_db
def test_the_commands_page_shows_the_tables_the_commands_print() -> None:
    """The examples of ``throttle_explain``, ``throttle_inspect`` and ``throttle_reset`` show
    what the commands print: the same summary lines and column headings, and limits named
    with their rates as the commands write them (the page still showed a "Whole again in (s)"
    column of seconds, no region line and rates as ``60/m`` after the commands had changed)."""
    import io

    from django.core.management import call_command
    from django.test import Client

    from django_throttle.models import Protection
    from django_throttle.rates import Rate, rate_text
    from tests.factories import endpoint, tier

    anonymous = tier("anonymous", "2/min", is_default_anonymous=True)
    endpoint("export", "scope", "export", limits={anonymous: "1/day"})
    Protection.objects.create(in_flight=20)  # the demo's service protection, as on the page
    Client().post("/api/export/", REMOTE_ADDR="203.0.113.9")

    def run(*args: str) -> str:
        out = io.StringIO()
        call_command(*args, stdout=out)
        return out.getvalue()

    explained = run(
        "throttle_explain", "--ip", "203.0.113.9", "--method", "POST", "--path", "/api/export/"
    )
    inspected = run("throttle_inspect", "203.0.113.9")
    shown_explain = _example("throttle_explain", "throttle_explain --user alice")
    shown_inspect = _example("throttle_inspect", "throttle_inspect 203.0.113.9")
    assert _labels(shown_explain) == _labels(explained)
    assert _headings(shown_explain) == _headings(explained)
    assert _headings(shown_inspect) == _headings(inspected)
    assert "region none (the default limits)" in inspected
    assert "region none (the default limits)" in " ".join(shown_inspect.split())

    page = COMMANDS_PAGE.read_text()
    sections = _sections(page)
    shown = "".join(
        sections[name] for name in ("throttle_explain", "throttle_inspect", "throttle_reset")
    )
    # A limit's name ends with its rate: in a table cell (maybe wrapped) or a CSV row.
    rates = re.findall(r"[\s(│](\d+/\d*[a-z]+)(?= *[│,]| *$)", shown, re.MULTILINE)
    assert rates
    assert [rate_text(Rate.parse(rate)) for rate in rates] == rates


@pytest.mark.django_db
def test_the_commands_page_shows_what_throttle_policy_prints(tmp_path: Path) -> None:
    """Each ``throttle_policy`` example on the commands page prints what it shows, run on the
    demo's policy (``seed_demo``): the start of the export, the dry run of an edited file and
    the conversion of the DRF rates the page names (it still showed ``100/d`` where the dry
    run prints ``100/day``, eight changes where there are nine, and an export without the
    columns added since)."""
    import io
    import json

    from django.core.management import call_command
    from django.test import override_settings

    from example_project.demo.management.commands.seed_demo import Command

    Command(stdout=io.StringIO()).handle()

    def run(*args: str) -> str:
        out = io.StringIO()
        call_command("throttle_policy", *args, stdout=out, stderr=io.StringIO())
        return out.getvalue()

    section = _sections(COMMANDS_PAGE.read_text())["throttle_policy"]

    def shown(invocation: str) -> str:
        """What the page shows under the line ``$ python manage.py <invocation>``, as the
        command writes it (the block's indent taken off)."""
        after = section.split(f"   $ python manage.py {invocation}\n", 1)[1]
        block = re.split(r"\n   \$ |\n\n(?! )", after, maxsplit=1)[0]
        return "".join(f"{line[3:]}\n" for line in block.split("\n"))

    start = shown("throttle_policy export").removesuffix("...\n")
    assert start and run("export").startswith(start)

    document = json.loads(run("export"))
    (rule,) = [rule for rule in document["rules"] if rule["name"] == "export"]
    (limit,) = [limit for limit in rule["limits"] if limit["tier"] == "free"]
    limit["rate"] = "30/h"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(document))
    assert run("import", "--dry-run", str(policy)) == shown(
        "throttle_policy import --dry-run policy.json"
    )
    assert run("import", str(policy)) == shown("throttle_policy import policy.json")

    rates = {"anon": "100/day", "user": "1000/day", "uploads": "20/hour"}
    page = " ".join(COMMANDS_PAGE.read_text().split())
    assert f"(here ``{json.dumps(rates)}``)" in page
    with override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": rates}):
        converted = run("from-drf", "--format", "yaml")
        dry_run = run("from-drf", "--apply", "--dry-run")
    assert converted == shown("throttle_policy from-drf --format yaml")
    assert dry_run == shown("throttle_policy from-drf --apply --dry-run")


def test_the_troubleshooting_page_quotes_each_message_of_e044(
    settings: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E044 says "… cannot be imported" without the geoip2 package and "… cannot be opened"
    without a database: the page quoted the second alone."""
    import sys

    from django_throttle.checks import check_settings
    from django_throttle.policy import live

    settings.DJANGO_THROTTLE_REGION_SOURCE = "geoip"  # type: ignore[attr-defined]
    settings.GEOIP_PATH = str(tmp_path / "nowhere")  # type: ignore[attr-defined]

    def message() -> str:
        live.forget_geoip()
        (error,) = [m for m in check_settings() if m.id == "django_throttle.E044"]
        return str(error.msg).split(" (", 1)[0]  # the reason's own words follow

    cannot_open = message()
    monkeypatch.setitem(sys.modules, "django.contrib.gis.geoip2", None)  # not installed
    cannot_import = message()
    live.forget_geoip()

    page = " ".join(TROUBLESHOOTING_PAGE.read_text().split())
    assert "cannot be imported" in cannot_import and "cannot be opened" in cannot_open
    assert f'"{cannot_import} (…)"' in page
    assert f'but {cannot_open.split(" but ", 1)[1]} (…)"' in page
