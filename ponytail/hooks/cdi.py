"""``ponytail cdi-hook``: the one createContainer hook a ponytail CDI spec names.

The engine has already created the device nodes and bind-mounted the driver's files (the
spec's edits); what is left is the plan's in-container work, which the spec passes as
arguments: the SONAME links (with the image-shadowing protection: a library the image ships
at a SONAME path is mounted over), a device's /dev/dri/by-path links (``--device-link``, in
that device's own hook, so a container gets only its GPUs' links), the masked /proc/driver/nvidia (only the GPUs whose nodes
the engine created, ModifyDeviceFiles: 0) and the linker-cache refresh with the host's
ldconfig. The executor applies them with the same rules as the prestart hook: every path
resolved inside the rootfs, nothing from the image run, nothing from the container's
environment read.

At createContainer (runc, crun) the hook runs in the container's mount namespace before
pivot_root: the rootfs is at its absolute path, the host's files at theirs. The pid in the
OCI state is the container's own view (runc sends 1) and is never used.
"""

from __future__ import annotations

import os
import sys

from ponytail.errors import InjectionError, PonytailError, UsageError
from ponytail.hooks.run import open_log, run

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from collections.abc import Mapping

    from ponytail.config import Config
    from ponytail.logfile import RunLog
    from ponytail.plan.operations import Operation, ProcMask

# each option's arity (ponytail.lite.argv); the click command in ponytail.cli.commands takes the same
OPTIONS = {
    "config": 1, "driver-version": 1, "major": 2, "gpu": 3, "link": 3, "device-link": 2, "mask-proc": 0, "ldconfig": 1, "directory": 1, "check": 2,
}
REPEATABLE = ("major", "gpu", "link", "device-link", "directory", "check")
# the values that must be absolute paths: the working directory is the rootfs, a relative path would be the image's
_ABSOLUTE = {"config": (0,), "link": (0, 2), "device-link": (0,), "ldconfig": (0,), "directory": (0,), "check": (1,)}
_NUMBERS = {"major": 1, "gpu": 0}  # the position of a value that must be a decimal number


def parse_args(args: list[str]) -> dict[str, object] | None:
    """The options of a plain cdi-hook command line (as the spec writes it), else None: help and
    errors are the click command's."""
    from ponytail.lite.argv import parse_options

    return parse_options(args, OPTIONS, REPEATABLE)  # type: ignore[return-value]  # a dict of values is a dict of objects


def main(options: Mapping[str, object]) -> int:
    """Run the hook with ``options`` (parse_args' or the click command's), through the error door
    (ponytail.hooks.run); the exit status."""
    return run(lambda log: _start(options, log), "cdi-hook")


def _start(options: Mapping[str, object], log: RunLog) -> int:
    _check_values(options)
    config_file = options.get("config")
    return _run(options, open_log(log, config_file if isinstance(config_file, str) else None), log)


def _check_values(options: Mapping[str, object]) -> None:
    """Paths that must be absolute are, numbers are numbers; else a usage error."""
    for name in {**_ABSOLUTE, **_NUMBERS}:
        given = options.get(name.replace("-", "_"))
        occurrences = given if name in REPEATABLE else (given,)
        for values in occurrences if isinstance(occurrences, tuple) else ():
            values = values if isinstance(values, tuple) else (values,)
            for k in _ABSOLUTE.get(name, ()):
                if isinstance(values[k], str) and not values[k].startswith("/"):
                    raise UsageError(f"cdi-hook: --{name} {values[k]!r} must be an absolute path")
            number = _NUMBERS.get(name)
            if number is not None and isinstance(values[number], str) and not (values[number].isdecimal() and values[number].isascii()):
                raise UsageError(f"cdi-hook: --{name} {values[number]!r} must be a number")


def _run(options: Mapping[str, object], config: Config, log: RunLog) -> int:
    from ponytail.container.oci import MAX_STATE_BYTES, load_container, parse_state, read_bounded

    state = parse_state(read_bounded(sys.stdin.buffer, MAX_STATE_BYTES, "OCI state on stdin"), lowest_pid=0)
    log.context = state.id
    container = load_container(state)
    log.write("info", f"cdi-hook started: rootfs {container.rootfs}; step: check the spec")
    check_stage(container.rootfs, state.pid)
    proc_root = config.proc_root
    made_for = options.get("driver_version")
    if made_for is not None:
        from ponytail.host.driver import read_driver_version

        running = read_driver_version(proc_root)
        if running != made_for:
            raise InjectionError(
                f"the CDI spec was generated for NVIDIA driver {made_for} but {running} is running: "
                "run 'ponytail cdi generate' again (see 'ponytail cdi check')"
            )
    _check_nodes(options, proc_root, container.char_devices)
    from ponytail.plan.operations import LD_CONF_FILE, LinkerCache, Symlink

    links: tuple[tuple[str, str, str], ...] = options.get("link") or ()  # type: ignore[assignment]  # OPTIONS' arities
    ops: list[Operation] = [Symlink(target, link_to, f"SONAME of {link_to}", library) for target, link_to, library in links]
    device_links: tuple[tuple[str, str], ...] = options.get("device_link") or ()  # type: ignore[assignment]
    ops += [Symlink(target, link_to, f"device link to {link_to}") for target, link_to in device_links]  # no library: a node's link
    mask = proc_mask_for(proc_root, container.char_devices) if options.get("mask_proc") else None
    if mask is not None:
        ops.append(mask)
    ldconfig = options.get("ldconfig")
    if isinstance(ldconfig, str):
        directories: tuple[str, ...] = options.get("directory") or ()  # type: ignore[assignment]
        checks: tuple[tuple[str, str], ...] = options.get("check") or ()  # type: ignore[assignment]
        ops.append(LinkerCache(LD_CONF_FILE, directories, ldconfig, checks, "make the driver's libraries loadable by SONAME"))
    from ponytail.apply.executor import apply_operations

    outcome = apply_operations(
        tuple(ops), container.rootfs, None, config.timeout_ldconfig, config.timeout_lock, progress=lambda step: log.write("info", f"step: {step}")
    )
    log.write_all("debug", outcome.done)
    log.write_all("warning", outcome.warnings)
    record_for_guard(config, state.id, container.char_devices, made_for if isinstance(made_for, str) else "", log)
    log.write("info", f"cdi-hook in {container.rootfs}: {len(outcome.done)} change(s), {len(outcome.unchanged)} already in place; {log.elapsed_ms():.1f} ms")
    return 0


def record_for_guard(config: Config, container_id: str, char_devices: tuple[tuple[int, int], ...], made_for: str, log: RunLog,
                     started_by: str = "cdi-hook") -> None:
    """Record the container for ``ponytail guard`` (ponytail.apply.containerrecord): the engine made its
    GPU nodes from the spec. The container's process is this hook's parent (the runtime's init, which
    becomes the container's process), named as the host sees it in /proc/self/stat. Also NVIDIA's
    hook names' route (ponytail.hooks.nvidia), ``started_by`` saying which."""
    if not config.records_dir:
        return
    from ponytail.apply.containerrecord import parent_pid, record_container
    from ponytail.host.driver import read_char_majors, read_driver_version

    try:
        majors = read_char_majors(config.proc_root)
        nvidia = {major: name for name, major in majors.items() if name.startswith("nvidia")}
        devices = [("c", major, minor, _node_name(nvidia[major], minor)) for major, minor in char_devices if major in nvidia]
        if not devices:
            return
        parent = parent_pid("self")
        if not os.path.samestat(os.stat(f"/proc/{parent}/ns/mnt"), os.stat("/proc/self/ns/mnt")):
            log.write("warning", f"container not recorded for ponytail guard: the hook's parent (process {parent}) is not the container's")
            return
        path = record_container(config.records_dir, container_id, parent, started_by, devices, read_driver_version(config.proc_root),
                                None, made_for, in_container=True)
    except (OSError, ValueError, PonytailError) as e:
        log.write("warning", f"container not recorded for ponytail guard: {e}")
        return
    log.write("debug", f"recorded for ponytail guard: {path}")


def _node_name(module: str, minor: int) -> str:
    """The node's path in the container, as a CDI spec names it (/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm...)."""
    if module in ("nvidia-frontend", "nvidia"):
        return {255: "/dev/nvidiactl", 254: "/dev/nvidia-modeset"}.get(minor, f"/dev/nvidia{minor}")
    if module == "nvidia-uvm":
        return "/dev/nvidia-uvm-tools" if minor == 1 else "/dev/nvidia-uvm"
    if module == "nvidia-caps":
        return f"/dev/nvidia-caps/nvidia-cap{minor}"
    return ""


def recorded_nodes(options: Mapping[str, object]) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """What the spec's nodes were made for (its --gpu and --major arguments): ([(minor, bus id, UUID)], {module: major})."""
    recorded_gpus: tuple[tuple[str, str, str], ...] = options.get("gpu") or ()  # type: ignore[assignment]  # OPTIONS' arities
    recorded_majors: tuple[tuple[str, str], ...] = options.get("major") or ()  # type: ignore[assignment]
    gpus = [(int(minor), bus_id, uuid) for minor, bus_id, uuid in recorded_gpus]
    return gpus, {name: int(major) for name, major in recorded_majors}


def _check_nodes(options: Mapping[str, object], proc_root: str, char_devices: tuple[tuple[int, int], ...]) -> None:
    """The nodes the engine created from the spec are still the ones it was made for: the
    modules' majors, and each GPU whose node this container has at its minor with its UUID."""
    from ponytail.host.driver import node_drift, nvidia_major

    gpus, majors = recorded_nodes(options)
    gpu_major = nvidia_major(majors)
    mine = [g for g in gpus if (gpu_major, g[0]) in char_devices]
    found = node_drift(proc_root, mine, majors)
    if found:
        raise InjectionError(f"the CDI spec is stale: {found[0]}; run 'ponytail cdi generate' again (see 'ponytail cdi check')")


def check_stage(rootfs: str, pid: int, name: str = "cdi-hook") -> None:
    """Only at createContainer: in the container's mount namespace, before it pivots into the
    image. There runc names the process that runs the hook (its pid in the container's own pid
    namespace) and crun names none (0); at prestart or createRuntime the state names the
    container's process, which is not the hook's parent, and the hook is in the runtime's
    mount namespace, where mounts must not be made."""
    if pid not in (0, os.getppid()):
        raise InjectionError(
            f"{name} is a createContainer hook (the engine runs it from a CDI spec), but the OCI state names process {pid}, not the one that ran it: for prestart or "
            "createRuntime use 'ponytail' itself"
        )
    try:
        ours = os.stat("/proc/self/ns/mnt")
        pivoted = os.path.samestat(os.stat("/"), os.stat(rootfs))
    except OSError as e:
        raise InjectionError(f"{name}: cannot look at this process's mount namespace and root: {e.strerror}") from e
    try:
        hosts = os.stat("/proc/1/ns/mnt")  # the host's init, in the host's /proc
    except OSError:  # may be denied, to the runtime's init as to a sandboxed host: nothing to compare
        hosts = None
    if hosts is not None and os.path.samestat(ours, hosts):
        raise InjectionError(f"{name} runs in the host's mount namespace: it is a createContainer hook; for prestart use 'ponytail' itself")
    if pivoted:
        raise InjectionError(f"{name}: the container has already switched its root to the rootfs; run it at createContainer")


def proc_mask_for(proc_root: str, char_devices: tuple[tuple[int, int], ...]) -> ProcMask | None:
    """The masked /proc/driver/nvidia for the GPUs and MIG devices whose nodes the engine created."""
    from ponytail.host.driver import nvidia_major, read_char_majors, read_gpu_informations, read_proc_files
    from ponytail.plan.operations import proc_mask

    proc_files = read_proc_files(proc_root)
    if "params" not in proc_files:  # no driver parameters to mask (as build_plan)
        return None
    majors = read_char_majors(proc_root)
    gpu_major = nvidia_major(majors)
    caps = {minor for major, minor in char_devices if major == majors.get("nvidia-caps")}
    infos = read_gpu_informations(proc_root, []).values()  # a GPU the driver lost has no node here either
    visible = {i.pci_bus_id for i in infos if (gpu_major, i.minor) in char_devices}
    migs: list = []
    access: list[str] = []
    access_files: dict[str, bytes] = {}
    if caps:  # MIG access nodes among the engine's: their MIG devices' access files (ponytail.host.mig only then)
        from ponytail.host.mig import mig_access_path, read_access_files, read_mig_devices

        for info in infos:
            migs += [(info.minor, m) for m in read_mig_devices(proc_root, info.minor, 0)[1] if {m.gi_minor, m.ci_minor} <= caps]
        access = [p for minor, m in migs for p in mig_access_path(minor, m)]
        access_files = read_access_files(proc_root, migs)
    information = {i.proc_name: i.text for i in infos}
    return proc_mask(proc_files, information, access_files, visible, access)
