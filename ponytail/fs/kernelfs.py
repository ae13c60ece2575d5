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

from ponytail.fs.libc import check, libc

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


class Statfs64(ctypes.Structure):
    """glibc's struct statfs64 (<bits/statfs.h>): the counts are 64-bit on every ABI; the
    other words are __fsword_t, a long on the architectures ponytail runs on."""

    _fields_ = [
        ("f_type", ctypes.c_long),
        ("f_bsize", ctypes.c_long),
        ("f_blocks", ctypes.c_uint64),
        ("f_bfree", ctypes.c_uint64),
        ("f_bavail", ctypes.c_uint64),
        ("f_files", ctypes.c_uint64),
        ("f_ffree", ctypes.c_uint64),
        ("f_fsid", ctypes.c_int * 2),
        ("f_namelen", ctypes.c_long),
        ("f_frsize", ctypes.c_long),
        ("f_flags", ctypes.c_long),
        ("f_spare", ctypes.c_long * 4),
    ]


def kernel_filesystem(fd: int) -> str | None:
    """The kernel filesystem ``fd`` (any descriptor, O_PATH included) lies on, or None."""
    return KERNEL_FS_MAGIC.get(filesystem_magic(fd))


def filesystem_magic(fd: int) -> int:
    """statfs f_type of the filesystem ``fd`` lies on."""
    return fstatfs(fd).f_type & 0xFFFFFFFF  # a magic number above 2**31 is negative in a 32-bit long


def fstatfs(fd: int) -> Statfs64:
    """fstatfs64(2) of any descriptor, O_PATH included (os.fstatvfs has no f_type)."""
    buf = Statfs64()
    check(libc().fstatfs64(fd, ctypes.byref(buf)))
    return buf


def mount_id(fd: int) -> int | None:
    """The id of the mount ``fd`` (any descriptor, O_PATH included) lies on, from
    /proc/self/fdinfo (Linux 3.15 on); None where that does not say."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            text = f.read(4096)
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(b":")
        if key == b"mnt_id" and value.strip().isdigit():
            return int(value)
    return None


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
