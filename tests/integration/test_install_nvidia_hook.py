"""``ponytail install-nvidia-hook``: links named nvidia-cdi-hook / nvidia-ctk to the ponytail command where
NVIDIA's specs look (a path given, the paths a spec names, a toolkit directory), removed again; another
vendor's file of that name is never replaced nor removed; the link answers as NVIDIA's hook binary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from support.engines import console_script
from support.harness import run_ponytail


def install(*args: str) -> subprocess.CompletedProcess:
    result = run_ponytail(["install-nvidia-hook", *args])
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(), result.stderr.decode())


def test_install_is_idempotent_and_uninstall_removes_only_its_links(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"cdiVersion": "0.5.0", "kind": "k8s.device-plugin.nvidia.com/gpu", "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}], "containerEdits": {
        "hooks": [{"hookName": "createContainer", "path": str(tmp_path / "plugin/nvidia-ctk"), "args": ["nvidia-ctk", "hook", "noop"]}]}}))
    args = ("--at", str(tmp_path / "bin/nvidia-cdi-hook"), "--spec", str(spec), "--toolkit-dir", str(tmp_path / "toolkit"))
    first = install(*args)
    assert first.returncode == 0, first.stderr
    links = [tmp_path / "bin/nvidia-cdi-hook", tmp_path / "plugin/nvidia-ctk", tmp_path / "toolkit/nvidia-cdi-hook"]
    assert all(os.path.realpath(link) == os.path.realpath(console_script("ponytail")) for link in links), first.stdout
    assert first.stdout.count("linked ") == 3, first.stdout
    again = install(*args)
    assert again.returncode == 0 and again.stdout.count("nothing changed") == 3, again.stdout
    removed = install(*args, "--uninstall")
    assert removed.returncode == 0 and removed.stdout.count("removed ") == 3, removed.stdout
    assert not any(os.path.lexists(link) for link in links)


@pytest.mark.parametrize("kind", ["file", "foreign-link"])
def test_another_vendors_hook_binary_is_never_replaced_nor_removed(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nvidia-cdi-hook"
    if kind == "file":
        path.write_text("#!/bin/sh\n# NVIDIA's hook\n")
        path.chmod(0o755)
    else:
        path.symlink_to("/usr/bin/nvidia-ctk")
    before = os.readlink(path) if path.is_symlink() else path.read_text()
    for args in ((), ("--uninstall",)):
        result = install("--at", str(path), *args)
        assert result.returncode == 1, result.stdout
        assert result.stderr.count("\n") == 1 and "another vendor's file" in result.stderr, result.stderr
        assert (os.readlink(path) if path.is_symlink() else path.read_text()) == before


def test_a_path_under_another_name_is_refused(tmp_path: Path) -> None:
    result = install("--at", str(tmp_path / "my-hook"))
    assert result.returncode == 2 and "end in nvidia-cdi-hook or nvidia-ctk" in result.stderr, result.stderr


@pytest.mark.parametrize("name, args, code, said", [
    ("nvidia-cdi-hook", ["frobnicate"], 2, "unknown hook subcommand 'frobnicate'"),
    ("nvidia-cdi-hook", ["create-symlinks", "--bogus"], 2, "unknown flag '--bogus'"),
    ("nvidia-ctk", ["cdi", "generate"], 2, "serves only 'nvidia-ctk hook SUBCOMMAND'"),
    ("nvidia-cdi-hook", ["update-ldcache", "--folder", "/usr/lib"], 2, "OCI state"),
])
def test_the_link_answers_as_nvidias_hook_binary(tmp_path: Path, name: str, args: list[str], code: int, said: str) -> None:
    link = tmp_path / name
    link.symlink_to(console_script("ponytail"))
    result = subprocess.run([str(link), *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == code and said in result.stderr and result.stderr.count("\n") == 1, (result.returncode, result.stderr)
