"""One ponytail run at a time per rootfs directory (and per cgroup v2 directory).

Containers can share one rootfs directory (podman ``--rootfs DIR``, several runc
bundles with the same ``root.path``) and start at the same time, and an engine can run
the hook twice for one container. What a run writes in the rootfs (the linker config,
the SONAME links, ldconfig's ``/etc/ld.so.cache~``, renamed onto ``/etc/ld.so.cache``)
has fixed names, and a failing run takes back the mounts it made: two runs at once
would trip over each other's files, or one would report mounts the other is about to
take back. So a run holds an exclusive ``flock`` on the rootfs directory itself from
before its first change until it is done. The lock writes nothing, lives on the
directory's inode (so every bind mount of it shares it), and goes with the process
when it dies, even by SIGKILL. Waiting for it has a deadline ([timeouts] lock).

The same lock on the container's cgroup v2 directory makes runs into one container take turns
over its device programs (ponytail.apply.cgroup2), from reading them to replacing them; it is
taken before the rootfs lock, by every run that takes both.
"""

from __future__ import annotations

import fcntl
import os
import time

from ponytail.errors import InjectionError


def lock_rootfs(root_fd: int, rootfs: str, timeout_s: float) -> int:
    """A descriptor holding the lock on the directory ``root_fd``; close it to release."""
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError as e:
        raise InjectionError(f"cannot open the rootfs {rootfs} to lock it: {e.strerror}") from e
    try:
        lock_directory(fd, f"the rootfs {rootfs}", timeout_s)
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock_directory(fd: int, what: str, timeout_s: float) -> None:
    """Wait for the exclusive lock on the open directory ``fd`` (held until it is closed);
    ``what`` names it in the error when another run holds it past the deadline."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise InjectionError(
                f"another ponytail run into {what} has not finished within {timeout_s:g} s; raise [timeouts] lock in the config"
            )
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)
