"""ponytail.lite.argv, the hook's command line without click, reads what the click command reads."""

from __future__ import annotations

import warnings

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ponytail.cli.commands import cli
from ponytail.options import HookOptions, parse_hook_args

TOKENS = (
    "-config", "--config", "-config=/etc/p.toml", "--config=", "-root", "--root=/r", "-device", "--device", "0",
    "GPU-1,1", "-capabilities", "--capabilities=compute", "-libs", "--libs=/usr/lib/*.so", "-debug", "--debug",
    "-debug=1", "--debug=", "info", "list", "-h", "--help", "-version", "/tmp/rootfs", "-", "--", "---root",
    "-r", "--unknown", "-config=", "-=x", "=", "",
)


def click_reads(args: list[str]) -> HookOptions | None:
    """The options the click command would run the hook with, or None (help, a subcommand, an error)."""
    try:
        ctx = cli.make_context("ponytail", list(args))
    except (click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
        return None
    with warnings.catch_warnings():  # click 8.2 deprecates protected_args (the subcommand's name)
        warnings.simplefilter("ignore", DeprecationWarning)
        if ctx.protected_args or ctx.args:
            return None
    return HookOptions(**ctx.params)


@settings(max_examples=3000, deadline=None, database=None)
@given(args=st.lists(st.sampled_from(TOKENS), max_size=6))
def test_what_the_plain_parser_reads_click_reads_alike(args: list[str]) -> None:
    ours = parse_hook_args(args)
    if ours is not None:  # None leaves the command line to click
        assert click_reads(args) == ours, args


@pytest.mark.parametrize(
    "args",
    [
        [], ["-debug"], ["--debug"], ["-config", "/etc/p.toml"], ["--config=/etc/p.toml"], ["-root", "/r", "-device", "0,1"],
        ["--root", "/r", "--libs", "/usr/lib/x86_64-linux-gnu/libcuda.so.*", "--capabilities", "compute", "-debug"],
        ["-device", "-debug"],  # a value that looks like an option is still the value
    ],
)
def test_the_hooks_usual_command_lines_take_the_plain_parser(args: list[str]) -> None:
    assert parse_hook_args(args) is not None and parse_hook_args(args) == click_reads(args)
