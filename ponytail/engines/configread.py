"""An engine's config file on the node, read as the node's engine reads it: for ``registered()``.

Kept apart from ponytail.engines.model: resolving links inside a root loads ctypes (ponytail.fs.inroot),
which the command line, reading only the registry's names, never needs."""

from __future__ import annotations

import os
import stat

from ponytail.engines.model import CONFIG_CHARS
from ponytail.fs.hostfiles import is_under
from ponytail.fs.inroot import UnsafePath, host_path_in_root


def read_config(root: str, path: str) -> str:
    """The engine config ``path`` (a host path under ``root``, as under_root names it) as the node's engine
    would read it: links resolved inside ``root``, never out of it; "" where it is not a regular file that
    can be read (a FIFO is never waited on). At most CONFIG_CHARS characters, bad UTF-8 replaced."""
    if root != "/":
        if not is_under(path, root.rstrip("/")):
            return ""  # e.g. an import that climbs out of the node's tree
        try:
            path = host_path_in_root(root, path[len(root.rstrip("/")):], follow_last=True)
        except (OSError, UnsafePath):
            return ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        return f.read(CONFIG_CHARS).decode("utf-8", "replace")
