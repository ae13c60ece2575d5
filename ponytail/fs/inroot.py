"""Resolve a path inside a root directory as if that directory were '/', by asking the kernel.

The root belongs to an untrusted image. Every path is resolved by
``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` (Linux 5.6, what crun and runc ask
first): symlinks, absolute or relative, are followed inside the root, '..' never climbs
above it, a magic link under a /proc mounted in the root is refused (ELOOP), and a
rename racing with a '..' is detected (EAGAIN: tried again; EXDEV: refused). We act on
the descriptors the kernel gives, never on a path string it could walk out of the root.

Three things are ours: creating the directories a mount point needs (never on a kernel
filesystem, ponytail.fs.kernelfs: a mkdir in a cgroup makes a cgroup); following a symlink
in the last component, so that a result is always a directory we hold and a name in it;
and naming what was found by its canonical path (the path itself when the kernel met no
symlink on the way, asked with RESOLVE_NO_SYMLINKS first; else as /proc/self/fd names
the descriptor). A hook needs Linux 5.12 for the mount API anyway, so there is no
userland walk to fall back on: an older kernel gets one line saying so (from info, list
and -debug too, which read the driver root through here).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from ponytail.errors import InjectionError
from ponytail.fs.hostfiles import is_under, under_root
from ponytail.fs.kernelfs import kernel_filesystem
from ponytail.fs.libc import error, libc, syscall_number
from ponytail.lite.records import record

MAX_SYMLINKS = 40
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_EAGAIN_RETRIES = 64
_MAX_CREATED = 64  # directories one path may need created


class UnsafePath(InjectionError):
    """A path in the root that cannot be resolved safely (loop, magic link, not a directory, raced)."""


@record
class Resolved:
    """A resolved path: an open directory, the name in it, and whether that name exists.

    ``parent_fd`` is owned by the caller (close it). ``path`` is the canonical
    path inside the root. When ``exists`` is true and ``follow_last`` was
    requested, the name is not a symlink.
    """

    parent_fd: int
    name: str
    exists: bool
    path: str
    mode: int = 0

    def close(self) -> None:
        if self.parent_fd >= 0:
            os.close(self.parent_fd)
            self.parent_fd = -1


def resolve_in_root(
    root_fd: int, path: str, *, create_dirs: bool = False, follow_last: bool = True, dir_mode: int = 0o755
) -> Resolved:
    """Resolve ``path`` under ``root_fd``; create missing directories when ``create_dirs``."""
    if not path.strip("/."):
        raise UnsafePath(f"{path!r} names the root itself, not a file in it")
    asked = path
    for _ in range(MAX_SYMLINKS + 2):
        directory, _, name = path.rpartition("/")
        if name in ("", ".", ".."):  # ends in a directory: name it in its parent
            fd, path = _open_dir(root_fd, path, asked, create_dirs, dir_mode)
            os.close(fd)
            if not path:
                raise UnsafePath(f"{asked} resolves to the root directory itself")
            continue
        parent, parent_path = _open_dir(root_fd, directory or "/", asked, create_dirs, dir_mode)
        where = f"{parent_path}/{name}"
        try:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return Resolved(parent, name, False, where)
            if not (follow_last and stat.S_ISLNK(st.st_mode)):
                return Resolved(parent, name, True, where, st.st_mode)
            target = os.readlink(name, dir_fd=parent)
        except BaseException as e:
            os.close(parent)
            if isinstance(e, OSError):
                raise UnsafePath(f"cannot look up {path} in the root (resolving {asked}): {e.strerror}") from e
            raise
        os.close(parent)
        path = target if target.startswith("/") else f"{parent_path}/{target}"
    raise UnsafePath(f"too many levels of symbolic links resolving {asked} in the root (a loop?)")


def real_path_in_root(root_fd: int, path: str) -> str | None:
    """The canonical in-root path of an existing file, or None (missing, unsafe)."""
    try:
        resolved = resolve_in_root(root_fd, path)
    except (UnsafePath, OSError):
        return None
    resolved.close()
    return resolved.path if resolved.exists else None


def host_path_in_root(root: str, path: str, *, follow_last: bool = False) -> str:
    """The host path of ``path`` of the tree at ``root`` (a trusted host directory, '/' for this
    host): every symlink on the way, absolute ones included, resolved inside the root, so that
    a node's ``/var/run -> /run`` leads to ITS /run, never the caller's. The last component is
    followed only with ``follow_last``; what does not exist yet is named under its deepest
    existing directory. UnsafePath for a loop or a component that is not a directory."""
    if root == "/" or not path.strip("/."):
        return under_root(root, path)
    root_fd = open_root(root)
    try:
        return root.rstrip("/") + _canonical(root_fd, _normalized(path), follow_last)
    finally:
        os.close(root_fd)


def _canonical(root_fd: int, path: str, follow_last: bool, depth: int = 0) -> str:
    """The canonical in-root path of ``path`` ('' for the root itself)."""
    if depth > MAX_SYMLINKS:
        raise UnsafePath(f"too many levels of symbolic links resolving {path} in the root (a loop?)")
    directory, _, name = path.rstrip("/").rpartition("/")
    if name in ("", ".", ".."):  # a directory named by its own path
        try:
            fd = openat2_in_root(root_fd, path or "/", _DIR_FLAGS)
        except OSError:
            return _normalized(path)
        try:
            return _path_in_root(root_fd, fd, path)
        finally:
            os.close(fd)
    try:
        parent = openat2_in_root(root_fd, directory or "/", _DIR_FLAGS)
    except FileNotFoundError:  # a part of the way is missing: so is everything after it
        return (_canonical(root_fd, directory, True, depth + 1) if directory else "") + "/" + name
    except OSError as e:
        raise _refused(e, directory or "/", path) from e
    try:
        parent_path = _path_in_root(root_fd, parent, path)
        try:
            target = os.readlink(name, dir_fd=parent) if follow_last else None
        except OSError:  # not a link, or not there
            target = None
    finally:
        os.close(parent)
    if target is None:
        return f"{parent_path}/{name}"
    return _canonical(root_fd, target if target.startswith("/") else f"{parent_path}/{target}", True, depth + 1)


def read_file_in_root(root_fd: int, path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file of the root, or None (see open_file_in_root)."""
    fd = open_file_in_root(root_fd, path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read(limit)
        except OSError:
            return None


def open_file_in_root(root_fd: int, path: str) -> int | None:
    """A read-only descriptor of a regular file of the root, or None (missing, not a regular
    file, unsafe, unreadable). Opened without following a last link and without blocking, and
    never opened at all unless it is a regular file (open_regular_file: a device or FIFO swapped
    in meanwhile is not opened)."""
    try:
        resolved = resolve_in_root(root_fd, path)
    except (UnsafePath, OSError):
        return None
    try:
        if not resolved.exists or not stat.S_ISREG(resolved.mode):
            return None
        fd = open_regular_file(resolved.parent_fd, resolved.name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if fd is None:
            return None
    except OSError:
        return None
    finally:
        resolved.close()
    return fd


def open_regular_file(dir_fd: int, name: str, flags: int) -> int | None:
    """``name`` in ``dir_fd`` opened with ``flags`` if it is a regular file (not a link to
    one), else None; OSError. Never opens anything else, even what is swapped in meanwhile:
    the file is held by an O_PATH descriptor (which opens nothing), checked, and that very
    file opened again through /proc/self/fd. ``flags`` should hold O_NONBLOCK and O_CLOEXEC."""
    held = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(held).st_mode):
            return None
        try:
            return os.open(f"/proc/self/fd/{held}", flags & ~os.O_NOFOLLOW & ~os.O_CREAT)
        except FileNotFoundError:  # no /proc (a bare chroot): the name again, non-blocking, checked once open
            pass
    finally:
        os.close(held)
    fd = os.open(name, (flags | os.O_NOFOLLOW | os.O_NONBLOCK) & ~os.O_CREAT, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def open_root(path: str) -> int:
    """An O_PATH descriptor of a root directory (trusted path, e.g. the bundle's rootfs)."""
    try:
        return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise InjectionError(f"cannot open root directory {path}: {e.strerror}") from e


class InRoot:
    """The paths of one root, for the executor: ``resolve_in_root`` and ``real_path_in_root``."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd

    def resolve(self, path: str, *, create_dirs: bool = False, follow_last: bool = True) -> Resolved:
        return resolve_in_root(self.root_fd, path, create_dirs=create_dirs, follow_last=follow_last)

    def real_path(self, path: str) -> str | None:
        return real_path_in_root(self.root_fd, path)

    def read_file(self, path: str, limit: int) -> bytes | None:
        return read_file_in_root(self.root_fd, path, limit)


def _open_dir(root_fd: int, directory: str, asked: str, create_dirs: bool, dir_mode: int) -> tuple[int, str]:
    """An O_PATH descriptor of ``directory`` in the root and its canonical path ('' for the
    root itself), its missing parts created when asked."""
    for _ in range(_MAX_CREATED + MAX_SYMLINKS):
        try:
            try:  # the usual path, through no symlink: its canonical path is its own
                return openat2_in_root(root_fd, directory, _DIR_FLAGS, RESOLVE_NO_SYMLINKS), _normalized(directory)
            except OSError as e:
                if e.errno != errno.ELOOP:  # there was a symlink on the way
                    raise
            fd = openat2_in_root(root_fd, directory, _DIR_FLAGS)
        except FileNotFoundError:
            if not create_dirs:
                raise UnsafePath(f"{directory} does not exist in the root (resolving {asked})") from None
            directory = _create_one(root_fd, directory, asked, dir_mode)
            continue
        except OSError as e:
            raise _refused(e, directory, asked) from e
        try:
            return fd, _path_in_root(root_fd, fd, asked)
        except BaseException:
            os.close(fd)
            raise
    raise UnsafePath(f"cannot create {directory} in the root: too deep, or too many levels of symbolic links (resolving {asked})")


def _normalized(path: str) -> str:
    """``path`` without '.', empty components and '..' (clamped at the root, as in the kernel)."""
    if path.startswith("/") and "//" not in path and "/." not in path:  # the usual, already so
        return "" if path == "/" else path
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "".join(f"/{p}" for p in parts)


def _create_one(root_fd: int, directory: str, asked: str, mode: int) -> str:
    """Create the first missing directory on the way to ``directory``; the path to try next
    (another one when a dangling symlink was in the way: what it names is created instead)."""
    parts = directory.split("/")
    for i in range(1, len(parts) + 1):
        if parts[i - 1] in ("", ".", ".."):
            continue
        try:
            os.close(openat2_in_root(root_fd, "/".join(parts[:i]), _DIR_FLAGS))
            continue
        except FileNotFoundError:
            pass
        except OSError as e:
            raise _refused(e, directory, asked) from e
        parent, parent_path = _open_dir(root_fd, "/".join(parts[: i - 1]) or "/", asked, False, mode)
        name, rest = parts[i - 1], "/".join(parts[i:])
        where = f"{parent_path}/{name}"
        try:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                _mkdir(parent, name, mode, where)
                return directory
            if not stat.S_ISLNK(st.st_mode):
                return directory  # created meanwhile, or not a directory: the next open says
            target = os.readlink(name, dir_fd=parent)
        except OSError as e:
            raise UnsafePath(f"cannot create {directory} in the root (resolving {asked}): {e.strerror}") from e
        finally:
            os.close(parent)
        target = target if target.startswith("/") else f"{parent_path}/{target}"
        return f"{target}/{rest}" if rest else target
    return directory  # all there now


def _mkdir(parent: int, name: str, mode: int, where: str) -> None:
    """Create a missing directory, never on a kernel filesystem (a cgroup mkdir makes a cgroup)."""
    kind = kernel_filesystem(parent)
    if kind is not None:
        raise UnsafePath(f"refusing to create {where}: it would be on the kernel's {kind} filesystem")
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass


def _path_in_root(root_fd: int, fd: int, asked: str) -> str:
    """The canonical path of ``fd`` in the root ('' for the root itself), as the kernel names it."""
    root = os.readlink(f"/proc/self/fd/{root_fd}")
    path = os.readlink(f"/proc/self/fd/{fd}")
    if root == "/":
        return "" if path == "/" else path
    if is_under(path, root):
        return path[len(root):]
    raise UnsafePath(f"{path} is no longer inside the root {root} (moved while resolving {asked}); refused")


def _refused(e: OSError, directory: str, asked: str) -> UnsafePath:
    if e.errno == errno.ELOOP:
        why = "too many levels of symbolic links (a loop?), or a magic link under /proc, on the way to"
    elif e.errno == errno.ENOTDIR:
        return UnsafePath(f"{directory} in the root is not a directory, or leads through one that is not (resolving {asked})")
    elif e.errno in (errno.EAGAIN, errno.EXDEV):  # a rename raced with '..'
        why = "something changed while the kernel resolved"
    else:
        why = f"{e.strerror}:"
    return UnsafePath(f"{why} {directory} in the root (resolving {asked})")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_hows: dict[tuple[int, int], object] = {}  # (flags, resolve) -> a pointer to its struct open_how


def openat2_in_root(root_fd: int, path: str, flags: int, resolve: int = 0) -> int:
    """``openat2(root_fd, path, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | resolve)``: a
    descriptor, or OSError. A rename racing with '..' (EAGAIN) is tried again."""
    if "\0" in path:
        raise OSError(errno.EINVAL, "a NUL byte in a path", path)  # ctypes would cut the path there
    how = _hows.get((flags, resolve))
    if how is None:
        how = _hows[(flags, resolve)] = ctypes.pointer(_OpenHow(flags, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | resolve))
    raw = os.fsencode(path)
    call, number = libc().syscall, syscall_number("openat2")
    for _ in range(_EAGAIN_RETRIES):
        fd = call(number, root_fd, raw, how, _HOW_SIZE)
        if fd >= 0:
            return int(fd)
        failed = error(path=path)
        if failed.errno != errno.EAGAIN:
            break
    if failed.errno == errno.ENOSYS:
        raise InjectionError(f"kernel {os.uname().release} has no openat2: ponytail needs Linux 5.12+")
    raise failed


_HOW_SIZE = ctypes.c_size_t(ctypes.sizeof(_OpenHow))
