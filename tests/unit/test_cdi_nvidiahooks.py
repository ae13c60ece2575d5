"""NVIDIA's hook command lines of a spec read before a start, with the hook's own parser: every line of
nvidia-ctk 1.20.0's captured specs is served; an unknown subcommand and an unknown flag are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ponytail.cdi.nvidiahooks import unserved
from ponytail.cdi.skim import spec_hooks
from ponytail.errors import UsageError
from ponytail.hooks.nvidia import UnknownSubcommand, parse, parse_hook_line

from support.nvidia_tools import SPECS

HOOK = "/usr/bin/nvidia-cdi-hook"


@pytest.mark.parametrize("spec", sorted(SPECS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_hook_line_of_nvidias_captured_specs_is_served(spec: Path) -> None:
    hooks = spec_hooks(yaml.safe_load(spec.read_text().replace("@FAKEHOST@", "/host-root")))
    assert hooks and all(isinstance(parse_hook_line(path, list(args)), tuple) for path, args in hooks)
    assert unserved(hooks) == []


def test_a_hook_line_is_read_as_the_hook_reads_it() -> None:
    args = ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"]
    assert parse_hook_line(HOOK, args) == parse("nvidia-cdi-hook", args[1:]) == ("update-ldcache", (("folder", ("/usr/lib64",)),))
    assert parse_hook_line("/usr/bin/nvidia-ctk", ["nvidia-ctk", "hook", "chmod", "--mode", "755", "--path", "/dev/dri"])[0] == "chmod"  # type: ignore[index]
    assert parse_hook_line("/usr/local/bin/ponytail", ["ponytail", "cdi-hook"]) is None  # not one of NVIDIA's names
    unknown = parse_hook_line(HOOK, ["nvidia-cdi-hook", "frobnicate", "--x"])
    assert isinstance(unknown, UnknownSubcommand) and unknown.subcommand == "frobnicate"
    flag = parse_hook_line(HOOK, ["nvidia-cdi-hook", "create-symlinks", "--bogus"])
    assert isinstance(flag, UsageError) and not isinstance(flag, UnknownSubcommand) and "unknown flag '--bogus'" in flag.message


def test_unserved_lines_are_named_once_with_what_a_start_does() -> None:
    hooks = [
        (HOOK, ("nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64")),
        (HOOK, ("nvidia-cdi-hook", "frobnicate", "--x")),
        (HOOK, ("nvidia-cdi-hook", "create-symlinks", "--bogus", "a::/b")),
        (HOOK, ("nvidia-cdi-hook", "frobnicate", "--x")),  # a device's, the same line
        ("/opt/other/hook", ("hook", "frobnicate")),  # not NVIDIA's hook: not ponytail's to serve
    ]
    subcommand, flag = unserved(hooks)
    assert (subcommand.line, subcommand.subcommand) == (f"{HOOK} frobnicate --x", "frobnicate")
    assert (flag.line, flag.subcommand) == (f"{HOOK} create-symlinks --bogus a::/b", "") and "'--bogus'" in flag.why
    assert not subcommand.stops_a_start(False) and subcommand.stops_a_start(True) and flag.stops_a_start(False)
    assert "each start skips it with a warning" in subcommand.said("spec.yaml", False)
    assert 'unknown_nvidia_hooks = "fail" stops every start' in subcommand.said("spec.yaml", True)
    assert "every start with it stops" in flag.said("spec.yaml", False) and "'--bogus'" in flag.said("spec.yaml", None)
    long = unserved([(HOOK, ("nvidia-cdi-hook", "create-symlinks", *(f"--lonk=a{i}::/b" for i in range(40))))])
    assert len(long[0].line) == 120 and long[0].line.endswith("...")
