"""Human-readable text for plans (-debug) and GPUs (info)."""

from __future__ import annotations

from ponytail.host.driver_files import OTHER_ARCHITECTURE, SkippedFile
from ponytail.host.records import Gpu, Host
from ponytail.plan.operations import AllowDevices, HideNode, LinkerCache, Mount, Plan, ProcMask, Symlink

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported by info and -debug: for type checkers only
    from ponytail.config import Config
    from ponytail.container.request import Request

_SECTIONS = (
    ("libraries, binaries and driver files:", ("library", "binary", "file")),
    ("driver daemons' IPC:", ("ipc",)),
)


def render_plan(plan: Plan, host: Host, request: Request, header: list[str], *, in_container: bool = False,
                refusal: str | None = None) -> str:
    """The dry-run report: what a real run would do, per operation, and why. ``in_container``: the
    header names the container's cgroups; ``refusal``: why a real run would stop before the
    plan (not root), said as the result."""
    out = ["ponytail -debug: dry run, nothing is changed"]
    out += [f"  {line}" for line in header]
    out += plan.choices
    out.append(f"driver {host.driver_version}: {len(host.gpus)} GPU(s) on this host, {len(plan.gpus)} selected")
    for gpu in host.gpus:
        mark = "*" if gpu in plan.gpus else " "
        out.append(f"  {mark} {_gpu_line(gpu)}")
        for mig in gpu.mig_devices:
            mark = "*" if mig in plan.selection.migs else " "
            out.append(f"    {mark} MIG {mig.name}  gi {mig.gi} (nvidia-cap{mig.gi_minor})  ci {mig.ci} (nvidia-cap{mig.ci_minor})")
    out.append("device nodes:")
    for op in plan.operations:
        if isinstance(op, Mount) and op.kind == "device" and op.rdev is not None:
            out.append(f"  mount {op.source} -> {op.target}  (c {op.rdev[0]}:{op.rdev[1]}, {op.reason}; {','.join(op.options)})")
        elif isinstance(op, Symlink) and not op.library:  # a node's /dev/dri/by-path link
            out.append(f"  link  {op.target} -> {op.link_to}  ({op.reason})")
        elif isinstance(op, HideNode):
            out.append(f"  hide  {op.target}  (c {op.rdev[0]}:{op.rdev[1]}, {op.reason}; bound onto itself nodev,ro,nosuid,noexec)")
    out.append("library search:")
    empty = [r.search for r in host.reports if not r.matches and not r.from_cache]
    for report in host.reports:
        if report.matches or report.from_cache:
            out.append(f"  {report.search}: {len(report.matches) + len(report.from_cache)} match(es)")
            out += [f"    {m}" for m in report.matches]
            out += [f"    {m}  (from the driver root's ld.so.cache)" for m in report.from_cache]
    if empty:
        out.append(f"  no match for {len(empty)} name(s): {', '.join(empty)}")
    out += _skip_lines(plan.skipped)
    for title, kinds in _SECTIONS:
        section = []
        for op in plan.operations:
            if isinstance(op, Mount) and op.kind in kinds:
                section.append(f"  mount {op.source} -> {op.target}  ({op.kind}, {op.reason}; {','.join(op.options)})")
            elif isinstance(op, Symlink) and op.library and "library" in kinds:
                section.append(f"  link  {op.target} -> {op.link_to}  ({op.reason})")
        if section or kinds[0] == "library":  # no libraries is worth saying; no daemon socket is not
            out += [title, *(section or ["  none"])]
    for op in plan.operations:
        if isinstance(op, ProcMask):
            out.append(f"masked {op.target} (read-only tmpfs; {op.reason}):")
            out += [f"  file  {name} ({len(content)} bytes)" for name, content in op.files]
    for op in plan.operations:
        if isinstance(op, LinkerCache):
            out.append("linker cache:")
            out.append(f"  write {op.conf_file}: {', '.join(op.directories)}")
            out.append(f"  run   {op.ldconfig} -X -r <rootfs> {' '.join(op.directories)}  ({op.reason})")
            out.append(f"  check the container's cache resolves {', '.join(s for s, _ in op.sonames)} to the injected files")
            out.append("  write /etc/ld-musl-<arch>.path too when the image has musl's loader (it reads no ld.so.cache)")
    for op in plan.operations:
        if isinstance(op, AllowDevices):
            from ponytail.plan.devicefilter import describe

            where = "the container's cgroups are in the header" if in_container else "hook mode only: a manual run writes no device rules"
            out.append(f"device cgroup ({where}):")
            out.append(f"  allow {', '.join(op.rules)}  ({op.reason})")
            out.append("  cgroup v1: write each rule to the container's devices.allow")
            out.append(f"  cgroup v2: put in front of each device program attached to the container's cgroup a block of {describe(op.devices)}")
    out += [f"warning: {w}" for w in plan.warnings]
    if plan.problems:
        out += [f"problem: {p}" for p in plan.problems]
        out.append("result: a real run would FAIL (see problems above)")
    elif refusal is not None:
        out.append(f"result: a real run would FAIL: {refusal}")
    else:
        out.append(f"result: a real run would make {len(plan.operations)} change(s)")
    return "\n".join(out) + "\n"


def _skip_lines(skipped: tuple[SkippedFile, ...]) -> list[str]:
    """One line per skipped file, but one line for all the files skipped for the same other
    architecture: a 32-bit search (compat32) meets every 64-bit library of the driver root in
    its ld.so.cache, and those are never candidates (27 lines for Debian's full driver)."""
    lines: list[str] = []
    other: dict[str, list[str]] = {}
    for skip in skipped:
        if skip.reason.startswith(OTHER_ARCHITECTURE):
            if skip.reason not in other:
                lines.append(skip.reason)  # its place, filled in below
            other.setdefault(skip.reason, []).append(skip.path)
        else:
            lines.append(f"  skip {skip.path}: {skip.reason}")
    for reason, paths in other.items():
        if len(paths) == 1:
            line = f"  skip {paths[0]}: {reason}"
        else:
            per_dir: dict[str, int] = {}
            for path in paths:
                directory = path.rpartition("/")[0] or "/"
                per_dir[directory] = per_dir.get(directory, 0) + 1
            where = ", ".join(f"{d} ({n})" for d, n in per_dir.items())
            line = f"  skip {len(paths)} files {reason}: in {where}"
        lines[lines.index(reason)] = line
    return lines


def _gpu_line(gpu: Gpu) -> str:
    mig = "  MIG enabled" if gpu.mig_enabled else ""
    return f"gpu {gpu.index}  {gpu.pci_bus_id}  /dev/nvidia{gpu.minor}  {gpu.uuid}  {gpu.model}{mig}"


def render_gpus(driver_version: str, cuda_version: str | None, gpus: tuple[Gpu, ...], notes: tuple[str, ...]) -> str:
    lines = [f"driver version: {driver_version}", f"cuda version: {cuda_version or 'unknown (no libcuda found)'}", f"gpus: {len(gpus)}"]
    for gpu in gpus:
        mig = f"  MIG enabled, {len(gpu.mig_devices)} MIG device(s)" if gpu.mig_enabled else ""
        lines.append(f"  index {gpu.index}  minor {gpu.minor}  {gpu.pci_bus_id}  {gpu.uuid}  {gpu.model}{mig}")
        for m in gpu.mig_devices:
            lines.append(f"    MIG {m.name}  gpu instance {m.gi}  compute instance {m.ci}")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def render_trees(config: Config, kernel_version: str | None) -> str:
    """The registered trees for ``info``: how a container selects each, and whether it can."""
    if not config.drivers:
        return "driver trees: none registered (the host's driver root serves every container)\n"
    from ponytail.container.gpu_markers import DRIVER_VAR
    from ponytail.host.driver_trees import describe_trees

    lines = [f"driver trees: {len(config.drivers)} registered; a container selects one with {DRIVER_VAR}=NAME"]
    for tree, version, problem in describe_trees(config, kernel_version):
        state = f"not usable: {problem}" if problem else "usable"
        about = f"  {tree.description}" if tree.description else ""
        lines.append(f"  {tree.name}  {tree.root}  version {version or 'unknown'}  {state}{about}")
    return "\n".join(lines) + "\n"
