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
  so an engine waiting for the hook's output is never kept waiting by the child;
- closes every other descriptor it inherited (the run log, open for appending; the
  container's namespace and rootfs; a cache) but its answer pipe and the ``keep_fds`` the
  function needs (the library file it loads), before it runs anything else: driver code
  never holds what root opened.

A driver library is code from wherever the driver root or a registered driver tree
says, so with ``unprivileged=True`` (the CUDA version) a child of root gives up root
before it runs ``function``: a mount namespace of its own in which every mount is
read-only, no capability left (the bounding set emptied too), no supplementary group,
user and group nobody (65534), PR_SET_NO_NEW_PRIVS (no set-uid or file capability can
give any of it back) and not dumpable (another process of nobody cannot attach to it).
It checks all of that in /proc/self/status before going on; anything amiss and the
function never runs.
"""

from __future__ import annotations

import os
import select
import time

from ponytail.lite.plainjson import loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # not imported on the hook's path (tests/integration/test_hook_imports.py)
    from collections.abc import Callable
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAPBSET_READ = 23
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_IS_SET = 1
CAPABILITY_VERSION_3 = 0x20080522
SIGKILL = 9
NOBODY = 65534
CLONE_NEWNS = 0x00020000
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
EINVAL = 22
MAX_FD = 1 << 20  # above the kernel's nr_open default: os.closerange uses close_range(2), one call


class ChildTimeout(Exception):
    """The child did not answer within the deadline; it has been killed."""


def run_in_child(
    function: Callable[..., Any], *args: Any, timeout_s: float = 5.0, unprivileged: bool = False, keep_fds: tuple[int, ...] = ()
) -> Any:
    """``function(*args)`` in a child process; its return value must be JSON-able.
    A crash or a non-JSON answer comes back as a string describing it; ChildTimeout
    when it has not answered within ``timeout_s`` seconds. ``unprivileged``: a child of
    root runs ``function`` as nobody, confined (see above); one that cannot be confined
    answers with a string saying why. ``keep_fds``: the descriptors ``function`` uses; every
    other one but stdin, stdout and stderr (on /dev/null) is closed in the child."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never return into the caller's code
        _child(function, args, read_fd, write_fd, parent, unprivileged, keep_fds)
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


def _child(
    function: Callable[..., Any], args: tuple, read_fd: int, write_fd: int, parent: int, unprivileged: bool, keep_fds: tuple[int, ...]
) -> None:
    status = 0
    try:
        os.close(read_fd)
        os.setpgid(0, 0)
        _die_with_parent(parent)
        _detach_standard_descriptors()
        close_all_but((0, 1, 2, write_fd, *keep_fds))
        import json  # in the child only: the parent reads the answer with plainjson

        refused = _give_up_root(parent) if unprivileged and os.geteuid() == 0 else None
        answer = f"cannot confine the probe process: {refused}" if refused else function(*args)
        payload = json.dumps({"ok": answer}).encode()
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


def close_all_but(kept: tuple[int, ...]) -> None:
    """Close every descriptor of this process but ``kept`` (close_range where the kernel has it)."""
    low = 0
    for fd in sorted(set(kept)):
        if fd > low:
            os.closerange(low, fd)
        low = max(low, fd + 1)
    os.closerange(low, MAX_FD)


def _give_up_root(parent: int) -> str | None:
    """This process (a child of root) confined as the module says; None when it is, else why not."""
    import ctypes

    from ponytail.errors import PonytailError
    from ponytail.fs.libc import libc as c_library
    from ponytail.fs.libc import syscall_number

    libc = c_library()  # the process's one handle (ponytail.fs.libc), inherited from the parent

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    read_only = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    if libc.unshare(CLONE_NEWNS) != 0:
        return f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}"
    # a mount's flags are its own, never propagated: the host's mounts stay as they are
    size = ctypes.c_size_t(ctypes.sizeof(read_only))
    try:
        mount_setattr = syscall_number("mount_setattr")
    except PonytailError as e:  # a machine whose numbers ponytail does not know
        return e.message
    if libc.syscall(mount_setattr, AT_FDCWD, b"/", ctypes.c_uint(AT_RECURSIVE), ctypes.byref(read_only), size) != 0:
        if ctypes.get_errno() != EINVAL:  # EINVAL (valid flags on 5.12+): "/" is no mount (a chroot), nothing to change
            return f"mount_setattr(/, read-only, recursive): {os.strerror(ctypes.get_errno())}"
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())}"
    for cap in range(64):  # the bounding set: until the kernel says there is no such capability
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == EINVAL:
                break
            return f"PR_CAPBSET_DROP {cap}: {os.strerror(ctypes.get_errno())}"
    try:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)  # from root to another user: the permitted, effective and ambient sets are emptied
    except OSError as e:
        return f"becoming nobody: {e.strerror}"
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _die_with_parent(parent)  # a change of user clears the parent-death signal: asked again
    return _still_privileged(libc)


def _still_privileged(libc: Any) -> str | None:
    """What this process has kept of any privilege, asked of the kernel (no /proc needed), or None."""
    import ctypes

    if os.getresuid() != (NOBODY,) * 3 or os.getresgid() != (NOBODY,) * 3 or os.getgroups():
        return f"still uids {os.getresuid()}, gids {os.getresgid()}, groups {os.getgroups()}"
    if libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        return "no_new_privs is not set"
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (capabilities 0-31, 32-63)
    if libc.capget(header, sets) != 0 or any(sets):
        return f"capabilities left: {list(sets)}"
    for cap in range(64):
        bounding = libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0)
        if bounding < 0:
            break  # no such capability: all were looked at
        if bounding or libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) > 0:
            return f"capability {cap} left in the bounding or ambient set"
    return None


def loadable(fd: int, path: str) -> str:
    """The name a child loads the library open on ``fd`` by: that very file through
    /proc/self/fd, or ``path`` where there is no /proc (a bare chroot)."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else path


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
