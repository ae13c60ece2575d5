"""Files that root believes or loads, held to one rule: nobody but root can have changed them.

ponytail runs as root. A file it believes (a cache) or whose libraries it maps into a
container (a registered driver tree) is only as trustworthy as whoever can write it: it
must belong to root (or to the user running ponytail, who trusts themselves) and be
writable by no one else, and so must every directory above it, else it could be replaced
by a rename. This module is that rule, used by the probe cache, the CUDA-version cache
(ponytail.host.cuda) and the driver-tree check (ponytail.host.driver_trees).

Files are opened without following a link and without blocking (a FIFO never hangs a
run), and checked again once open.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from collections.abc import Iterable

GROUP_OR_OTHERS_WRITE = 0o022
GROUP_OR_OTHERS_ANY = 0o077


class Untrusted(Exception):
    """A file or directory someone other than root (or this user) may have written: the message says which and how."""


def untrusted(st: os.stat_result, forbidden: int = GROUP_OR_OTHERS_WRITE) -> str | None:
    """Why a file with this status is not to be trusted (another owner, or a ``forbidden``
    mode bit), or None. Owned by root or by this process's user, else not trusted."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        return f"owned by uid {st.st_uid} (mode {mode:04o})"
    if mode & forbidden:
        return f"mode {mode:04o}: group or others may {'read or write' if forbidden & 0o044 else 'write'} it"
    return None


def open_private_dir(path: str) -> int:
    """A descriptor of the directory ``path`` (a final link is not followed): OSError when it
    cannot be opened (missing, not a directory), Untrusted when it is not root's (or this
    user's) alone."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    why = untrusted(os.fstat(fd))
    if why is not None:
        os.close(fd)
        raise Untrusted(f"directory {path} is {why}")
    return fd


def read_private_file(directory: str, name: str, limit: int) -> bytes | None:
    """The content of ``directory/name``, a file only root (or this user) can read or write,
    in a directory only they can change; None when either is missing or unreadable;
    Untrusted when one is there but may be someone else's doing (another owner, a group or
    world bit, a FIFO, a device, a link, more than ``limit`` bytes)."""
    try:
        dir_fd = open_private_dir(directory)
    except OSError:
        return None
    try:
        read = read_private_at(dir_fd, name, limit, directory)
    finally:
        os.close(dir_fd)
    return None if read is None else read[0]


def read_private_at(dir_fd: int, name: str, limit: int, directory: str) -> tuple[bytes, os.stat_result] | None:
    """``read_private_file`` of ``name`` in the open directory ``dir_fd`` (``directory`` names it in
    messages), with the status of the file read (its device and inode say which file it was)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Untrusted(f"{directory}/{name}: {e.strerror}") from None  # a link (ELOOP), a FIFO without a reader (ENXIO)...
    try:
        st = os.fstat(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else untrusted(st, GROUP_OR_OTHERS_ANY)
        if why is None and st.st_size > limit:
            why = f"larger than {limit} bytes"
        if why is not None:
            raise Untrusted(f"{directory}/{name} is {why}")
        return os.read(fd, limit + 1), st
    except OSError:
        return None
    finally:
        os.close(fd)


def untrusted_tree(root: str, paths: Iterable[str]) -> str | None:
    """Why the tree at ``root`` may have been changed by someone other than root, or None
    (untrusted_place)."""
    found = untrusted_place(root, paths)
    return f"{found[0]} is {found[1]}" if found else None


def untrusted_place(root: str, paths: Iterable[str]) -> tuple[str, str] | None:
    """Why the tree at ``root`` (a host path) may have been changed by someone other than
    root, or None: every directory above it, the root, and every directory and file from
    the root down to each of ``paths`` (canonical paths inside the tree) must be root's (or
    this user's) and not writable by group or others. Above the root, a directory writable
    by all is accepted when it is root's and sticky (/tmp): no one else can rename what is
    in it. The first problem as (the path, why)."""
    real = os.path.realpath(root)
    checked: set[str] = set()
    above = [real]
    while above[-1] != "/":
        above.append(os.path.dirname(above[-1]))
    if os.path.normpath(root) != real:  # the root is reached through a link: its directory counts too
        above.append(os.path.realpath(os.path.dirname(os.path.normpath(root))))
    for directory in above[1:]:
        problem = _check(directory, checked, sticky_ok=True)
        if problem:
            return problem
    for path in ("/", *paths):
        components = [p for p in path.split("/") if p]
        current = real
        for name in ["", *components]:
            current = os.path.join(current, name) if name else current
            problem = _check(current, checked, sticky_ok=False)
            if problem:
                return problem
    return None


def _check(path: str, checked: set[str], sticky_ok: bool) -> tuple[str, str] | None:
    if path in checked:
        return None
    checked.add(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # nothing there is used
    except OSError as e:
        return path, f"not examinable ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        why = untrusted(st, 0)  # a link's own mode means nothing; its directory is checked
    elif sticky_ok and st.st_uid == 0 and st.st_mode & stat.S_ISVTX:
        why = None
    else:
        why = untrusted(st)
    return (path, why) if why else None
