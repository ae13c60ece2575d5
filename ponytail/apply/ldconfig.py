"""Run the host's ldconfig on the rootfs so that nothing in the image can steer it.

``ldconfig -r ROOTFS`` chroots into the rootfs, then reads and writes paths the image
controls: /etc/ld.so.conf and its includes, /etc/ld.so.cache~ (renamed onto
/etc/ld.so.cache), /var/cache/ldconfig/aux-cache, and SONAME links in every library
directory it scans. A chroot stops '..' and absolute symlinks, but not the magic links of
the container's /proc, which is already mounted in the rootfs at prestart
(/proc/<pid>/root leads back to the host's /), nor writes into /proc/sys or a cgroup
hierarchy. So the host's ldconfig (never the image's) runs:

- in a private copy of the mount namespace from which every kernel filesystem under the
  rootfs is detached, so inside its chroot there are only plain files;
- with -X: ponytail makes the SONAME links it needs itself, ldconfig only writes its cache;
- with a fixed environment (nothing of the container's, nothing of ponytail's own), stdin
  from /dev/null, no descriptor but its own binary, and a time limit.
"""

from __future__ import annotations

import functools
import os

from ponytail.apply import syscalls
from ponytail.apply.program import run_program
from ponytail.errors import InjectionError
from ponytail.kernelfs import kernel_mounts_under

LDCONFIG_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
LDCONFIG_TIMEOUT_S = 60
_NOT_ISOLATED = 125  # exit status of the child when it could not isolate itself; ldconfig never uses it


def run_ldconfig(program: str, program_fd: int, root_fd: int, directories: tuple[str, ...]) -> str:
    """Rebuild the linker cache of the root ``root_fd``; returns the rootfs path ldconfig was given."""
    rootfs = _canonical_path(root_fd)
    argv = ["ldconfig", "-X", "-r", rootfs, *directories]
    try:
        status, output = run_program(
            program_fd, argv, dict(LDCONFIG_ENV), LDCONFIG_TIMEOUT_S, before_exec=functools.partial(_isolate, rootfs)
        )
    except OSError as e:
        raise InjectionError(f"cannot run {program} on the rootfs: {e}")
    detail = output.decode(errors="replace").strip().splitlines()
    last = detail[-1] if detail else "no message"
    if status == _NOT_ISOLATED:
        raise InjectionError(f"refusing to run {program} on {rootfs}: {last}")
    if status != 0:
        raise InjectionError(f"{program} -r {rootfs} failed (exit {status}): {last}")
    return rootfs


def _canonical_path(root_fd: int) -> str:
    """The path of the directory ``root_fd`` holds, as mountinfo and chroot will see it."""
    path = os.readlink(f"/proc/self/fd/{root_fd}")
    try:
        same = os.path.samestat(os.stat(path), os.fstat(root_fd))
    except OSError:
        same = False
    if not path.startswith("/") or not same:
        raise InjectionError(f"the rootfs is not reachable by a path from this mount namespace ({path})")
    return path


def _isolate(rootfs: str) -> None:
    """In the child, before exec: a private mount namespace with no kernel filesystem under the rootfs."""
    try:
        syscalls.unshare_mount_namespace()
        for _ in range(3):
            mounts = kernel_mounts_under(rootfs)
            if not mounts:
                return
            for point in mounts:
                try:
                    syscalls.detach_mount(point)
                except OSError:
                    pass  # already gone with a parent; checked again above
        raise OSError(f"kernel filesystems stay mounted under it: {', '.join(mounts)}")
    except OSError as e:
        os.write(2, f"cannot isolate it from the host's kernel filesystems: {e}\n".encode(errors="replace"))
        os._exit(_NOT_ISOLATED)
