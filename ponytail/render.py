"""Human-readable text for plans (-debug) and GPUs (info)."""

from __future__ import annotations

from ponytail.host.probe import Gpu, Host
from ponytail.plan import LinkerCache, Mount, Plan, Symlink


def render_plan(plan: Plan, host: Host, header: list[str]) -> str:
    """The dry-run report: what a real run would do, per operation, and why."""
    out = ["ponytail -debug: dry run, nothing is changed"]
    out += [f"  {line}" for line in header]
    out.append(f"driver {host.driver_version}: {len(host.gpus)} GPU(s) on this host, {len(plan.gpus)} selected")
    for gpu in host.gpus:
        mark = "*" if gpu in plan.gpus else " "
        out.append(f"  {mark} {_gpu_line(gpu)}")
    out.append("device nodes:")
    for op in plan.operations:
        if isinstance(op, Mount) and op.kind == "device":
            assert op.rdev is not None
            out.append(f"  mount {op.source} -> {op.target}  (c {op.rdev[0]}:{op.rdev[1]}, {op.reason})")
    out.append("library search:")
    for report in host.glob_reports:
        out.append(f"  glob {report.pattern}: {len(report.matches)} match(es)")
        out += [f"    {m}" for m in report.matches]
        out += [f"    {m}  (from the driver root's ld.so.cache)" for m in report.from_cache]
    for skipped in plan.skipped:
        out.append(f"  skip {skipped.path}: {skipped.reason}")
    out.append("libraries and binaries (read-only, nosuid, nodev):")
    for op in plan.operations:
        if isinstance(op, Mount) and op.kind != "device":
            out.append(f"  mount {op.source} -> {op.target}  ({op.kind}, {op.reason})")
        elif isinstance(op, Symlink):
            out.append(f"  link  {op.target} -> {op.link_to}  ({op.reason})")
    out.append("linker cache:")
    for op in plan.operations:
        if isinstance(op, LinkerCache):
            out.append(f"  write {op.conf_file}: {', '.join(op.directories)}")
            out.append(f"  run   {op.ldconfig} -r <rootfs> {' '.join(op.directories)}  ({op.reason})")
    out += [f"warning: {w}" for w in plan.warnings]
    if plan.problems:
        out += [f"problem: {p}" for p in plan.problems]
        out.append("result: a real run would FAIL (see problems above)")
    else:
        out.append(f"result: a real run would make {len(plan.operations)} change(s)")
    return "\n".join(out) + "\n"


def _gpu_line(gpu: Gpu) -> str:
    return f"gpu {gpu.index}  {gpu.pci_bus_id}  /dev/nvidia{gpu.minor}  {gpu.uuid}  {gpu.model}"


def render_gpus(driver_version: str, gpus: tuple[Gpu, ...], notes: tuple[str, ...]) -> str:
    lines = [f"driver version: {driver_version}", f"gpus: {len(gpus)}"]
    for gpu in gpus:
        lines.append(f"  index {gpu.index}  minor {gpu.minor}  {gpu.pci_bus_id}  {gpu.uuid}  {gpu.model}")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines) + "\n"
