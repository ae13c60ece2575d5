"""Run a function in a forked child and get its (JSON-able) result back.

Used for the few probes that must load a driver library into a process (libcuda for
the CUDA version, NVML for MIG UUIDs): the library and any thread it starts live and
die in the child, and this process stays single-threaded, as entering a mount
namespace requires.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # not imported on the hook's path (tests/test_hook_imports.py)
    from typing import Any, Callable


def run_in_child(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a child process; its return value must be JSON-able.
    A crash or a non-JSON answer comes back as a string describing it."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into the caller's code
        status = 0
        try:
            os.close(read_fd)
            payload = json.dumps({"ok": function(*args)}).encode()
            while payload:
                payload = payload[os.write(write_fd, payload):]
        except BaseException:  # noqa: BLE001 - report anything, then leave
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as reader:
        while chunk := reader.read(65536):
            chunks.append(chunk)
    _, wait_status = os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks))["ok"]
    except (ValueError, KeyError):
        return f"the probe process failed (wait status {wait_status})"
