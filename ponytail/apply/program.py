"""Run a host program from the hook (the host's ldconfig): forked, output kept, a deadline.

``subprocess`` costs ~4 ms of every container start to import (signal, threading,
selectors), and its wait with a timeout polls with sleeps. The hook needs only this:
fork, an optional step in the child before exec (ldconfig isolates itself there),
exec of the program through a descriptor, stdin from /dev/null, stdout and stderr
into one pipe, no other descriptor, SIGPIPE back to its default, / as working
directory; an exec failure comes back as OSError, as with subprocess; a pidfd says
when the program has ended, or it is killed at the deadline.

The program is executed through a descriptor opened before the hook entered the
container's mount namespace (``/proc/self/fd/N``), so nothing in the container can
swap it; the descriptor stays open across exec for a script's interpreter.
"""

from __future__ import annotations

import os
import select
import time

try:  # the C module under signal: already loaded at start-up, where signal costs ~0.5 ms
    from _signal import SIG_DFL, SIGKILL, SIGPIPE, SIGXFSZ, signal
except ImportError:  # pragma: no cover - another Python implementation
    from signal import SIG_DFL, SIGKILL, SIGPIPE, SIGXFSZ, signal

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~3 ms to import: for type checkers only
    from typing import Callable

MAX_OUTPUT_BYTES = 64 << 10


def run_program(
    program_fd: int,
    argv: list[str],
    env: dict[str, str],
    timeout_s: float,
    before_exec: Callable[[], None] | None = None,
) -> tuple[int, bytes]:
    """Run the program open at ``program_fd``; its exit status and its output (the
    last MAX_OUTPUT_BYTES of stdout and stderr). TimeoutError (it is killed) or OSError.

    ``before_exec`` runs in the child, with stdout and stderr already on the pipe; it
    may end the child with os._exit and a status of its own."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    error_read, error_write = os.pipe2(os.O_CLOEXEC)  # closed by a successful exec
    try:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _exec_child(program_fd, argv, env, write_end, error_write, before_exec)
        os.close(write_end)
        os.close(error_write)
        write_end = error_write = -1
        failure = os.read(error_read, 64)
        if failure:
            os.waitpid(pid, 0)
            errno = int(failure)
            raise OSError(errno, os.strerror(errno), argv[0])
        os.set_blocking(read_end, False)
        return _wait(pid, read_end, timeout_s)
    finally:
        for fd in (read_end, write_end, error_read, error_write):
            if fd >= 0:
                os.close(fd)


def _exec_child(
    program_fd: int, argv: list[str], env: dict[str, str], output: int, errors: int, before_exec: Callable[[], None] | None
) -> None:
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        keep = sorted({program_fd, errors})
        os.closerange(3, keep[0])  # no descriptor of the hook's, or of whoever started it
        os.closerange(keep[0] + 1, keep[-1])
        os.closerange(keep[-1] + 1, 1 << 20)
        os.set_inheritable(program_fd, True)
        os.chdir("/")
        signal(SIGPIPE, SIG_DFL)  # Python ignores both, and an ignored signal stays ignored across exec
        signal(SIGXFSZ, SIG_DFL)
        if before_exec is not None:
            before_exec()
        os.execve(f"/proc/self/fd/{program_fd}", argv, env)
    except OSError as e:
        os.write(errors, str(e.errno or 0).encode())
    finally:
        os._exit(127)


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
                os.kill(pid, SIGKILL)
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
