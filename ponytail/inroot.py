"""Resolve a path inside a root directory as if that directory were '/'.

The root belongs to an untrusted image. Every component is looked up relative
to a directory file descriptor we hold, with O_NOFOLLOW; symlinks are read and
re-walked from the root (absolute) or the current directory (relative); '..'
never climbs above the root. Nothing is ever resolved by a path string the
kernel could walk out of the root, so a symlink planted in the image, or one
swapped in while we work, cannot send a mount or a write onto the host. Magic
links under a /proc mounted in the root are read as text, like any symlink.
Directories are never created on a kernel filesystem (ponytail.kernelfs).

``InRoot`` resolves many paths under one root the same way, keeping each directory it
has resolved open: the files of one directory (a GPU's nodes, a driver's libraries)
then cost one lookup each instead of a walk from the root.
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
    return _walk(root_fd, path, create_dirs, follow_last, dir_mode)[0]


def _walk(root_fd: int, path: str, create_dirs: bool, follow_last: bool, dir_mode: int) -> tuple[Resolved, int]:
    """``resolve_in_root``, and how many symlinks it followed."""
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
                    return _result(stack, name, None), hops
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
                return _result(stack, name, st.st_mode), hops
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
        return _result(stack, name, mode), hops
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


class InRoot:
    """``resolve_in_root`` for many paths under one root, each directory resolved once.

    A path's directory is walked from the root the first time (creating it when asked),
    and its descriptor is kept; the last component is then looked up in it, a symlink
    to a plain name in the same directory followed there. Anything else (a symlink
    that leads elsewhere, a directory that is missing or not one, '.' or '..' as the
    last component) takes the whole walk, with its errors. The results are those of
    ``resolve_in_root``; the caller says when something it did may have changed what a
    directory path leads to (a directory mounted over, a link replaced): ``forget()``.
    """

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self._dirs: dict[str, tuple[int, str, int] | None] = {}  # directory -> (fd, canonical path, links followed)

    def resolve(self, path: str, *, create_dirs: bool = False, follow_last: bool = True) -> Resolved:
        directory, _, name = path.rpartition("/")
        held = None if name in ("", ".", "..") else self._directory(directory, create_dirs)
        if held is None:
            return resolve_in_root(self.root_fd, path, create_dirs=create_dirs, follow_last=follow_last)
        dir_fd, dir_path, hops = held
        while True:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return Resolved(os.dup(dir_fd), name, False, f"{dir_path}/{name}", 0)
            except OSError:
                break
            if not (follow_last and stat.S_ISLNK(st.st_mode)):
                return Resolved(os.dup(dir_fd), name, True, f"{dir_path}/{name}", st.st_mode)
            hops += 1
            try:
                target = os.readlink(name, dir_fd=dir_fd)
            except OSError:
                break
            if hops > MAX_SYMLINKS or "/" in target or target in ("", ".", ".."):
                break
            name = target  # a link to a name beside it, as a walk would follow it
        return resolve_in_root(self.root_fd, path, create_dirs=create_dirs, follow_last=follow_last)

    def real_path(self, path: str) -> str | None:
        """``real_path_in_root`` through the directories held."""
        try:
            resolved = self.resolve(path)
        except (UnsafePath, OSError):
            return None
        resolved.close()
        return resolved.path if resolved.exists else None

    def _directory(self, directory: str, create_dirs: bool) -> tuple[int, str, int] | None:
        """The descriptor and canonical path of an existing directory (and the symlinks its
        walk followed, which count towards MAX_SYMLINKS as in a whole walk), resolved once."""
        if directory in self._dirs:
            return self._dirs[directory]
        held = None
        if not directory.strip("/."):
            held = (os.dup(self.root_fd), "", 0) if directory == "" else None
        else:
            try:
                resolved, hops = _walk(self.root_fd, directory, create_dirs, True, 0o755)
            except (UnsafePath, OSError):
                return None  # the whole walk says why
            try:
                if resolved.exists and stat.S_ISDIR(resolved.mode):
                    held = (os.open(resolved.name, _DIR_FLAGS, dir_fd=resolved.parent_fd), resolved.path, hops)
            except OSError:
                pass
            finally:
                resolved.close()
            if held is None:
                return None  # missing (a walk creates it) or not a directory: not remembered
        self._dirs[directory] = held
        return held

    def forget(self) -> None:
        """Drop every directory held: the next lookups walk from the root again."""
        for held in self._dirs.values():
            if held is not None:
                os.close(held[0])
        self._dirs.clear()

    close = forget
