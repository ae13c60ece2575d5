"""ponytail.apply.program: how the hook runs the host's ldconfig (spawn, output, deadline)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ponytail.apply.program import MAX_OUTPUT_BYTES, run_program


def program(tmp_path: Path, script: str) -> int:
    path = tmp_path / "prog"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return os.open(path, os.O_PATH | os.O_CLOEXEC)


def test_status_and_output_of_both_streams_with_only_the_given_environment(tmp_path: Path) -> None:
    fd = program(tmp_path, 'echo "out $1 $PATH"; echo "err ${HOME:-unset}" >&2; read line || echo "stdin empty"; exit 3\n')
    status, output = run_program(fd, ["prog", "arg"], {"PATH": "/bin"}, timeout_s=10)
    os.close(fd)
    assert status == 3
    assert output.decode().splitlines() == ["out arg /bin", "err unset", "stdin empty"]


def test_the_program_is_the_descriptor_not_the_path(tmp_path: Path) -> None:
    fd = program(tmp_path, "echo first\n")
    (tmp_path / "prog").unlink()
    (tmp_path / "prog").write_text("#!/bin/sh\necho swapped\n")
    status, output = run_program(fd, ["prog"], {}, timeout_s=10)
    os.close(fd)
    assert (status, output) == (0, b"first\n")


def test_a_program_past_its_deadline_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    fd = program(tmp_path, f"echo $$ > {pid_file}; exec sleep 30\n")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out after 0.5 s"):
        run_program(fd, ["prog"], {"PATH": "/bin:/usr/bin"}, timeout_s=0.5)
    os.close(fd)
    assert time.monotonic() - start < 5
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_long_output_keeps_its_end(tmp_path: Path) -> None:
    fd = program(tmp_path, f"yes 0123456789 | head -c {MAX_OUTPUT_BYTES * 3}; echo; echo last line\n")
    status, output = run_program(fd, ["prog"], {"PATH": "/bin:/usr/bin"}, timeout_s=10)
    os.close(fd)
    assert status == 0 and len(output) == MAX_OUTPUT_BYTES
    assert output.endswith(b"\nlast line\n")


def test_a_file_that_cannot_be_executed_is_an_os_error(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_text("not a program")
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    with pytest.raises(PermissionError):
        run_program(fd, ["data"], {}, timeout_s=10)
    os.close(fd)


def test_sigpipe_is_back_to_its_default_in_the_program(tmp_path: Path) -> None:
    # Python ignores SIGPIPE; the program must not inherit that
    fd = program(tmp_path, "yes | head -c 1 >/dev/null; grep SigIgn /proc/self/status\n")
    status, output = run_program(fd, ["prog"], {"PATH": "/bin:/usr/bin"}, timeout_s=10)
    os.close(fd)
    assert status == 0 and b"Broken pipe" not in output
    ignored = int(output.split()[-1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), output


def test_the_program_gets_no_other_descriptor_and_runs_in_root(tmp_path: Path) -> None:
    opened = os.open(tmp_path, os.O_PATH)
    leaked = os.dup2(opened, 213)  # inheritable, as a descriptor handed down by a container runtime would be
    os.close(opened)
    fd = program(tmp_path, "pwd; ls /proc/self/fd\n")
    status, output = run_program(fd, ["prog"], {"PATH": "/bin:/usr/bin"}, timeout_s=10)
    os.close(fd)
    os.close(leaked)
    lines = output.decode().split()
    assert status == 0 and lines[0] == "/"
    assert "213" not in lines[1:], lines


def test_a_descriptor_handed_down_stays_open_in_the_caller(tmp_path: Path) -> None:
    opened = os.open(tmp_path, os.O_PATH)
    leaked = os.dup2(opened, 214)
    os.close(opened)
    fd = program(tmp_path, "exit 0\n")
    before = os.getcwd()
    assert run_program(fd, ["prog"], {}, timeout_s=10) == (0, b"")
    assert os.get_inheritable(leaked) and not os.get_inheritable(fd) and os.getcwd() == before
    os.close(fd)
    os.close(leaked)


ISOLATION_CHECK = """
import os, subprocess, sys
from ponytail.apply.ldconfig import run_ldconfig
rootfs, program, record = sys.argv[1:]
subprocess.run(["mount", "-t", "proc", "proc", rootfs + "/proc"], check=True)
namespace = os.stat("/proc/self/ns/mnt").st_ino
root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY)
program_fd = os.open(program, os.O_PATH | os.O_CLOEXEC)
print(run_ldconfig(program, program_fd, root_fd, ("/lib",)))
print(os.stat("/proc/self/ns/mnt").st_ino == namespace, os.path.ismount(rootfs + "/proc"))
"""


@pytest.mark.root
def test_ldconfig_runs_without_the_kernel_filesystems_under_the_rootfs_and_the_hook_comes_back(tmp_path: Path) -> None:
    """ldconfig sees no proc under the rootfs (its magic links lead out of the chroot), and the
    rootfs only through a view mounted nodev, nosuid, noexec (no device node of the image can be
    opened there); the hook is back in its own mount namespace afterwards, with the container's
    proc in place."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "proc").mkdir(parents=True)
    record = tmp_path / "seen"
    script = f'echo "$@" > {record}; cat /proc/self/mountinfo >> {record}; mkdir -p "$3/etc"; : > "$3/etc/ld.so.cache"\n'
    os.close(program(tmp_path, script))
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", ISOLATION_CHECK, str(rootfs), str(tmp_path / "prog"), str(record)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(rootfs), "True", "True"]
    args, *mounts = record.read_text().splitlines()
    assert args == f"-X -r {rootfs} /lib"
    assert any(line.split()[4] == "/proc" for line in mounts)  # the program's own view of the host
    under = [line.split() for line in mounts if line.split()[4].startswith(str(rootfs))]
    assert [m[4] for m in under] == [str(rootfs)], mounts  # the view of the rootfs, nothing under it
    assert {"nodev", "nosuid", "noexec"} <= set(under[0][5].split(",")), under


def test_the_signal_numbers_are_this_machine_s() -> None:
    from ponytail.apply import program as p

    assert (p.SIGKILL, p.SIGPIPE, p.SIGXFSZ) == (signal.SIGKILL, signal.SIGPIPE, signal.SIGXFSZ)
