"""Write an error where a container engine looks for a runtime's reason: the ``--log``
file, as runc writes it (``--log-format json``: one JSON object a line; ``text``:
logrus's key=value line)."""

from __future__ import annotations

import json
import os
import time


def append_error(path: str, log_format: str, message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if log_format == "json":
        line = json.dumps({"level": "error", "msg": message, "time": stamp})
    else:
        line = f"time={json.dumps(stamp)} level=error msg={json.dumps(message)}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # stderr already has it
