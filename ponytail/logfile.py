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
        if self._fd < 0:
            self.open()
        if self._fd < 0:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        line = f"{stamp} ponytail[{os.getpid()}] {level} container={one_line(self.context)} {one_line(message)}\n"
        try:
            os.write(self._fd, line.encode("utf-8", "replace"))
        except OSError:
            pass

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self._started) * 1000.0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
