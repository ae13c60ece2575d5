"""Host paths and small host files, with nothing imported.

The probe's modules name a tree's files as host paths (under_root), ask whether a path lies
in a tree (is_under) and read small files: /proc, /sys, a config (read_head). Neither needs ctypes, so the modules that use them stay
light on the hook's path (ponytail.fs.inroot resolves a path safely inside a root).
"""

from __future__ import annotations


def under_root(root: str, path: str) -> str:
    """``path`` of the tree at ``root`` ('/' for this host) as a host path, by its letters: no link
    on the way is followed (ponytail.fs.inroot.host_path_in_root follows them inside the root)."""
    return path if root == "/" else root.rstrip("/") + "/" + path.lstrip("/")


def is_under(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or names something below it, by its letters."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def read_head(path: str, limit: int = 1 << 16, default: str | None = None) -> str:
    """The first ``limit`` characters of the text file ``path`` (bad UTF-8 replaced); an OSError
    when it cannot be read, or ``default`` where one is given."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        if default is None:
            raise
        return default
