"""Django's own options (``--skip-checks``, ``--verbosity``, ``--settings``, ``--no-color``,
``--traceback``) on every ``throttle_*`` command and every subcommand, after the subcommand's
name as before it: ``manage.py throttle_policy export --skip-checks`` was refused by argparse
("unrecognized arguments"), argparse handing everything after ``export`` to a subparser that
knew only the subcommand's own options."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import (
    CommandError,
    ManagementUtility,
    call_command,
    load_command_class,
)

from tests.factories import tier

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [
    "throttle_adapt",
    "throttle_explain",
    "throttle_inspect",
    "throttle_policy",
    "throttle_reset",
    "throttle_usage",
]
#: What the system checks print when they run (the test project's URLconf draws warnings).
CHECKS_RAN = "System check identified"


@pytest.fixture
def policy_file(tmp_path: Path) -> str:
    tier("anonymous", "60/min", is_default_anonymous=True)
    out = io.StringIO()
    call_command("throttle_policy", "export", stdout=out)
    path = tmp_path / "policy.json"
    path.write_text(out.getvalue(), encoding="utf-8")
    return str(path)


#: One run of each command (and subcommand) that succeeds, in the test project.
RUNS = [
    ["throttle_adapt", "--clear"],
    ["throttle_explain", "--ip", "203.0.113.9", "--path", "/api/ping/", "--format", "json"],
    ["throttle_inspect", "203.0.113.9", "--format", "json"],
    ["throttle_policy", "export"],
    ["throttle_policy", "import", "{policy}", "--dry-run"],
    ["throttle_policy", "from-drf"],
    ["throttle_reset", "203.0.113.9"],
    ["throttle_usage", "--format", "json"],
]


def _argv(run: list[str], policy_file: str) -> list[str]:
    return [arg.replace("{policy}", policy_file) for arg in run]


@pytest.fixture(autouse=True)
def _drf_rates(settings: Any) -> None:
    """``from-drf`` has something to convert."""
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"anon": "10/min", "user": "100/min"},
    }


@pytest.mark.parametrize("run", RUNS, ids=" ".join)
def test_skip_checks_after_the_arguments_on_the_command_line(
    run: list[str], policy_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``manage.py <command> <arguments> --skip-checks``, as an operator types it."""
    utility = ManagementUtility(["manage.py", *_argv(run, policy_file), "--skip-checks"])
    utility.execute()

    captured = capsys.readouterr()
    assert CHECKS_RAN not in captured.err
    assert "unrecognized arguments" not in captured.err
    assert captured.out


def test_without_skip_checks_the_checks_run(
    policy_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control of the test above: the checks do print here (else it proves nothing)."""
    ManagementUtility(["manage.py", "throttle_policy", "export"]).execute()
    assert CHECKS_RAN in capsys.readouterr().err


@pytest.mark.parametrize("run", RUNS, ids=" ".join)
def test_skip_checks_through_call_command(run: list[str], policy_file: str) -> None:
    """``call_command`` with ``--skip-checks`` among the arguments, and as a keyword."""
    argv = _argv(run, policy_file)
    for extra, keywords in (
        (["--skip-checks"], {}),
        ([], {"skip_checks": True}),
        (["--skip-checks", "--verbosity", "0", "--no-color"], {}),
    ):
        out = io.StringIO()
        call_command(*argv, *extra, stdout=out, stderr=io.StringIO(), **keywords)
        assert out.getvalue()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


@pytest.mark.parametrize("name", COMMANDS)
def test_every_subcommand_takes_djangos_options_after_its_name(name: str) -> None:
    """Each subcommand (of any command, now or added later) takes Django's options after its
    name with their values; not given, the command's own (before the name) stand."""
    command = load_command_class("django_throttle", name)
    parser = command.create_parser("manage.py", name)
    subcommands = _subcommands(parser)
    if name == "throttle_policy":
        assert set(subcommands) == {"export", "import", "from-drf"}
    for sub, sub_parser in subcommands.items():
        positional = ["file"] if sub == "import" else []
        given = vars(
            parser.parse_args(
                [
                    sub,
                    *positional,
                    "--skip-checks",
                    "-v",
                    "2",
                    "--settings",
                    "tests.settings",
                    "--pythonpath",
                    "/tmp",
                    "--no-color",
                    "--traceback",
                ]
            )
        )
        assert {
            key: given[key]
            for key in ("skip_checks", "verbosity", "settings", "pythonpath", "no_color")
        } == {
            "skip_checks": True,
            "verbosity": 2,
            "settings": "tests.settings",
            "pythonpath": "/tmp",
            "no_color": True,
        }
        assert given["traceback"] is True
        before = vars(parser.parse_args(["-v", "0", "--skip-checks", sub, *positional]))
        assert (before["verbosity"], before["skip_checks"]) == (0, True)
        plain = vars(parser.parse_args([sub, *positional]))
        assert (plain["verbosity"], plain["skip_checks"], plain["no_color"]) == (1, False, False)
        assert "--skip-checks" in sub_parser.format_help()


def test_traceback_after_the_subcommand_raises_the_error(tmp_path: Path) -> None:
    """``--traceback`` after the subcommand takes effect: the error is raised with its
    traceback instead of printed as one line."""
    missing = str(tmp_path / "missing.json")
    utility = ManagementUtility(
        ["manage.py", "throttle_policy", "import", missing, "--skip-checks", "--traceback"]
    )
    with pytest.raises(CommandError, match="Cannot read"):
        utility.execute()


def test_settings_after_the_subcommand_in_a_manage_py_process() -> None:
    """``manage.py throttle_policy from-drf --settings=…`` in its own process: manage.py's
    default settings module is the demo's; the option after the subcommand chooses another."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "throttle_policy",
            "from-drf",
            "--settings=tests.settings",
            "--skip-checks",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # tests.settings has no DEFAULT_THROTTLE_RATES: the command's own one-line refusal,
    # which only the chosen settings give, not argparse's.
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("CommandError: Nothing was imported: REST_FRAMEWORK"), done.stderr
    assert "unrecognized arguments" not in done.stderr


def test_policy_export_with_skip_checks_writes_the_policy(
    policy_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported case, whole: ``throttle_policy export --skip-checks`` writes the policy."""
    ManagementUtility(["manage.py", "throttle_policy", "export", "--skip-checks"]).execute()
    document = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in document["tiers"]] == ["Anonymous"]


@pytest.mark.parametrize(
    "argv",
    [[name] for name in COMMANDS]
    + [["throttle_policy", action] for action in ("export", "import", "from-drf")],
    ids=" ".join,
)
def test_help_of_every_command_and_subcommand_exits_0(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--help`` prints the usage on standard output and exits 0: nothing else runs (no
    checks, no database, no Redis), so an operator can read it anywhere."""
    with pytest.raises(SystemExit) as exited:
        load_command_class("django_throttle", argv[0]).run_from_argv(["manage.py", *argv, "--help"])

    assert exited.value.code == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"usage: manage.py {' '.join(argv)} ")
    assert "--skip-checks" in captured.out
    assert captured.err == ""
