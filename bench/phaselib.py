"""Where a ponytail hook run spends its time, phase by phase (bench only).

bench/phases.py runs ponytail's console-script entry (``ponytail.entry.main``) with
its functions wrapped from outside, so ponytail itself carries no instrumentation
and costs nothing more when it is not measured. Each phase's time is exclusive
(a phase called inside another is not counted twice):

- ``interpreter``: from the fork in bench/measure.c to the first line of phases.py
  (exec, the interpreter's start, ``site``);
- ``imports``: every ``import`` statement, wherever it runs;
- ``config``, ``container`` (OCI state and bundle), ``request``, ``probe``, ``plan``,
  ``mounts`` (apply: namespaces, nodes, libraries, the /proc mask), ``ldconfig`` (the
  linker-cache step and its check), ``cgroup``, ``log``;
- ``other``: the rest of the run; ``exit`` (computed by the harness): from the end of
  the run to the process's end, as bench/measure.c sees it.

A function that does not exist in this build (the code moved) is left unwrapped:
its time falls to the phase around it. Each phase is timed twice: wall time and CPU
time (this process's, plus that of the children it waited for, e.g. ldconfig).
"""

from __future__ import annotations

import builtins
import gc
import os
import resource
import sys
import time

PHASES = ("interpreter", "imports", "config", "container", "request", "probe", "plan", "mounts", "ldconfig", "cgroup", "log", "other", "exit")
# (module, attribute, phase): functions whose time goes to a phase
WRAP = (
    ("ponytail.hooks.prestart", "open_log", "config"),
    ("ponytail.hooks.prestart", "_container", "container"),
    ("ponytail.container.request", "build_request", "request"),
    ("ponytail.plan.make", "make_plan", "plan"),
    ("ponytail.host.probe", "probe_host", "probe"),
    ("ponytail.apply.executor", "apply_plan", "mounts"),
    ("ponytail.apply.executor", "linker_cache", "ldconfig"),
    ("ponytail.apply.ldconfig", "check_cache", "ldconfig"),
    ("ponytail.apply.cgroup", "open_devices_cgroup", "cgroup"),  # imported by the executor when it needs it
    ("ponytail.apply.executor", "_allow_devices", "cgroup"),
)
LOG_METHODS = ("open", "write", "write_all", "close")

_wall = time.monotonic_ns
_process_cpu = time.process_time_ns


def _cpu() -> int:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return _process_cpu() + int((children.ru_utime + children.ru_stime) * 1e9)


_totals: dict[str, int] = {}  # wall ns per phase
_cpu_totals: dict[str, int] = {}  # CPU ns per phase
_stack: list[list] = []  # [phase, wall since, cpu since]


def _charge(phase: str, wall: int, cpu: int) -> None:
    _totals[phase] = _totals.get(phase, 0) + wall
    _cpu_totals[phase] = _cpu_totals.get(phase, 0) + cpu


def _enter(phase: str) -> None:
    wall, cpu = _wall(), _cpu()
    top = _stack[-1]
    _charge(top[0], wall - top[1], cpu - top[2])
    _stack.append([phase, wall, cpu])


def _leave() -> None:
    wall, cpu = _wall(), _cpu()
    phase, wall_since, cpu_since = _stack.pop()
    _charge(phase, wall - wall_since, cpu - cpu_since)
    _stack[-1][1:] = [wall, cpu]


def _timed(function, phase: str):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        _enter(phase)
        try:
            return function(*args, **kwargs)
        finally:
            _leave()

    return wrapper


_real_import = builtins.__import__


def _import(*args, **kwargs):  # type: ignore[no-untyped-def]
    if _stack[-1][0] == "imports":
        return _real_import(*args, **kwargs)
    _enter("imports")
    try:
        return _real_import(*args, **kwargs)
    finally:
        _leave()


def _wrap_all() -> list[str]:
    missing = []
    for module_name, attribute, phase in WRAP:
        try:
            module = __import__(module_name, fromlist=["_"])
        except ImportError:
            missing.append(module_name)
            continue
        if not hasattr(module, attribute):
            missing.append(f"{module_name}.{attribute}")
            continue
        setattr(module, attribute, _timed(getattr(module, attribute), phase))
    try:
        from ponytail.logfile import RunLog

        for method in LOG_METHODS:
            if hasattr(RunLog, method):
                setattr(RunLog, method, _timed(getattr(RunLog, method), "log"))
    except ImportError:
        missing.append("ponytail.logfile.RunLog")
    return missing


def main(first_line_ns: int, first_line_cpu_ns: int) -> None:
    gc.disable()  # as ponytail.entry.run does
    result_file, args = sys.argv[1], sys.argv[2:]
    _stack.append(["other", _wall(), _cpu()])
    builtins.__import__ = _import
    missing = _wrap_all()
    from ponytail.entry import main as ponytail_main

    code = ponytail_main(args)
    end, end_cpu = _wall(), _cpu()
    _leave_all(end, end_cpu)
    builtins.__import__ = _real_import
    start = int(os.environ.get("MEASURE_START_NS", first_line_ns))
    lines = [f"interpreter {first_line_ns - start} {first_line_cpu_ns}", f"end {end - start} {end_cpu}"]
    lines += [f"{phase} {ns} {_cpu_totals[phase]}" for phase, ns in _totals.items()]
    lines += [f"missing {name}" for name in missing]
    with open(result_file, "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(code)


def _leave_all(wall: int, cpu: int) -> None:
    while _stack:
        phase, wall_since, cpu_since = _stack.pop()
        _charge(phase, wall - wall_since, cpu - cpu_since)
