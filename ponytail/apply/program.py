"""Run a host program from the hook (the host's ldconfig): spawned, output kept, a deadline.

``subprocess`` would be imported on every container start (with signal, threading,
selectors), and its wait with a timeout polls with sleeps; forking the hook's whole
interpreter costs more than ``posix_spawn``, which starts the program without copying
it (bench/phases.py's ldconfig phase). The hook needs only this: the program executed through a descriptor,
stdin from /dev/null, stdout and stderr into one pipe, no other descriptor, SIGPIPE
and SIGXFSZ back to their defaults, / as working directory, a process group of its own;
an exec failure comes back as OSError, as with subprocess; a pidfd says when the
program has ended, or its whole process group is killed at the deadline.

The program is executed through a descriptor opened before the hook entered the
container's mount namespace (``/proc/self/fd/N``), so nothing in the container can
swap it; the descriptor stays open across exec for a script's interpreter.
"""

from __future__ import annotations

import os
import select
import time

MAX_OUTPUT_BYTES = 64 << 10
# Linux's numbers (asm-generic/signal.h: x86_64, aarch64, ppc64le), not imported from
# ``signal``, whose enums would bring enum, functools and collections onto the hook's path;
# tests/unit/test_program.py holds them to the signal module's
SIGKILL, SIGPIPE, SIGXFSZ = 9, 13, 25


def run_program(program_fd: int, argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
    """Run the program open at ``program_fd``; its exit status and its output (the
    last MAX_OUTPUT_BYTES of stdout and stderr). TimeoutError (it is killed) or OSError."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, write_end, 1),
            (os.POSIX_SPAWN_DUP2, write_end, 2),
        ]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_descriptors(keep=program_fd)]
        os.set_inheritable(program_fd, True)
        os.chdir("/")  # posix_spawn has no working directory of its own before Python 3.13
        try:
            pid = os.posix_spawn(f"/proc/self/fd/{program_fd}", argv, env, file_actions=actions, setsigdef=(SIGPIPE, SIGXFSZ), setpgroup=0)
        finally:
            os.fchdir(cwd)
            os.set_inheritable(program_fd, False)
        os.close(write_end)
        write_end = -1
        os.set_blocking(read_end, False)
        return _wait(pid, read_end, timeout_s)
    finally:
        for fd in (read_end, write_end, cwd):
            if fd >= 0:
                os.close(fd)


def _inheritable_descriptors(keep: int) -> list[int]:
    """This process's descriptors above stderr that an exec would pass on (those of whoever
    started the hook, e.g. a container runtime's), but ``keep``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                if os.get_inheritable(fd):
                    found.append(fd)
            except OSError:  # the descriptor of the listing itself, closed by now
                pass
    return found


def _wait(pid: int, output_fd: int, timeout_s: float) -> tuple[int, bytes]:
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(output_fd, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        deadline = time.monotonic() + timeout_s
        output = bytearray()
        ended = False
        while not ended:
            left = deadline - time.monotonic()
            if left <= 0:
                os.killpg(pid, SIGKILL)  # not reaped yet: its id still names its group
                os.waitpid(pid, 0)
                raise TimeoutError(f"timed out after {timeout_s:g} s")
            for fd, _ in poller.poll(max(1, int(left * 1000))):
                if fd == pidfd:
                    ended = True
                elif not _drain(output_fd, output):
                    poller.unregister(output_fd)
        _drain(output_fd, output)  # what it wrote just before it ended
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), bytes(output)


def _drain(fd: int, output: bytearray) -> bool:
    """Read what is there; False at end of file."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        output += chunk
        del output[:-MAX_OUTPUT_BYTES]
