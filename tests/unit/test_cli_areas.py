"""The CLI builds only the parsers of the command it runs (issue #17 item 8).

Goal: ``AREA_OF`` names every command exactly once with the area that registers it, so a
command line that starts with a command builds that area's parsers and parses as the full
parser would; anything else builds them all.
Method: build the parser for each command and read back the subcommands it registered.
"""

from __future__ import annotations

import argparse

import pytest

from deferq._cli import AREA_OF, build_parser, main


def commands(parser: argparse.ArgumentParser) -> set[str]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return set(actions[0].choices)


def test_the_full_parser_has_exactly_the_commands_of_the_table() -> None:
    assert commands(build_parser()) == set(AREA_OF)
    assert commands(build_parser("--path")) == set(AREA_OF)
    assert commands(build_parser("no-such-command")) == set(AREA_OF)


@pytest.mark.parametrize("command", sorted(AREA_OF))
def test_a_command_builds_exactly_its_own_area(command: str) -> None:
    area = AREA_OF[command]
    assert commands(build_parser(command)) == {c for c, a in AREA_OF.items() if a == area}


def test_options_before_the_command_and_a_typo_still_parse_with_every_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Parsed with every command (an option comes first): the handler ran and found no store.
    assert main(["--path", "no-such-dir", "dead", "list"]) == 5
    assert "no storage directory 'no-such-dir'" in capsys.readouterr().err
    assert main(["deadd", "list"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and "dead" in err and "crash-test" in err
