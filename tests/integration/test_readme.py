"""The README's commands work as written: every command of its ```sh blocks runs here, in order, in
one shell (so its `export`s and variables carry on as in the reader's), inside a private mount
namespace, against a simulated host built as `make demo` builds it (scripts/demo.py).

A command is changed only by SUBSTITUTIONS below (each says why), and only commands in SKIPPED are
left out (each says why; they show as skipped tests). Anything else the README gains is run: a
README that drifts from what ponytail does fails here. So that a README command can never change
this machine, every file system but the test's own directory (and /proc, /sys, /dev) is read-only
in the namespace the commands run in: a command that writes elsewhere fails the test instead."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from support.commands import REPO, VENV_BIN
from support.fakehost import FakeHost, gpus

README = REPO / "README.md"

# (text in a README command, what it becomes here, why)
SUBSTITUTIONS: list[tuple[str, str, str]] = [
    ("$PWD/demo/simulated-host/", "{demo}/simulated-host/", "the simulated driver, built for this test as scripts/demo.py builds it"),
    ("$PWD/.venv/bin", str(VENV_BIN), "the environment under test (make setup's .venv, or the fresh check's)"),
    ("/tmp/test-rootfs", "{tmp}/test-rootfs", "a rootfs of this test's own"),
    ("/etc/ponytail/", "{tmp}/etc/ponytail/", "never write this machine's config"),
    ("sudo ", "", "the tests run as root"),
]
# the start of a README command -> why this test does not run it
SKIPPED: dict[str, str] = {
    "make demo": "sets this machine up (apt-get, a .venv) before the demo; the commands after it use what it builds, made here",
    "make test": "runs the whole suite, this test included",
    "pip install .": "installs into an environment; the tests run the one make setup installed",
    "make deb": "builds the Debian package: tests/deb/test_deb.py builds it from a clean clone and installs it in a Debian 12 root",
    "sudo apt install ./dist/": "installs into this machine: tests/deb/test_deb.py installs the package in a pristine Debian 12 root",
    "sudo systemctl ": "enables the package's guard unit on a node with systemd: tests/node/test_node.py runs it in a booted node",
}
# the start of a README command -> the exit statuses the README says it may end with
EXIT_STATUS: dict[str, tuple[int, ...]] = {
    "ponytail check": (0, 1),  # "on a host where an engine is not registered yet it exits 1"
}


def readme_commands() -> list[str]:
    """Every command of the README's ```sh blocks, in order (comment-only and blank lines dropped)."""
    commands, in_block = [], False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            in_block = line.strip() == "```sh" if not in_block else False
            continue
        if in_block and line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
    return commands


def _skipped(command: str) -> str | None:
    return next((why for start, why in SKIPPED.items() if command.startswith(start)), None)


def _script(commands: list[str], values: dict[str, str]) -> str:
    """A bash script that makes every mount but ``values["tmp"]`` read-only, then runs each command as
    written (but for SUBSTITUTIONS) and stops at the first that ends with an exit status the README
    does not give it."""
    tmp = values["tmp"]
    lines = [
        f"mount --bind {tmp} {tmp} || exit 1",
        "findmnt -rn -o TARGET | while read -r m; do case $m in /proc*|/sys*|/dev*|" + tmp + "*) ;; "
        '*) mount -o remount,bind,ro "$m" 2>/dev/null ;; esac; done',
        "touch /etc/.readme-test 2>/dev/null && { echo 'the machine is still writable: not running the README' >&2; exit 1; }",
    ]
    for command in commands:
        if _skipped(command):
            continue
        text = command
        for old, new, _ in SUBSTITUTIONS:
            text = text.replace(old, new.format(**values))
        allowed = next((codes for start, codes in EXIT_STATUS.items() if command.startswith(start)), (0,))
        quoted = shlex.quote(command)
        lines += [
            f"echo + {quoted} >&2",
            text,
            f"rc=$?; case $rc in {'|'.join(map(str, allowed))}) ;; *) echo \"README command failed (exit $rc): \"{quoted} >&2; exit 1;; esac",
        ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", [c for c in readme_commands() if _skipped(c)])
def test_readme_commands_that_cannot_run_here(command: str) -> None:
    pytest.skip(f"README: {command!r}: {_skipped(command)}")


def test_the_skip_and_exit_tables_name_commands_the_readme_has() -> None:
    commands = readme_commands()
    for start in (*SKIPPED, *EXIT_STATUS):
        assert any(c.startswith(start) for c in commands), f"{start!r} is no longer in the README: take it out of the table"
    assert commands[:2] == ["make demo   # install what the demo needs, inject this machine's GPUs into a demo rootfs, run nvidia-smi in it",
                            "make test   # set up (Debian packages, a .venv) and run every test"]


def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    FakeHost(demo / "simulated-host", gpu_list=gpus(2, minors=[1, 0])).write_config()  # as scripts/demo.py builds it
    commands = readme_commands()
    script = _script(commands, {"demo": str(demo), "tmp": str(tmp_path)})
    rootfs = tmp_path / "test-rootfs"
    script += f'findmnt -rn -o TARGET | grep -q "^{rootfs}" && {{ echo "mounts left under {rootfs}" >&2; exit 1; }}\nexit 0\n'
    env = {k: v for k, v in os.environ.items() if not k.startswith("PONYTAIL")}
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-u", "-c", script],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    ran = [c for c in commands if not _skipped(c)]
    assert len(ran) >= 15 and result.stderr.count("\n+ ") + 1 >= len(ran), result.stderr
    # the manual-mode runs gave a rootfs in which nvidia-smi works, and said nothing is amiss
    assert result.stdout.count("Driver Version: 550.54.15") == 2, result.stdout
    assert "ponytail: warning" not in result.stderr and "ponytail: error" not in result.stderr, result.stderr
    assert (tmp_path / "etc/ponytail/config.toml").read_bytes() == (REPO / "config/config.toml").read_bytes()
    assert re.search(r"index 0 +minor 1", result.stdout), result.stdout  # ponytail info saw the simulated GPUs
