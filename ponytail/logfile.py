"""The run log: every run appends what it injected, or its error, to one file.

The file is opened before ponytail enters the container's mount namespace, so
the log always lands on the host. A log that cannot be opened or written (a full
filesystem) is reported once on stderr and never fails the container start. A
record cut short by a full filesystem is never glued to the next one: a run whose
log does not end with a newline starts its records on a new line. Runs append under
an exclusive flock (waited for at most LOCK_WAIT_S), and look at the log's last byte
under it: another run's record half-way written is never taken for a torn one (which
left a blank line in the log under concurrency).
"""

from __future__ import annotations

import os
import sys
import time

from ponytail.errors import one_line

LOCK_WAIT_S = 2.0  # then the record is appended without the lock: never a start held up for the log

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from collections.abc import Iterable


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
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        except FileNotFoundError:  # never a directory made as root where the config points by mistake
            directory = os.path.dirname(self.path) or "."
            self._give_up(f"cannot open log file {self.path}: the directory {directory} does not exist; ponytail does not create it: "
                          "create it, or set [log] file to a file in an existing directory (nothing is logged meanwhile)")
        except OSError as e:
            self._give_up(f"cannot open log file {self.path}: {e.strerror} (set [log] file)")

    def _ends_with_newline(self) -> bool:
        try:
            size = os.fstat(self._fd).st_size
            return size == 0 or os.pread(self._fd, 1, size - 1) == b"\n"
        except OSError:
            return True

    def _give_up(self, why: str) -> None:
        """Say once on stderr why nothing more is logged by this run."""
        if sys.stderr is not None:
            print(f"ponytail: warning: {why}", file=sys.stderr)
        self.close()
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
        if not text:
            return
        locked = _lock(self._fd)
        try:
            raw = (text if self._ends_with_newline() else "\n" + text).encode("utf-8", "replace")
            written = os.write(self._fd, raw)
        except OSError as e:
            self._give_up(f"cannot write log file {self.path}: {e.strerror}")
            return
        finally:
            if locked and self._fd >= 0:
                _unlock(self._fd)
        if written < len(raw):  # a full filesystem: the record is cut
            self._give_up(f"cannot write log file {self.path}: only {written} of {len(raw)} bytes written (filesystem full?)")

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self._started) * 1000.0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _lock(fd: int) -> bool:
    """An exclusive flock on the log, waited for at most LOCK_WAIT_S; whether it was taken."""
    import fcntl

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        except OSError:
            return False


def _unlock(fd: int) -> None:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass
