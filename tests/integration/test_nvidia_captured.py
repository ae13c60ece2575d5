"""ponytail's reading of NVIDIA's hook command lines against what NVIDIA's tools 1.20.0 wrote and printed
(../shared/nvidia): every hook of every captured spec is one ponytail serves, every subcommand and flag the
hook's --help lists is one it takes, and a subcommand 1.20.0 does not list is told apart from an unknown flag."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ponytail.errors import UsageError
from ponytail.hooks import nvidia as nvidiahook

from support.nvidia_tools import HELP, SPECS

SPEC_FILES = sorted(p for p in SPECS.glob("*-*.*") if "manifest" not in p.name)
HELP_SUBCOMMANDS = ("update-ldcache", "create-symlinks", "chmod", "enable-cuda-compat", "disable-device-node-modification",
                    "update-application-profile")


def _hooks(path: Path) -> list[list[str]]:
    spec = (json.loads if path.suffix == ".json" else yaml.safe_load)(path.read_text().replace("@FAKEHOST@", "/fakehost"))
    edits = [spec.get("containerEdits", {}), *(d["containerEdits"] for d in spec["devices"])]
    return [h["args"] for e in edits for h in e.get("hooks", [])]


def test_the_captured_data_is_here() -> None:
    assert len(SPEC_FILES) == 6 and all((HELP / f"nvidia-cdi-hook-{s}.txt").is_file() for s in HELP_SUBCOMMANDS), SPEC_FILES


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_every_hook_nvidia_ctk_wrote_is_served(path: Path) -> None:
    hooks = _hooks(path)
    assert hooks, path
    for args in hooks:
        assert args[0] == "nvidia-cdi-hook", args
        subcommand, _ = nvidiahook.parse(args[0], args[1:])
        assert subcommand == args[1]


def test_every_subcommand_and_flag_of_the_hooks_help_is_taken() -> None:
    for name in ("nvidia-cdi-hook.txt", "nvidia-ctk-hook.txt"):
        commands = (HELP / name).read_text().split("COMMANDS:")[1].split("OPTIONS:")[0]
        listed = set(re.findall(r"^   ([a-z-]+)[ ,]", commands, re.M)) - {"help"}
        assert listed == set(HELP_SUBCOMMANDS) and listed <= set(nvidiahook.SUBCOMMANDS), (name, listed)
    for subcommand in HELP_SUBCOMMANDS:
        options = (HELP / f"nvidia-cdi-hook-{subcommand}.txt").read_text().split("OPTIONS:")[1].split("GLOBAL OPTIONS:")[0]
        flags = {f for f in re.findall(r"^   --([a-z-]+)", options, re.M) if f != "help"}
        assert flags <= set(nvidiahook.SUBCOMMANDS[subcommand]), (subcommand, flags)


def test_a_subcommand_1_20_does_not_list_is_not_a_usage_error_but_an_unknown_flag_is() -> None:
    """1.20.0 warns on create-soname-symlinks and exits 0 (its --help says so); ponytail serves it. A subcommand
    neither knows is ponytail's warning too; an unknown flag of a known subcommand stays an error."""
    said = (HELP / "nvidia-cdi-hook-create-soname-symlinks.txt").read_text()
    assert "Unsupported CDI hook: create-soname-symlinks" in said
    assert nvidiahook.parse("nvidia-cdi-hook", ["create-soname-symlinks", "--folder", "/usr/lib64"])[0] == "create-soname-symlinks"
    with pytest.raises(nvidiahook.UnknownSubcommand):
        nvidiahook.parse("nvidia-cdi-hook", ["create-device-links", "--x"])
    with pytest.raises(UsageError) as raised:
        nvidiahook.parse("nvidia-cdi-hook", ["update-ldcache", "--no-such-flag"])
    assert not isinstance(raised.value, nvidiahook.UnknownSubcommand)
