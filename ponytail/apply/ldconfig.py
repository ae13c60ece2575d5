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

The hook makes that private namespace itself, for as long as ldconfig runs, and then
returns into the one it came from (the container's): ldconfig is spawned without
forking the hook (ponytail.apply.program), so there is no child of ours in which to
isolate it, and nothing but the spawn happens in between. A failure to return is an
error, before anything else is done.
"""

from __future__ import annotations

import os

from ponytail.apply import syscalls
from ponytail.apply.program import run_program
from ponytail.errors import InjectionError
from ponytail.fs.kernelfs import kernel_mounts_under

LDCONFIG_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
LDCONFIG_TIMEOUT_S = 10.0  # the default of [timeouts] ldconfig


def run_ldconfig(
    program: str, program_fd: int, root_fd: int, directories: tuple[str, ...], timeout_s: float = LDCONFIG_TIMEOUT_S
) -> str:
    """Rebuild the linker cache of the root ``root_fd``; returns the rootfs path ldconfig was given."""
    rootfs = _canonical_path(root_fd)
    argv = ["ldconfig", "-X", "-r", rootfs, *directories]
    home = _open_namespace()
    try:
        try:
            _isolate(rootfs)
        except OSError as e:
            raise InjectionError(f"refusing to run {program} on {rootfs}: cannot isolate it from the host's kernel filesystems: {e}") from e
        try:
            status, output = run_program(program_fd, argv, dict(LDCONFIG_ENV), timeout_s)
        except TimeoutError:
            raise InjectionError(
                f"{program} -r {rootfs} did not finish within {timeout_s:g} s (killed): raise [timeouts] ldconfig "
                "in the config, or look for an ld.so.conf in the image that includes itself"
            ) from None
        except OSError as e:
            raise InjectionError(f"cannot run {program} on the rootfs: {e}") from e
    finally:
        _return(home)
    detail = output.decode(errors="replace").strip().splitlines()
    last = detail[-1] if detail else "no message"
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


def _open_namespace() -> int:
    """The mount namespace this process is in (the container's, in hook mode)."""
    try:
        return os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise InjectionError(f"cannot open this process's mount namespace: {e.strerror}") from e


def _isolate(rootfs: str) -> None:
    """Move this process into a private mount namespace with no kernel filesystem under the rootfs."""
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


def _return(namespace_fd: int) -> None:
    """Back into the mount namespace ``namespace_fd`` (the private copy is dropped with it)."""
    try:
        syscalls.setns_mount(namespace_fd)
    except OSError as e:
        raise InjectionError(f"cannot return to the container's mount namespace after running ldconfig: {e}") from e
    finally:
        os.close(namespace_fd)
