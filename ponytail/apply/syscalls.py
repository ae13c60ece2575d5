"""Thin wrappers (over ponytail.fs.libc) for the syscalls Python's os module lacks: setns, unshare,
umount2 and the new mount API (open_tree, mount_setattr, move_mount; Linux 5.12+).

With the new mount API a bind mount is made from file descriptors alone: the
source is cloned into a detached mount in the host's namespace, made read-only
before anyone can see it, and attached onto a target descriptor resolved inside
the rootfs. No path is re-resolved in between.
"""

from __future__ import annotations

import ctypes
import os

from ponytail.errors import InjectionError
from ponytail.fs.libc import check, libc, syscall

CLONE_NEWNS = 0x00020000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_SYMLINK_NOFOLLOW = 0x100
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def setns_mount(ns_fd: int) -> None:
    """Move this (single-threaded) process into the mount namespace ``ns_fd``."""
    check(libc().setns(ns_fd, CLONE_NEWNS), "setns")


def clone_tree(path: str, recursive: bool = False, dir_fd: int = -100) -> int:
    """A detached bind mount of ``path`` (not following a final symlink), as an fd; with the
    mounts under it when ``recursive``; with ``dir_fd`` and an empty ``path``, of the file that
    descriptor names."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW | (AT_RECURSIVE if recursive else 0) | (AT_EMPTY_PATH if not path else 0)
    return syscall("open_tree", dir_fd, path.encode(), ctypes.c_uint(flags), what=f"open_tree {path or f'fd {dir_fd}'}")


def set_mount_attributes(tree_fd: int, attributes: int, recursive: bool = False) -> None:
    """Set ``attributes`` (MOUNT_ATTR_*) on the mount ``tree_fd``; on every mount under it too when ``recursive``."""
    attr = _MountAttr(attributes, 0, 0, 0)
    flags = AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)
    syscall("mount_setattr", tree_fd, b"", ctypes.c_uint(flags), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))


def attach_tree(tree_fd: int, target_fd: int) -> None:
    """Attach the detached mount ``tree_fd`` onto the file ``target_fd`` refers to."""
    flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH
    syscall("move_mount", tree_fd, b"", target_fd, b"", ctypes.c_uint(flags))


def unshare_mount_namespace() -> None:
    """Give this process a private copy of its mount namespace: what it unmounts stays there."""
    check(libc().unshare(CLONE_NEWNS), "unshare")
    check(libc().mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "mount --make-rprivate /")


def detach_mount(path: str) -> None:
    """Lazily unmount the mount at ``path`` (a /proc/self/fd/N path names the mount that fd holds)."""
    check(libc().umount2(path.encode(), MNT_DETACH), f"umount {path}")


def require_new_mount_api() -> None:
    """Fail with one clear line on kernels older than 5.12."""
    release = os.uname().release
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        return
    if (major, minor) < (5, 12):
        raise InjectionError(f"kernel {release} is too old: ponytail needs Linux 5.12+ (open_tree, mount_setattr)")


FSOPEN_CLOEXEC = 0x1
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
FSMOUNT_CLOEXEC = 0x1


def new_tmpfs(options: dict[str, str], attributes: int) -> int:
    """A new, detached tmpfs (fsopen/fsconfig/fsmount) as an fd to its root directory."""
    fs_fd = syscall("fsopen", b"tmpfs", ctypes.c_uint(FSOPEN_CLOEXEC), what="fsopen tmpfs")
    try:
        for key, value in options.items():
            syscall("fsconfig", fs_fd, ctypes.c_uint(FSCONFIG_SET_STRING), key.encode(), value.encode(), 0, what=f"fsconfig {key}")
        syscall("fsconfig", fs_fd, ctypes.c_uint(FSCONFIG_CMD_CREATE), None, None, 0, what="fsconfig create")
        return syscall("fsmount", fs_fd, ctypes.c_uint(FSMOUNT_CLOEXEC), ctypes.c_uint(attributes))
    finally:
        os.close(fs_fd)
