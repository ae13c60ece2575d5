"""File descriptors held by one owner, and closed by it: ``with Descriptors() as held:``,
``fd = held.own(os.open(...))``; every one is closed when the block ends, newest first,
however it ends (a descriptor that fails to close does not keep the others open)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


class Descriptors:
    """Owns file descriptors until ``close()`` (or the end of a ``with`` block)."""

    def __init__(self, fds: Iterable[int] = ()) -> None:
        self._fds = list(fds)

    def own(self, fd: int) -> int:
        """Hold ``fd`` (closed with the others); returns it."""
        self._fds.append(fd)
        return fd

    def close(self) -> None:
        """Close every descriptor held, newest first; the first error is raised after all are closed."""
        error: OSError | None = None
        while self._fds:
            try:
                os.close(self._fds.pop())
            except OSError as e:
                error = error or e
        if error is not None:
            raise error

    def __enter__(self) -> Descriptors:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
