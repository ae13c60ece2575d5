"""Kernel filesystems (proc, sysfs, cgroup, ...): a file there is a kernel interface, not data.

At prestart the rootfs already holds the container's /proc, /sys and /dev/pts. A symlink in
the image can aim a write at /proc/sys/kernel/core_pattern or a mkdir at a cgroup hierarchy,
and those change the host's kernel from whatever mount namespace they are made in; the
magic links under /proc (/proc/<pid>/root) lead back to the host's /. So ponytail never
creates, writes or mounts anything on these filesystems, and the host's ldconfig runs with
them detached (ponytail.apply.ldconfig).
"""

from __future__ import annotations

import ctypes
import os

# statfs f_type (linux/magic.h) -> the type name /proc/self/mountinfo shows
KERNEL_FS_MAGIC: dict[int, str] = {
    0x9FA0: "proc",
    0x62656572: "sysfs",
    0x27E0EB: "cgroup",
    0x63677270: "cgroup2",
    0x73636673: "securityfs",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0xCAFE4A11: "bpf",
    0x62656570: "configfs",
    0xDE5E81E4: "efivarfs",
    0xF97CFF8C: "selinuxfs",
    0x43415D53: "smackfs",
    0x6165676C: "pstore",
    0x42494E4D: "binfmt_misc",
    0x65735543: "fusectl",
    0x6E736673: "nsfs",
    0x1CD1: "devpts",
    0x19800202: "mqueue",
}
KERNEL_FS_TYPES = frozenset(KERNEL_FS_MAGIC.values())
TMPFS_MAGIC = 0x01021994

_STATFS_SIZE = 256  # larger than struct statfs on every Linux ABI; f_type is its first word
_libc: ctypes.CDLL | None = None


def kernel_filesystem(fd: int) -> str | None:
    """The kernel filesystem ``fd`` (any descriptor, O_PATH included) lies on, or None."""
    return KERNEL_FS_MAGIC.get(filesystem_magic(fd))


def filesystem_magic(fd: int) -> int:
    """statfs f_type of the filesystem ``fd`` lies on."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if _libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def kernel_mounts_under(path: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points of kernel filesystems at or below ``path`` (canonical), deepest first."""
    prefix = path.rstrip("/") + "/"
    found = []
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            point = unescape_mountinfo(fields[4])
            if fstype in KERNEL_FS_TYPES and (point + "/").startswith(prefix):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def unescape_mountinfo(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040...)."""
    if "\\" not in field:  # the usual path: no regex (nor the re module) needed
        return field
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
