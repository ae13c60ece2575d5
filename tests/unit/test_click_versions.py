"""Every click that debian/control admits (python3-click >= 8.0; Debian 12 has 8.1.3): a usage error is
one line and exit 2, a finding's exit 1 stays 1, never a traceback. Before 8.2, click has no
``NoArgsIsHelpError``: each run here takes it away before ponytail is imported, as those versions
are; tests/deb runs the same paths with Debian 12's own python3-click."""

from __future__ import annotations

import subprocess
import sys

import pytest

# click as it was before 8.2, then ponytail's own entry point (the installed command's)
BEFORE_8_2 = """
import sys
import click.exceptions
if hasattr(click.exceptions, "NoArgsIsHelpError"):
    del click.exceptions.NoArgsIsHelpError
from ponytail.entry import main
sys.exit(main(sys.argv[1:]))
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BEFORE_8_2, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["configure"], "Missing option '-runtime'"),
        (["configure", "--runtime", "bogus"], "'bogus' is not one of"),
        (["guard", "--once", "-nope"], "-nope"),
        (["check", "-devcie", "0"], "-devcie"),
        (["cdi", "generate", "--bogus"], "--bogus"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2_without_no_args_is_help_error(args: list[str], says: str) -> None:
    result = _run(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and says in result.stderr and result.stderr.startswith("ponytail: error: "), result.stderr


def test_a_group_without_its_subcommand_prints_its_help_and_exits_0() -> None:
    # click 8.2+ raises NoArgsIsHelpError for it (its own import, which the prelude cannot take away)
    result = subprocess.run([sys.executable, "-c", BEFORE_8_2.split("import click", 1)[0] + "from ponytail.entry import main\nsys.exit(main(sys.argv[1:]))",
                             "cdi"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and "generate" in result.stdout and "Traceback" not in result.stderr, result.stderr
