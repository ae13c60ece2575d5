"""Run a function in a forked child and get its (JSON-able) result back, within a deadline.

Used for the few probes that must load a driver library into a process (libcuda for
the CUDA version, NVML for MIG UUIDs): the library and any thread it starts live and
die in the child, and this process stays single-threaded, as entering a mount
namespace requires.

A wedged GPU can make such a call block for ever, so the child:
- runs in a process group of its own, killed whole (with anything the library
  started) when the deadline passes;
- dies with the hook (PR_SET_PDEATHSIG): an engine that kills the hook at its own
  deadline leaves no orphan behind;
- has stdin, stdout and stderr on /dev/null: it never holds the engine's pipes open,
  so an engine waiting for the hook's output is never kept waiting by the child.
"""

from __future__ import annotations

import os
import select
import time

from ponytail.lite.plainjson import loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # not imported on the hook's path (tests/test_hook_imports.py)
    from collections.abc import Callable
    from typing import Any

PR_SET_PDEATHSIG = 1
SIGKILL = 9


class ChildTimeout(Exception):
    """The child did not answer within the deadline; it has been killed."""


def run_in_child(function: Callable[..., Any], *args: Any, timeout_s: float = 5.0) -> Any:
    """``function(*args)`` in a child process; its return value must be JSON-able.
    A crash or a non-JSON answer comes back as a string describing it; ChildTimeout
    when it has not answered within ``timeout_s`` seconds."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never return into the caller's code
        _child(function, args, read_fd, write_fd, parent)
    os.close(write_fd)
    try:
        os.setpgid(pid, pid)  # also done by the child: whichever runs first
    except OSError:
        pass  # it has already exec'd nothing and set it itself, or it is gone
    try:
        output = _read_until(read_fd, pid, time.monotonic() + timeout_s)
    finally:
        os.close(read_fd)
    if output is None:
        _kill_group(pid)
        raise ChildTimeout(f"did not answer within {timeout_s:g} s (killed)")
    wait_status = _kill_group(pid)  # anything it left running in its group goes with it
    try:
        answer = loads(output)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "ok" in answer:
        return answer["ok"]
    return f"the probe process failed (wait status {wait_status})"


def _child(function: Callable[..., Any], args: tuple, read_fd: int, write_fd: int, parent: int) -> None:
    status = 0
    try:
        os.close(read_fd)
        os.setpgid(0, 0)
        _die_with_parent(parent)
        _detach_standard_descriptors()
        import json  # in the child only: the parent reads the answer with plainjson

        payload = json.dumps({"ok": function(*args)}).encode()
        while payload:
            payload = payload[os.write(write_fd, payload):]
    except BaseException:  # noqa: BLE001 - report anything, then leave
        status = 1
    finally:
        os._exit(status)


def _detach_standard_descriptors() -> None:
    """stdin, stdout and stderr onto /dev/null, or closed where there is none (a bare chroot)."""
    try:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        for fd in (0, 1, 2):
            try:
                os.close(fd)
            except OSError:
                pass
        return
    for fd in (0, 1, 2):
        os.dup2(null, fd)


def _die_with_parent(parent: int) -> None:
    from ponytail.fs.libc import libc

    libc().prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(1)


def _read_until(fd: int, pid: int, deadline: float) -> bytes | None:
    """Everything the child writes until it closes its end; None at the deadline."""
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if not poller.poll(max(1, int(left * 1000))):
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _kill_group(pid: int) -> int:
    """Kill the child's process group (the child is not reaped yet, so its id names
    that group and no other), then reap the child; its wait status."""
    try:
        os.killpg(pid, SIGKILL)
    except OSError:
        pass
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return -1
