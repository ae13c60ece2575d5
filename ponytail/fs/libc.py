"""The one door to the C library and the raw system calls Python's os module lacks.

One ctypes handle of libc for the whole process (``libc()``), one check that turns a failed
call into ``OSError(errno, strerror, path)`` (``check``; errno names come from the errno
module, never as numbers), and the system-call numbers by machine (``syscall_number``): a
machine not in the table is refused with one line rather than sent a number that means
another system call there. ``syscall`` puts the three together.

The numbers come from the kernel's tables (arch/*/syscall*.tbl and asm-generic/unistd.h, as
collected in libseccomp's syscalls.csv): every call from 424 on has one number on all the
machines listed; bpf(2) predates that and differs. Machines whose ABI offsets the numbers
(mips, alpha, ia64) or whose longs are 32 bits (arm, i386: fs.kernelfs's statfs layout)
are not listed.
"""

from __future__ import annotations

import ctypes
import os

from ponytail.errors import InjectionError

# uname -m -> the number of bpf(2)
_BPF: dict[str, int] = {
    "x86_64": 321,
    "aarch64": 280,
    "riscv64": 280,
    "loongarch64": 280,
    "ppc64le": 361,
    "ppc64": 361,
    "s390x": 351,
}
# the same number on each of the machines above
_UNIFIED: dict[str, int] = {
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "openat2": 437,
    "mount_setattr": 442,
}
MACHINES = tuple(_BPF)

_libc: ctypes.CDLL | None = None
_numbers: dict[str, ctypes.c_long] = {}


def libc() -> ctypes.CDLL:
    """The process's C library (errno kept for ``check``); ``syscall`` returns a long."""
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        _libc = lib
    return _libc


def syscall_numbers(machine: str) -> dict[str, int]:
    """The numbers of the system calls ponytail makes through ``syscall`` on ``machine``
    (``uname -m``); InjectionError on a machine not in the table."""
    if machine not in _BPF:
        raise InjectionError(
            f"ponytail does not know the system call numbers of this machine ({machine}); "
            f"it runs on {', '.join(MACHINES)}"
        )
    return {**_UNIFIED, "bpf": _BPF[machine]}


def syscall_number(name: str) -> ctypes.c_long:
    """The number of the system call ``name`` on this machine (looked up once)."""
    number = _numbers.get(name)
    if number is None:
        number = _numbers[name] = ctypes.c_long(syscall_numbers(os.uname().machine)[name])
    return number


def error(what: str | None = None, path: str | None = None) -> OSError:
    """The OSError of the last failed call (its errno), its message prefixed with ``what``."""
    err = ctypes.get_errno()
    message = os.strerror(err) if what is None else f"{what}: {os.strerror(err)}"
    return OSError(err, message) if path is None else OSError(err, message, path)


def check(result: int, what: str | None = None, path: str | None = None) -> int:
    """``result`` of a libc call or system call; OSError (``error``) when it is negative."""
    if result < 0:
        raise error(what, path)
    return int(result)


def syscall(name: str, *args: object, what: str | None = None, path: str | None = None) -> int:
    """The system call ``name`` by its number on this machine, checked."""
    return check(libc().syscall(syscall_number(name), *args), what if what is not None else name, path)

