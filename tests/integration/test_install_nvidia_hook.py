"""``ponytail install-nvidia-hook``: scripts named nvidia-cdi-hook / nvidia-ctk that run the ponytail command where
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
    assert all(os.access(link, os.X_OK) and console_script("ponytail") in link.read_text() for link in links), first.stdout
    assert first.stdout.count("wrote ") == 3, first.stdout
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


@pytest.mark.parametrize("name, args, code, said, config", [
    ("nvidia-cdi-hook", ["frobnicate"], 0, "unsupported CDI hook: frobnicate", ""),  # as NVIDIA's: a spec from a newer toolkit starts
    ("nvidia-ctk", ["hook", "create-devices", "--x"], 0, "unsupported CDI hook: create-devices", ""),
    ("nvidia-cdi-hook", ["frobnicate"], 1, "a hook ponytail does not serve", '[cdi]\nunknown_nvidia_hooks = "fail"\n'),
    ("nvidia-cdi-hook", ["create-symlinks", "--bogus"], 2, "unknown flag '--bogus'", ""),
    ("nvidia-ctk", ["cdi", "generate"], 2, "serves only 'nvidia-ctk hook SUBCOMMAND'", ""),
    ("nvidia-cdi-hook", ["update-ldcache", "--folder", "/usr/lib"], 2, "OCI state", ""),
])
@pytest.mark.parametrize("how", ["script", "link"])
def test_the_link_answers_as_nvidias_hook_binary(tmp_path: Path, name: str, args: list[str], code: int, said: str, config: str, how: str) -> None:
    link = tmp_path / name
    if how == "script":
        assert install("--at", str(link)).returncode == 0
    else:
        link.symlink_to(console_script("ponytail"))
    (tmp_path / "config.toml").write_text(f'[log]\nfile = "{tmp_path}/log"\n{config}')
    result = subprocess.run([str(link), *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PONYTAIL_CONFIG": str(tmp_path / "config.toml")})
    assert result.returncode == code and said in result.stderr and result.stderr.count("\n") == 1, (result.returncode, result.stderr)
    if code == 0:
        assert said in (tmp_path / "log").read_text()


@pytest.mark.parametrize("colon", [":", ": "])  # runc's compact JSON; a writer that puts a space after the colon
def test_the_script_leaves_a_start_whose_hooks_are_done_to_the_shell(tmp_path: Path, colon: str) -> None:
    """The later hooks of a start exit in the shell when the first left this start's mark in the bundle
    (named by their parent, newer than config.json); otherwise ponytail gets the state as it came."""
    stub = tmp_path / "stub"
    stub.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args; cat > {tmp_path}/stdin\n')
    stub.chmod(0o755)
    hook = tmp_path / "bin/nvidia-cdi-hook"
    assert install("--at", str(hook), "--path", str(stub)).returncode == 0
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text("{}")
    state = '{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":0,"bundle"' + colon + '"' + str(bundle) + '"}'

    def run() -> bool:
        (tmp_path / "args").unlink(missing_ok=True)
        result = subprocess.run([str(hook), "update-ldcache", "--folder", "/usr/lib"], input=state, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        return (tmp_path / "args").exists()

    assert run() and (tmp_path / "args").read_text() == f"nvidia-hook {hook} update-ldcache --folder /usr/lib\n"
    assert (tmp_path / "stdin").read_text().strip() == state
    mark = bundle / f".ponytail-nvidia-hooks-done.{os.getpid()}"
    mark.touch()
    os.utime(bundle / "config.json", (1, 1))
    assert not run()  # this start's mark: done
    os.utime(bundle / "config.json")
    os.utime(mark, (1, 1))
    assert run()  # a mark older than config.json is an earlier start's
    other = bundle / ".ponytail-nvidia-hooks-done.1"
    mark.rename(other)
    os.utime(other)
    assert run()  # another start's parent
