"""Resolve a path inside a root directory as if that directory were '/'.

The root belongs to an untrusted image. Every component is looked up relative
to a directory file descriptor we hold, with O_NOFOLLOW; symlinks are read and
re-walked from the root (absolute) or the current directory (relative); '..'
never climbs above the root. Nothing is ever resolved by a path string the
kernel could walk out of the root, so a symlink planted in the image, or one
swapped in while we work, cannot send a mount or a write onto the host. Magic
links under a /proc mounted in the root are read as text, like any symlink.
Directories are never created on a kernel filesystem (ponytail.kernelfs).
"""

from __future__ import annotations

import os
import stat
from ponytail.records import dataclass

from ponytail.errors import InjectionError
from ponytail.kernelfs import kernel_filesystem

MAX_SYMLINKS = 40
MAX_DEPTH = 255
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(InjectionError):
    """A path in the root that cannot be resolved safely (loop, not a directory, raced)."""


@dataclass
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
    """Walk ``path`` under ``root_fd``; create missing directories when ``create_dirs``."""
    parts = _split(path)
    if not path.strip("/."):
        raise UnsafePath(f"{path!r} names the root itself, not a file in it")
    stack: list[tuple[int, str]] = [(os.dup(root_fd), "")]
    hops = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            parent = stack[-1][0]
            last = not parts
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    return _result(stack, name, None)
                if not create_dirs:
                    raise UnsafePath(f"{_join(stack, name)} does not exist in the root (resolving {path})")
                _mkdir(parent, name, dir_mode, _join(stack, name))
                parts.insert(0, name)
                continue
            except OSError as e:
                raise UnsafePath(f"cannot look up {_join(stack, name)} in the root (resolving {path}): {e.strerror}")
            if stat.S_ISLNK(st.st_mode) and (follow_last or not last):
                hops += 1
                if hops > MAX_SYMLINKS:
                    raise UnsafePath(f"too many levels of symbolic links resolving {path} in the root (a loop?)")
                try:
                    target = os.readlink(name, dir_fd=parent)
                except OSError as e:
                    raise UnsafePath(f"cannot read link {_join(stack, name)} in the root (resolving {path}): {e.strerror}")
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                parts = _split(target) + parts
                continue
            if last:
                return _result(stack, name, st.st_mode)
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePath(f"{_join(stack, name)} is not a directory (resolving {path})")
            if len(stack) > MAX_DEPTH:
                raise UnsafePath(f"{path} goes more than {MAX_DEPTH} directories deep in the root; refused")
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except OSError as e:
                raise UnsafePath(f"{_join(stack, name)} changed while resolving {path}: {e.strerror}")
            stack.append((fd, name))
        # the walk ended on a directory it holds ('..', a link to '.' or '/'): name it in its parent
        if len(stack) == 1:
            raise UnsafePath(f"{path} resolves to the root directory itself")
        fd, name = stack.pop()
        mode = os.fstat(fd).st_mode
        os.close(fd)
        return _result(stack, name, mode)
    finally:
        for fd, _ in stack:
            if fd >= 0:
                os.close(fd)


def _mkdir(parent: int, name: str, mode: int, where: str) -> None:
    """Create a missing directory, never on a kernel filesystem (a cgroup mkdir makes a cgroup)."""
    try:
        kind = kernel_filesystem(parent)
        if kind is not None:
            raise UnsafePath(f"refusing to create {where}: it would be on the kernel's {kind} filesystem")
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    except OSError as e:
        raise UnsafePath(f"cannot create directory {where} in the root: {e.strerror}")


def _result(stack: list[tuple[int, str]], name: str, mode: int | None) -> Resolved:
    parent_fd = stack[-1][0]
    stack[-1] = (-1, stack[-1][1])  # ownership moves to the result
    return Resolved(parent_fd, name, mode is not None, _join(stack, name), mode or 0)


def _join(stack: list[tuple[int, str]], name: str) -> str:
    names = [n for _, n in stack[1:]]
    if name:
        names.append(name)
    return "/" + "/".join(names)


def _split(path: str) -> list[str]:
    """Components, keeping '.' (and a trailing '/'): in 'c/.' or 'c/', c must be a directory."""
    return [p or "." for p in path.split("/")]


def open_root(path: str) -> int:
    """An O_PATH descriptor of a root directory (trusted path, e.g. the bundle's rootfs)."""
    try:
        return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise InjectionError(f"cannot open root directory {path}: {e.strerror}")


def real_path_in_root(root_fd: int, path: str) -> str | None:
    """The canonical in-root path of an existing non-directory file, or None (missing, unsafe)."""
    try:
        resolved = resolve_in_root(root_fd, path)
    except (UnsafePath, OSError):
        return None
    resolved.close()
    return resolved.path if resolved.exists else None
