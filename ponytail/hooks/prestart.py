"""The hook run: config -> container -> probe -> plan -> apply (or print, with -debug).

Every run is logged; every error is one line on stderr with its exit status:
0 done, 1 injection failed, 2 bad usage, config or input.
"""

from __future__ import annotations

import os
import sys

from ponytail.container.oci import MAX_STATE_BYTES, Container, load_container, parse_state, read_bounded
from ponytail.errors import EXIT_INJECTION_FAILED, InputError, PonytailError, UsageError, one_line
from ponytail.hooks.run import open_log, run

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from typing import BinaryIO, TextIO

    from ponytail.config import Config
    from ponytail.container.request import Request
    from ponytail.host.probe import Host
    from ponytail.logfile import RunLog
    from ponytail.options import HookOptions
    from ponytail.plan.operations import Plan


def run_hook(options: HookOptions, stdin: BinaryIO | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """The hook's whole run, for every front end (the hook's command line, manual mode, -debug,
    click's ``ponytail``): load the config, open the log, run (_run), through the error door
    (ponytail.hooks.run): any error is one line on stderr and in the log. The exit status: 0 done,
    1 injection failed, 2 bad usage, config or input (or not root). Never raises. Missing streams
    (an engine may close them) read or write /dev/null."""
    stdin = stdin if stdin is not None else (sys.stdin.buffer if sys.stdin is not None else open(os.devnull, "rb"))
    stdout = stdout or sys.stdout or open(os.devnull, "w")  # None: started with the descriptor closed
    stderr = stderr or sys.stderr or open(os.devnull, "w")
    return run(lambda log: _run(options, open_log(log, options.config, default_log=True), stdin, stdout, stderr, log), stderr=stderr)


def _run(options: HookOptions, config: Config, stdin: BinaryIO, stdout: TextIO, stderr: TextIO, log: RunLog) -> int:
    """One run, step by step: who asks (the container whose OCI state is on stdin, or the rootfs
    of -root: manual mode), what it asks for (a Request), the plan for it on this host, and then
    the plan printed (-debug) or applied. The exit status."""
    log.context = f"manual:{options.root}" if options.root else "-"
    container = _container(options, config, stdin, log)
    request = _request(options, config, container, log)
    if request.devices.is_void:
        _say_not_a_gpu_request(request, options.debug, container is None, stdout, stderr, log)
        return 0
    if request.unknown_capabilities:  # from the image's env (an operator's -capabilities was refused): said, then ignored
        from ponytail.container.request import unknown_capabilities_message

        text = container.env.get(request.capabilities_source) if container else None
        print(f"ponytail: warning: {unknown_capabilities_message(request.unknown_capabilities, request.capabilities_source, text)}; "
              "ignored", file=stderr)
    rootfs = container.rootfs if container else options.root
    if not options.debug and rootfs is not None:
        refused = _not_root()
        if refused is not None:
            raise refused
        # so that a run the engine kills leaves which container, and where it was
        log.write("info", f"started: process {container.pid if container else '-'}, rootfs {rootfs}; step: plan")
    driver = _driver_tree(container, config, options.debug, stdout, log) if container else None
    from ponytail.plan.make import make_plan

    # a real run on the container's critical path reads sysfs directly; the dry run asks udev
    plan, host = make_plan(
        config, request, library_globs=_library_globs(options.libs), dry_run=options.debug, udev=options.debug,
        driver=driver, rootfs=rootfs, env=container.env if container else None,
        hide_other_gpus=config.isolate_privileged and container is not None and container.privileged,
    )
    if options.debug:
        return _print_plan(plan, host, request, _header(options, config, container, request), container, rootfs, stdout, log)
    if rootfs is None:  # pragma: no cover - _container guarantees one of them
        raise UsageError("no rootfs: pass -root DIR or run as an OCI hook")
    return _apply(plan, request, config, rootfs, container, driver is not None, host.driver_version, stderr, log)


def _request(options: HookOptions, config: Config, container: Container | None, log: RunLog) -> Request:
    """What the run asks for: -device and -capabilities, and the container's NVIDIA_* variables and
    device-plugin list (manual mode has no container: the options alone)."""
    from ponytail.container.request import build_request, request_for

    if container is None:
        return build_request(cli_device=options.device, cli_capabilities=options.capabilities,
                             accept_env_when_unprivileged=config.accept_env_when_unprivileged)
    if container.handover_refused is not None:  # a pod's own cdi.k8s.io/* annotations: never the device plugin's list
        log.write("warning", container.handover_refused)
    request = request_for(container, config, cli_device=options.device, cli_capabilities=options.capabilities)
    if not container.privileged and not config.accept_env_when_unprivileged and not request.devices.is_void \
            and container.plugin_devices is None and options.device is None:  # believed only for its pod's namespace: say so
        from ponytail.container.deviceplugin import management_namespace

        namespace = management_namespace(container.annotations, config.cri, config.env_namespaces)
        log.write("info", f"{request.devices.source} believed: the pod's namespace {namespace!r} is one of [request] env_namespaces")
    return request


def _say_not_a_gpu_request(request: Request, debug: bool, manual: bool, stdout: TextIO, stderr: TextIO, log: RunLog) -> None:
    """Nothing is injected into a container that asks for no GPU (NVIDIA_VISIBLE_DEVICES=void):
    logged, and said to a person (-debug, or manual mode)."""
    asked = f"{request.devices.source}={request.devices.selector!r}"
    log.write("info", f"not a GPU container ({asked}); nothing injected")
    if debug:
        stdout.write(f"ponytail -debug: {asked}: not a GPU container, nothing would be injected\n")
    elif manual:
        print(f"ponytail: {asked} asks for no GPU: nothing injected (name GPUs: -device 0,1, a UUID or all)", file=stderr)


def _driver_tree(container: Container, config: Config, debug: bool, stdout: TextIO, log: RunLog) -> tuple[str, str] | None:
    """The registered driver tree the container names (PONYTAIL_DRIVER or its annotation), as
    (name, who asked); None when it names none, or may not choose one (the strict policy: an
    unprivileged container chooses no driver code either), which is logged."""
    if not _names_driver_tree(container):
        return None
    from ponytail.container.driver_trees import refused_tree, requested_tree

    driver = requested_tree(container.env, container.annotations)
    refusal = refused_tree(driver, container.privileged, config.accept_env_when_unprivileged)
    if refusal is None:
        return driver
    log.write("warning", refusal)
    if debug:
        stdout.write(f"ponytail -debug: {refusal}\n")
    return None


def _print_plan(plan: Plan, host: Host, request: Request, header: list[str], container: Container | None, rootfs: str | None,
                stdout: TextIO, log: RunLog) -> int:
    """-debug: the plan as text, and the status a real run would exit with."""
    from ponytail.plan.render import render_plan

    not_root = _not_root() if rootfs is not None else None
    stdout.write(render_plan(plan, host, request, header, in_container=container is not None,
                             refusal=not_root.message if not_root else None))
    log.write("info", f"dry run: {len(plan.operations)} operation(s) planned, {len(plan.problems)} problem(s)")
    if plan.problems:
        return EXIT_INJECTION_FAILED
    return not_root.exit_code if not_root is not None else 0


def _apply(plan: Plan, request: Request, config: Config, rootfs: str, container: Container | None, from_tree: bool,
           driver_version: str, stderr: TextIO, log: RunLog) -> int:
    """The real run: apply the plan, log what it did (and each step before it starts), record the
    container for ``ponytail guard``, say the plan's warnings; manual mode at a terminal is told what
    was injected."""
    from ponytail.apply.executor import apply_plan

    outcome = apply_plan(
        plan, rootfs, container.pid if container else None, config.timeout_ldconfig, config.timeout_lock, config.extend_denying_programs,
        lambda step: log.write("info", f"step: {step}"),
    )
    log.write_all("debug", outcome.done + outcome.unchanged)
    if container is not None:
        _record(config, container, plan, driver_version, log)
    if from_tree or len(plan.choices) > 1:  # a driver tree or a CUDA compat directory
        log.write_all("info", plan.choices)
    log.write_all("warning", plan.warnings + tuple(outcome.warnings))
    for warning in plan.said:
        print(f"ponytail: warning: {one_line(warning)}", file=stderr)
    gpu_text = ",".join(str(g.index) for g in plan.selection.gpus) or "none"
    mig_text = f" MIG [{','.join(m.name for m in plan.selection.migs)}]" if plan.selection.migs else ""
    injected = (
        f"injected into {rootfs}: GPUs [{gpu_text}]{mig_text} ({request.devices.source}), capabilities "
        f"{','.join(request.capabilities)}; {_count(plan.count('device'), 'device node')}, "
        f"{_count(plan.count('library'), 'library', 'libraries')}, {_count(plan.count('binary'), 'binary', 'binaries')}; "
        f"{_count(len(outcome.done), 'change')}, {len(outcome.unchanged)} already in place"
    )
    log.write("info", f"{injected}; {log.elapsed_ms():.1f} ms")
    if container is None and _interactive(stderr):  # manual mode at a terminal: the person is told what happened
        print(f"ponytail: {injected}", file=stderr)
    return 0


def _record(config: Config, container: Container, plan: Plan, driver_version: str, log: RunLog) -> None:
    """Record what the container was given, for ``ponytail guard`` (ponytail.apply.containerrecord)."""
    from ponytail.plan.operations import AllowDevices, Mount

    directory = config.records_dir
    allow = next((op for op in plan.operations if isinstance(op, AllowDevices)), None)
    if not directory or allow is None:
        return
    libcuda = next((op for op in plan.operations if isinstance(op, Mount) and op.kind == "library"
                    and os.path.basename(op.source).startswith("libcuda.so")), None)
    identity: dict[str, object] | None = None
    if libcuda is not None:
        identity = {"path": libcuda.source, "identity": list(libcuda.identity or ())}
    from ponytail.apply.containerrecord import record_container

    devices = [("c", major, minor, path) for (major, minor), path in zip(allow.devices, allow.nodes or ("",) * len(allow.devices), strict=False)]
    try:
        path = record_container(directory, container.id, container.pid, "hook", devices, driver_version, identity)
    except (OSError, ValueError) as e:
        log.write("warning", f"container not recorded for ponytail guard: {e}")
        return
    log.write("debug", f"recorded for ponytail guard: {path}")
def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _not_root() -> PonytailError | None:
    """Why a real run by this process would stop at once: only root may mount into a rootfs (a
    rootless engine runs its hooks as root in its user namespace)."""
    if os.geteuid() == 0:
        return None
    from ponytail.errors import NOT_ROOT_HINT, PermissionDenied

    return PermissionDenied(f"injecting mounts into the rootfs, which needs root (this is uid {os.geteuid()}): {NOT_ROOT_HINT}")


def _names_driver_tree(container: Container) -> bool:
    from ponytail.container.gpu_markers import DRIVER_ANNOTATION, DRIVER_VAR

    return DRIVER_VAR in container.env or DRIVER_ANNOTATION in container.annotations


def _container(options: HookOptions, config: Config, stdin: BinaryIO, log: RunLog) -> Container | None:
    if options.root is not None:
        if not os.path.isdir(options.root):
            raise UsageError(f"-root {options.root}: not a directory")
        return None
    if _interactive(stdin):  # a person at a terminal, not a container engine: never wait for input
        raw = b""
    else:
        raw = read_bounded(stdin, MAX_STATE_BYTES, "OCI state on stdin")
    if options.debug and not raw.strip():
        return None
    if not raw.strip():
        raise InputError(
            "no OCI state on stdin: ponytail runs as an OCI prestart hook; to inject by hand pass -root DIR, "
            "to see the plan pass -debug"
        )
    state = parse_state(raw)
    log.context = state.id  # from here on every failure is logged with the container's id
    return load_container(state, config=config)


def _interactive(stream: BinaryIO | TextIO) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def _library_globs(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    globs = tuple(g.strip() for g in text.split(",") if g.strip())
    for g in globs:
        if not g.startswith("/"):
            raise UsageError(f"-libs: {g!r} must be an absolute path or glob (resolved under the driver root)")
    if not globs:
        raise UsageError("-libs: no globs given")
    return globs


def _header(options: HookOptions, config: Config, container: Container | None, request: Request) -> list[str]:
    lines = [f"config: {config.path or 'built-in defaults (no config file)'}"]
    lines.append(f"driver root: {config.driver_root}  proc: {config.proc_root}  sys: {config.sys_root}  dev: {config.dev_root}")
    if container is not None:
        lines.append(f"hook mode: container {container.id} pid {container.pid} status {container.status!r}")
        lines.append(f"rootfs: {container.rootfs} (in the mount namespace of pid {container.pid})")
        from ponytail.apply.cgroup import describe_device_cgroup

        lines += describe_device_cgroup(container.pid)
    elif options.root is not None:
        lines.append(f"manual mode: rootfs {options.root} (in this mount namespace)")
    else:
        lines.append("no container: no OCI state on stdin and no -root; showing what would be injected")
    if container is not None and container.handover_refused is not None:
        lines.append(f"device plugin: {container.handover_refused}")
    lines.append(f"devices requested: {request.devices.selector!r} (from {request.devices.source})")
    lines.append(f"capabilities: {','.join(request.capabilities) or 'none'} (from {request.capabilities_source})")
    for var, expression in request.requirements:
        lines.append(f"requirement: {var}={expression!r}")
    return lines
