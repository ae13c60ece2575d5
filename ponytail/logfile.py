"""The run log: every run appends what it injected, or its error, to one file.

The file is opened before ponytail enters the container's mount namespace, so
the log always lands on the host. A log that cannot be opened is reported once
on stderr and never fails the container start.
"""

from __future__ import annotations

import os
import sys
import time

from ponytail.errors import one_line

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from typing import Iterable


class RunLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self.context = "-"
        self._fd = -1
        self._started = time.monotonic()

    def open(self) -> None:
        if self._fd >= 0 or not self.path:
            return
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        except OSError as e:
            print(f"ponytail: warning: cannot open log file {self.path}: {e.strerror} (set [log] file)", file=sys.stderr)
            self.path = ""

    def write(self, level: str, message: str) -> None:
        self.write_all(level, (message,))

    def write_all(self, level: str, messages: Iterable[str]) -> None:
        """One line per message, appended with one write (a run's 40-odd changes)."""
        if self._fd < 0:
            self.open()
        if self._fd < 0:
            return
        head = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} ponytail[{os.getpid()}] {level} container={one_line(self.context)} "
        text = "".join(f"{head}{one_line(message)}\n" for message in messages)
        try:
            if text:
                os.write(self._fd, text.encode("utf-8", "replace"))
        except OSError:
            pass

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self._started) * 1000.0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
