"""Host + selected GPUs -> Plan: every operation, in order, with the reason it is there.

Pure: no I/O. The executor applies a Plan; ``-debug`` prints the same Plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ponytail.host.files import SkippedFile
from ponytail.host.probe import DeviceNode, Gpu, Host

LD_CONF_FILE = "/etc/ld.so.conf.d/00-ponytail.conf"


@dataclass(frozen=True)
class Mount:
    """Bind-mount a host file onto ``target`` inside the rootfs."""

    kind: str  # "device", "library", "binary"
    source: str
    target: str
    read_only: bool
    reason: str
    rdev: tuple[int, int] | None = None  # for device nodes: the major:minor the source must have


@dataclass(frozen=True)
class Symlink:
    """Create ``target`` -> ``link_to`` inside the rootfs (SONAME links)."""

    target: str
    link_to: str
    reason: str


@dataclass(frozen=True)
class LinkerCache:
    """Add ``directories`` to the rootfs's linker config, then run the host's ldconfig on it."""

    conf_file: str
    directories: tuple[str, ...]
    ldconfig: str
    reason: str


Operation = Mount | Symlink | LinkerCache


@dataclass(frozen=True)
class Plan:
    operations: tuple[Operation, ...]
    gpus: tuple[Gpu, ...]
    skipped: tuple[SkippedFile, ...]
    warnings: tuple[str, ...]
    problems: tuple[str, ...]  # a real run refuses to start when any are present

    def count(self, kind: str) -> int:
        return sum(1 for op in self.operations if isinstance(op, Mount) and op.kind == kind)


EMPTY_PLAN = Plan((), (), (), (), ())


def build_plan(host: Host, gpus: tuple[Gpu, ...], ldconfig: str | None) -> Plan:
    """Every operation that gives the container ``gpus`` and the driver's files."""
    ops: list[Operation] = []
    warnings = list(host.notes)
    problems: list[str] = []
    for gpu in gpus:
        node = host.gpu_nodes[gpu.minor]
        _device(ops, problems, warnings, node, f"GPU {gpu.index} {gpu.pci_bus_id} {gpu.model}", fatal=True)
    for node in host.control_nodes:
        fatal = node.name == "nvidiactl"
        _device(ops, problems, warnings, node, "control device" if fatal else "CUDA unified memory", fatal=fatal)

    if not host.libraries:
        patterns = ", ".join(r.pattern for r in host.glob_reports)
        problems.append(
            f"no library of driver {host.driver_version} found (globs: {patterns}; and the driver root's "
            f"ld.so.cache): set [host] driver_root or [library] paths in the config"
        )
    for report in host.glob_reports:
        if not report.matches and not report.from_cache:
            warnings.append(f"library glob {report.pattern} matched nothing")
    links: dict[str, Symlink] = {}
    for lib in host.libraries:
        ops.append(Mount("library", lib.host_path, lib.target, True, f"found by {lib.found_by}"))
        directory, name = os.path.split(lib.target)
        if lib.soname and lib.soname != name:
            link = f"{directory}/{lib.soname}"
            links.setdefault(link, Symlink(link, name, f"SONAME of {name}"))
    ops.extend(links.values())
    for binary in host.binaries:
        ops.append(Mount("binary", binary.host_path, binary.target, True, f"found in {binary.found_by}"))
    if host.libraries:
        directories = tuple(sorted({os.path.dirname(lib.target) for lib in host.libraries}))
        if ldconfig is None:
            problems.append(
                "no ldconfig on the host (looked in /sbin and /usr/sbin): set [host] ldconfig in the config"
            )
        else:
            ops.append(LinkerCache(LD_CONF_FILE, directories, ldconfig, "make the driver's libraries loadable by SONAME"))
    return Plan(tuple(ops), gpus, host.skipped, tuple(warnings), tuple(problems))


def _device(ops: list[Operation], problems: list[str], warnings: list[str], node: DeviceNode, why: str, fatal: bool) -> None:
    if node.problem is None:
        ops.append(Mount("device", node.host_path, f"/dev/{node.name}", False, why, (node.major, node.minor)))
    elif fatal:
        problems.append(f"{why}: {node.problem}")
    else:
        warnings.append(f"/dev/{node.name} not injected: {node.problem}")

