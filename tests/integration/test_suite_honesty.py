"""The suite tests what users run, on any machine: the installed command of the
environment under test (never a bare python3 from PATH), from any directory, with
whichever busybox the machine has."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.commands import PONYTAIL, PONYTAIL_RUNTIME, REPO, VENV_BIN
from support.fakehost import BUILD_DIR, C_DIR, copy_program, make_rootfs
from support.guard import BARE_PYTHON_EXIT, BARE_PYTHON_MESSAGE


def test_a_bare_python3_from_path_fails_loudly(tmp_path: Path) -> None:
    for name in ("python3", "python"):
        result = subprocess.run([name, "-c", "print('ran')"], capture_output=True, text=True, cwd=tmp_path)
        assert result.returncode == BARE_PYTHON_EXIT, (name, result)
        assert BARE_PYTHON_MESSAGE in result.stderr
        assert "ran" not in result.stdout
    # also from a shell script, the way the end-to-end tests run ponytail
    script = subprocess.run(["bash", "-c", "python3 -c 'print(1)'"], capture_output=True, text=True)
    assert script.returncode == BARE_PYTHON_EXIT and BARE_PYTHON_MESSAGE in script.stderr


def test_no_test_names_an_interpreter_from_path() -> None:
    bare = re.compile(r"""["'\s{(]python3?(\.\d+)?\s+-m\s+ponytail|["']python3?["']\s*,""")
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == "test_suite_honesty.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if bare.search(line) and "the names it guards" not in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "run the installed command (tests/support/commands.py), not python3 from PATH:\n" + "\n".join(offenders)


def test_the_commands_under_test_belong_to_the_interpreter_under_test() -> None:
    for command in (PONYTAIL, PONYTAIL_RUNTIME):
        script = Path(command[0])
        assert script.parent == VENV_BIN
        shebang = script.read_text().splitlines()[0]
        assert Path(shebang[2:].split()[0]).resolve() == Path(sys.executable).resolve(), shebang


def test_the_installed_command_runs_from_any_directory(tmp_path: Path) -> None:
    # no checkout in the working directory, no PYTHONPATH: the installed package is found on its own
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PONYTAIL_CONFIG")}
    result = subprocess.run([*PONYTAIL, "--help"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "info" in result.stdout


def test_a_dynamically_linked_program_runs_in_the_test_rootfs(tmp_path: Path) -> None:
    # Debian's plain busybox is dynamically linked (libresolv among others): the test
    # rootfs carries what a program links against, so either busybox works there
    program = BUILD_DIR / "bin" / "needs_resolv"
    program.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-o", str(program), str(C_DIR / "needs_resolv.c"), "-lresolv"], check=True)
    rootfs = make_rootfs(tmp_path / "rootfs", programs=())
    copy_program(str(program), rootfs, "/bin/needs_resolv")
    assert (rootfs / "lib/x86_64-linux-gnu/libresolv.so.2").exists() or (rootfs / "usr/lib/x86_64-linux-gnu/libresolv.so.2").exists()
    result = subprocess.run(["chroot", str(rootfs), "/bin/needs_resolv"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "resolv-b2s="
    result = subprocess.run(["chroot", str(rootfs), "/bin/sh", "-c", "echo sh-ok"], capture_output=True, text=True)
    assert result.stdout.strip() == "sh-ok", result.stderr


def test_gpu_check_says_in_one_line_that_this_machine_has_no_driver() -> None:
    # `make gpu-check` is for a machine with a real NVIDIA GPU; here there is none
    assert not Path("/proc/driver/nvidia/version").exists(), "this test expects a machine without an NVIDIA driver"
    result = subprocess.run(["make", "-s", "-C", str(REPO), "gpu-check"], capture_output=True, text=True, cwd="/", timeout=60)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpu-check:")]
    assert errors == [
        "gpu-check: no NVIDIA driver is loaded on this machine (/proc/driver/nvidia/version is missing): "
        "run it on a machine with an NVIDIA GPU and its driver"
    ], result.stderr
    assert "PASS" not in result.stdout
