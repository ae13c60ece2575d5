"""ponytail.fs.libc, the one syscall layer: its numbers are the kernel's (checked against the
installed kernel headers), a machine it does not know is refused with one line instead of being
sent a number that is another system call there, and a failed call's OSError names its path."""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest

from ponytail.errors import InjectionError

HEADERS = {  # uname -m -> the kernel's header that numbers its system calls
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),  # riscv64 and loongarch64 use it too
    "riscv64": Path("/usr/include/asm-generic/unistd.h"),
}


@pytest.mark.parametrize("machine", HEADERS)
def test_the_numbers_are_the_kernels(machine: str) -> None:
    from ponytail.fs.libc import syscall_numbers

    if not HEADERS[machine].exists():
        pytest.skip(f"no {HEADERS[machine]} here")
    text = HEADERS[machine].read_text()
    numbers = syscall_numbers(machine)
    assert set(numbers) >= {"bpf", "openat2", "open_tree", "move_mount", "mount_setattr", "fsopen", "fsconfig", "fsmount"}
    for name, number in numbers.items():
        found = re.search(rf"#define __NR_{name}\s+(\d+)", text)
        assert found is not None and int(found.group(1)) == number, (machine, name)


def _pretend_machine(monkeypatch: pytest.MonkeyPatch, machine: str) -> None:
    real = os.uname()
    monkeypatch.setattr(os, "uname", lambda: os.uname_result((real.sysname, real.nodename, real.release, real.version, machine)))
    try:
        import ponytail.fs.libc

        monkeypatch.setattr(ponytail.fs.libc, "_numbers", {})  # looked up again, on the pretended machine
    except ImportError:
        pass


@pytest.mark.parametrize("machine", ["mips64", "alpha", "ia64", "sparc64"])
def test_bpf_on_a_machine_not_in_the_table_is_refused_not_sent_another_number(monkeypatch: pytest.MonkeyPatch, machine: str) -> None:
    from ponytail.apply import bpf

    _pretend_machine(monkeypatch, machine)
    try:
        importlib.reload(bpf)  # its number was once chosen when it was imported
        fd = os.open("/sys/fs/cgroup", os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(InjectionError, match=f"system call numbers of this machine \\({machine}\\)"):
                bpf.query_device_programs(fd)
        finally:
            os.close(fd)
    finally:
        monkeypatch.undo()
        importlib.reload(bpf)


def test_openat2_on_a_machine_not_in_the_table_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ponytail.fs.inroot import openat2_in_root

    _pretend_machine(monkeypatch, "mips64")
    root = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(InjectionError, match="mips64"):
            os.close(openat2_in_root(root, "/", os.O_PATH))
    finally:
        os.close(root)


def test_a_failed_open_in_the_root_names_its_path(tmp_path: Path) -> None:
    from ponytail.fs.inroot import openat2_in_root

    root = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(FileNotFoundError) as missing:
            openat2_in_root(root, "/etc/missing", os.O_RDONLY)
    finally:
        os.close(root)
    assert missing.value.filename == "/etc/missing" and missing.value.strerror == os.strerror(2)
