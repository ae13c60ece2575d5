"""ponytail.lite.argv, the plain command lines without click (the hook's, cdi-hook's, info's,
cdi generate's), reads what the click command reads."""

from __future__ import annotations

import inspect
import warnings

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ponytail.cdi.generate import run_generate
from ponytail.cli.cdigenerate import parse_generate_args
from ponytail.cli.commands import cli
from ponytail.cli.info import parse_info_args
from ponytail.hooks.cdi import parse_args as parse_cdi_hook_args
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


def subcommand_reads(words: tuple[str, ...], args: list[str]) -> dict[str, object] | None:
    """The parameters the click subcommand ``words`` would run with, or None (help, an error, a stray word)."""
    command: click.Command = cli
    for word in words:
        assert isinstance(command, click.Group)
        command = command.commands[word]
    try:
        ctx = command.make_context(words[-1], list(args))
    except (click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
        return None
    return None if ctx.args else dict(ctx.params)


INFO_TOKENS = ("-json", "--json", "--json=1", "-config", "--config", "--config=/c.toml", "-config=", "/c.toml", "info", "-h", "--", "-", "-j", "")
GENERATE_TOKENS = (
    "--output", "-output=/etc/cdi/nvidia.yaml", "x.json", "-format", "--format=json", "yaml", "xml", "--device-name-strategy",
    "-device-name-strategy=uuid", "both", "--spec-version", "0.5.0", "-capabilities", "--capabilities=compute", "all",
    "--hook-path", "-hook-path=/usr/bin/ponytail", "-config", "/c.toml", "--config=", "-h", "--bogus", "-", "",
)
CDI_HOOK_TOKENS = (
    "-config", "--config=/c.toml", "/c.toml", "--driver-version", "550.54.15", "--link", "/usr/lib/libcuda.so.1",
    "libcuda.so.550", "/usr/lib/libcuda.so.550", "--mask-proc", "-mask-proc", "--mask-proc=1", "--ldconfig", "-ldconfig=/sbin/ldconfig",
    "--directory", "/usr/lib", "-directory=/lib", "--check", "libcuda.so.1", "-h", "--bogus", "--", "",
    "--major", "nvidia-frontend", "195", "--gpu", "2", "0000:3b:00.0", "GPU-1",
    "--device-link", "/dev/dri/by-path/pci-0000:3b:00.0-card", "../card1",
)
GENERATE_DEFAULTS = {name: p.default for name, p in inspect.signature(run_generate).parameters.items()}
CDI_HOOK_DEFAULTS = {
    "config": None, "driver_version": None, "major": (), "gpu": (), "link": (), "device_link": (), "mask_proc": False, "ldconfig": None, "directory": (), "check": (),
}
@given(args=st.lists(st.sampled_from(INFO_TOKENS), max_size=5))
def test_info_reads_what_click_reads(args: list[str]) -> None:
    ours = parse_info_args(["info", *args])
    if ours is not None:
        click_params = subcommand_reads(("info",), args)
        assert click_params is not None and (click_params["as_json"], click_params["config"]) == ours, args
@given(args=st.lists(st.sampled_from(GENERATE_TOKENS), max_size=7))
def test_cdi_generate_reads_what_click_reads(args: list[str]) -> None:
    ours = parse_generate_args(["cdi", "generate", *args])
    if ours is not None:
        assert subcommand_reads(("cdi", "generate"), args) == {**GENERATE_DEFAULTS, **ours}, args
@given(args=st.lists(st.sampled_from(CDI_HOOK_TOKENS), max_size=9))
def test_cdi_hook_reads_what_click_reads(args: list[str]) -> None:
    ours = parse_cdi_hook_args(args)
    if ours is not None:
        assert subcommand_reads(("cdi-hook",), args) == {**CDI_HOOK_DEFAULTS, **ours}, args


@pytest.mark.parametrize(
    "words, args, parse",
    [
        (("info",), ["--json", "-config", "/c.toml"], lambda a: parse_info_args(["info", *a])),
        (("info",), ["-config=/c.toml", "-json"], lambda a: parse_info_args(["info", *a])),
        (("cdi", "generate"), ["--output", "/etc/cdi/nvidia.yaml", "--format=json", "-device-name-strategy", "uuid", "-config", "/c.toml"],
         lambda a: parse_generate_args(["cdi", "generate", *a])),
        (("cdi-hook",), ["-config", "/c.toml", "--driver-version", "550.54.15", "--major", "nvidia-frontend", "195",
                         "--gpu", "2", "0000:3b:00.0", "GPU-1", "--link", "/l/libcuda.so.1", "libcuda.so.550", "/l/libcuda.so.550",
                         "--link", "/l/libnvidia-ml.so.1", "libnvidia-ml.so.550", "/l/libnvidia-ml.so.550", "--mask-proc",
                         "--ldconfig", "/sbin/ldconfig", "--directory", "/l", "--check", "libcuda.so.1", "/l/libcuda.so.550"], parse_cdi_hook_args),
    ],
)
def test_the_usual_command_lines_take_the_plain_parser(words: tuple[str, ...], args: list[str], parse) -> None:  # type: ignore[no-untyped-def]
    ours = parse(args)
    click_params = subcommand_reads(words, args)
    assert ours is not None and click_params is not None
    if words == ("info",):
        assert (click_params["as_json"], click_params["config"]) == ours
    else:
        assert click_params == {**(GENERATE_DEFAULTS if words[0] == "cdi" else CDI_HOOK_DEFAULTS), **ours}
