"""A runtime command line as runc and crun take it: global flags, the subcommand, and
for ``create``/``run`` the bundle and the container id. Read only: the real runtime
gets the arguments unchanged."""

from __future__ import annotations

import os

from ponytail.lite.records import record

# Global flags that take a value (runc 1.1, crun 1.8); every other flag is a switch.
GLOBAL_VALUE_FLAGS = frozenset({"log", "log-format", "root", "criu", "rootless", "cgroup-manager"})
# Flags of create/run that take a value.
CREATE_VALUE_FLAGS = frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds"})
BUNDLE_SUBCOMMANDS = frozenset({"create", "run"})


@record(frozen=True)
class RuntimeCall:
    subcommand: str | None
    log: str | None = None  # --log FILE: where the runtime (and the engine) expect errors
    log_format: str = "text"
    bundle: str | None = None  # absolute; only for create/run
    container_id: str | None = None


def parse_runtime_args(args: list[str], cwd: str) -> RuntimeCall:
    """What ``args`` ask the runtime to do; the bundle defaults to ``cwd``, as in runc."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args) and _is_flag(args[i]):
        i = _take(args, i, GLOBAL_VALUE_FLAGS, values)
    if i >= len(args):
        return RuntimeCall(None, values.get("log"), values.get("log-format", "text"))
    subcommand = args[i]
    call = RuntimeCall(subcommand, values.get("log"), values.get("log-format", "text"))
    if subcommand not in BUNDLE_SUBCOMMANDS:
        return call
    i += 1
    options: dict[str, str] = {}
    while i < len(args) and _is_flag(args[i]):
        if args[i] == "--":
            i += 1
            break
        i = _take(args, i, CREATE_VALUE_FLAGS, options)
    bundle = options.get("bundle", options.get("b", "")) or cwd
    container_id = args[i] if i < len(args) else None
    return RuntimeCall(subcommand, call.log, call.log_format, os.path.join(cwd, bundle), container_id)


def _is_flag(arg: str) -> bool:
    return arg.startswith("-") and arg != "-"


def _take(args: list[str], i: int, value_flags: frozenset[str], values: dict[str, str]) -> int:
    """Consume the flag at ``i`` (and its value, if it takes one); the index after it."""
    name, eq, inline = args[i].lstrip("-").partition("=")
    if name not in value_flags:
        return i + 1
    if eq:
        values[name] = inline
        return i + 1
    if i + 1 < len(args):
        values[name] = args[i + 1]
    return i + 2
