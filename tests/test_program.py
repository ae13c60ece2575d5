"""ponytail.apply.program: how the hook runs the host's ldconfig (spawn, output, deadline)."""

from __future__ import annotations

import os
import signal
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


def test_a_step_before_exec_runs_in_the_child_and_may_end_it(tmp_path: Path) -> None:
    fd = program(tmp_path, "echo ran\n")

    def refuse() -> None:
        os.write(2, b"refused in the child\n")
        os._exit(125)

    assert run_program(fd, ["prog"], {}, timeout_s=10, before_exec=refuse) == (125, b"refused in the child\n")
    marker = tmp_path / "marker"
    status, output = run_program(fd, ["prog"], {}, timeout_s=10, before_exec=lambda: marker.write_text(str(os.getpid())))
    os.close(fd)
    assert (status, output) == (0, b"ran\n") and int(marker.read_text()) != os.getpid()
