"""The image's CUDA compat directory (/usr/local/cuda/compat), read inside the untrusted rootfs:
resolved with ponytail.fs.inroot (a symlink never leads out), versions from file names and ELF
headers only; nothing of the image is ever run. Returns plain data; whether it is used is
decided by ponytail.plan.compat."""

from __future__ import annotations

import os
import stat
import struct

COMPAT_DIR = "/usr/local/cuda/compat"
MAX_ENTRIES = 4096


def read_compat_dir(rootfs: str | None, where: str = COMPAT_DIR) -> tuple[str, str, tuple[tuple[str, str], ...]] | None:
    """(canonical directory, version of its libcuda ("" if none), (SONAME, in-root path of its link)
    of that version's libraries) of the image's compat directory (``where``), or None when it has
    none (or no rootfs is known)."""
    opened = _open_in_root(rootfs, where)
    if opened is None:
        return None
    directory, dir_fd = opened
    try:
        version, sonames = _read_directory(dir_fd, directory)
    finally:
        os.close(dir_fd)
    return directory, version, sonames


def sonames_in(rootfs: str, where: str) -> list[tuple[str, str]]:
    """(file name, SONAME) of the shared libraries ``lib*.so.*`` in the image's directory ``where``
    whose SONAME is another name: the links ldconfig would make there (NVIDIA's
    create-soname-symlinks). Read from their ELF headers inside the rootfs; nothing is run."""
    opened = _open_in_root(rootfs, where)
    if opened is None:
        return []
    dir_fd = opened[1]
    try:
        names = sorted(os.listdir(dir_fd))[:MAX_ENTRIES]
        found = []
        for name in names:
            if name.startswith("lib") and ".so." in name:
                soname = _elf_soname(dir_fd, name)
                if soname and soname != name and "/" not in soname:
                    found.append((name, soname))
        return found
    except OSError:
        return []
    finally:
        os.close(dir_fd)


def _open_in_root(rootfs: str | None, where: str) -> tuple[str, int] | None:
    """(canonical path, descriptor) of the directory ``where`` inside ``rootfs``, resolved there
    (a symlink never leads out), or None when it is not a directory there."""
    if rootfs is None:
        return None
    from ponytail.fs.inroot import UnsafePath, resolve_in_root

    try:
        root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            resolved = resolve_in_root(root_fd, where)
        except (UnsafePath, OSError):
            return None
        try:
            if not resolved.exists or not stat.S_ISDIR(resolved.mode):
                return None
            fd = os.open(resolved.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=resolved.parent_fd)
            return resolved.path, fd
        except OSError:
            return None
        finally:
            resolved.close()
    finally:
        os.close(root_fd)


def _read_directory(dir_fd: int, directory: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The version of the libcuda that the directory's libcuda.so.1 names (a link to a
    plain name beside it, or the file itself named by version) and the SONAME links of the
    libraries of that version there."""
    from ponytail.host.driver_files import library_version

    try:
        names = sorted(os.listdir(dir_fd))[:MAX_ENTRIES]
    except OSError:
        return "", ()
    version = ""
    target = _link_beside(dir_fd, "libcuda.so.1")
    if target is not None and _elf_soname(dir_fd, target) == "libcuda.so.1":
        version = library_version(target) or ""
    if not version:
        return "", ()
    sonames = []
    for name in names:
        if name.endswith(f".so.{version}"):
            soname = _elf_soname(dir_fd, name)
            if soname and soname != name and _link_beside(dir_fd, soname) == name:
                sonames.append((soname, f"{directory}/{soname}"))
    return version, tuple(sonames)


def _link_beside(dir_fd: int, name: str) -> str | None:
    """The plain file ``name`` leads to in the same directory (itself, or one symlink to a
    name without '/'), or None."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            return name
        if not stat.S_ISLNK(st.st_mode):
            return None
        target = os.readlink(name, dir_fd=dir_fd)
        if "/" in target or target in ("", ".", ".."):
            return None
        st = os.stat(target, dir_fd=dir_fd, follow_symlinks=False)
        return target if stat.S_ISREG(st.st_mode) else None
    except OSError:
        return None


def _elf_soname(dir_fd: int, name: str) -> str | None:
    from ponytail.host.elf import NotElf, read_elf_info_file

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            return read_elf_info_file(f).soname
        except (NotElf, OSError, ValueError, struct.error):
            return None
