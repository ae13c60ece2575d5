"""make_plan: the host probed for one request, and the plan for it.

The one way a plan is made: by the hook run, by ``ponytail list`` and by ponytail-runtime (for the
device rules it writes). The driver tree a container names, the image's CUDA compat directory and
the container's NVIDIA_REQUIRE_* are decided here too. A plan with problems is an error, except in
a dry run, which shows them.
"""

from __future__ import annotations

import os

from ponytail.config import Config
from ponytail.errors import InputError, PonytailError, ProbeError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from ponytail.container.request import Request
    from ponytail.host.records import Host
    from ponytail.plan.compat import Compat
    from ponytail.plan.operations import Plan


def make_plan(
    config: Config, request: Request, *, library_globs: tuple[str, ...] | None = None, dry_run: bool, udev: bool = True,
    driver: tuple[str, str] | None = None, rootfs: str | None = None, env: dict[str, str] | None = None,
    hide_other_gpus: bool = False,
) -> tuple[Plan, Host]:
    """Probe the host for ``request`` and plan it. A plan with problems is an error,
    except in a dry run, which shows the problems instead. ``driver`` (name, who asked)
    selects a registered driver tree; ``rootfs`` is looked at for a CUDA compat directory;
    ``hide_other_gpus``: see build_plan."""
    from ponytail.host.driver_search import find_ldconfig
    from ponytail.host.probe import probe_host
    from ponytail.plan.operations import build_plan
    from ponytail.plan.select import select_devices, select_gpus

    config, tree_version, tree_line = _driver_tree(config, driver)
    host = probe_host(
        config, request.capabilities, library_globs, udev, library_version=tree_version, features=request.features, allow_lost=True
    )
    if host.lost:
        _refuse_numbering(host, request)
    tree = driver[0] if driver is not None else ""
    if tree:
        from ponytail.host.driver_trees import refuse_untrusted_tree

        refuse_untrusted_tree(tree, config.driver_root, [f.path for f in (*host.libraries, *host.binaries, *host.files)])
    try:
        selection = select_devices(host.gpus, request.devices, lambda: _mig_uuids(config, host, tree, tree_version))
    except InputError:
        if host.lost:  # the GPU asked for may be the one the driver lost (its UUID with it): said as for an index
            raise _lost_gpu(host) from None
        raise
    mig_gpus = {
        what: select_gpus(host.gpus, wanted)
        for what, wanted in (("config", request.mig_config), ("monitor", request.mig_monitor))
        if wanted is not None
    }
    plan = pin_libraries(build_plan(host, request, selection, mig_gpus, find_ldconfig(config.ldconfig), hide_other_gpus,
                                    named_libraries=library_globs is not None))
    if host.lost:
        from ponytail.lite.records import replace

        plan = replace(plan, warnings=plan.warnings + tuple(f"{g.found}: GPUs named by UUID or bus id only" for g in host.lost))
    plan, compat = _cuda_compat(plan, host, config, rootfs, env, tree_version, tree_line)
    plan = _mps_pipe_directory(plan, config, request, env)
    if rootfs is not None:
        plan = _image_dependencies(plan, host, rootfs)
    notes: list[str] = []
    unmet = _unmet_requirement(config, host, request, plan, tree, tree_version, compat, notes)
    if notes:
        from ponytail.lite.records import replace

        plan = replace(plan, warnings=plan.warnings + tuple(notes))
    if unmet is not None:
        if not dry_run:
            raise unmet
        from ponytail.lite.records import replace

        plan = replace(plan, problems=plan.problems + (unmet.message,))
    if plan.problems and not dry_run:
        more = f" (and {len(plan.problems) - 1} more; run with -debug to see all)" if len(plan.problems) > 1 else ""
        raise ProbeError(plan.problems[0] + more)
    return plan, host


def _refuse_numbering(host: Host, request: Request) -> None:
    """With a GPU lost by the driver the indices are not the ones the container was given: a
    request by index, ``all`` or a MIG device by index fails; one by UUID or bus id starts."""
    from ponytail.plan.select import names_by_identity

    wanted = [request.devices] + [d for d in (request.mig_config, request.mig_monitor) if d is not None]
    if not all(names_by_identity(d) for d in wanted):
        raise _lost_gpu(host)


def _lost_gpu(host: Host) -> ProbeError:
    """The one error of a request the lost GPU may have taken: one by index (the indices shifted)
    and one naming a GPU not found (the lost GPU's UUID is gone with it) alike, exit 1."""
    return ProbeError(f"{host.lost[0].message} (a container asking for a GPU the driver still has, by UUID or bus id, still starts)")


def pin_libraries(plan: Plan) -> Plan:
    """The plan with the identity of each library it mounts, taken before anything is judged on
    those files (NVIDIA_REQUIRE_CUDA asks libcuda): the executor mounts a library only if the
    file it clones is still that one (ponytail.apply.executor), never a file installed meanwhile."""
    from ponytail.lite.records import replace
    from ponytail.plan.operations import Mount

    ops = list(plan.operations)
    for i, op in enumerate(ops):
        if isinstance(op, Mount) and op.kind == "library":
            try:
                st = os.stat(op.source)
            except OSError:
                continue  # cloning it fails with the reason
            ops[i] = replace(op, identity=(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return replace(plan, operations=tuple(ops))


def _driver_tree(config: Config, driver: tuple[str, str] | None) -> tuple[Config, str, str]:
    """The config to probe with (a registered tree's root as driver root), the tree's
    version ("" for the host's driver root) and what was chosen and why (ponytail.host.driver_trees)."""
    if driver is None:
        return config, "", f"host driver root {config.driver_root} (no driver tree requested)"
    from ponytail.host.driver import read_driver_version
    from ponytail.host.driver_trees import choose_tree

    config, tree = choose_tree(config, driver, read_driver_version(config.proc_root))
    return config, tree.version, tree.describe()


def _cuda_compat(
    plan: Plan, host: Host, config: Config, rootfs: str | None, env: dict[str, str] | None, tree_version: str, tree_line: str
) -> tuple[Plan, Compat | None]:
    """The plan with the image's CUDA compat directory first when it is used (ponytail.plan.compat),
    and the driver tree and compat choices recorded in it."""
    from ponytail.lite.records import replace

    compat = None
    if rootfs is not None and host.library("libcuda.so.1") is not None and _may_have_cuda(rootfs):
        from ponytail.container.image_compat import read_compat_dir  # resolves the path safely inside the rootfs
        from ponytail.plan.compat import apply_compat, choose_compat

        compat = choose_compat(read_compat_dir(rootfs), env, tree_version or host.driver_version, config.cuda_compat)
        plan = apply_compat(plan, compat)
    choices: tuple[str, ...] = (f"user-mode driver: {tree_line}",)
    if compat is not None:
        choices += (f"CUDA compat {compat.directory}: {'used' if compat.used else 'not used'}, {compat.why}",)
    return replace(plan, choices=choices), compat


def _mps_pipe_directory(plan: Plan, config: Config, request: Request, env: dict[str, str] | None) -> Plan:
    """A warning when the container names another MPS pipe directory than the host's: its
    CUDA_MPS_PIPE_DIRECTORY is a path in the container, never taken as a host path (it would let
    an image mount any host directory into itself), so its MPS clients would not find the daemon."""
    asked = (env or {}).get("CUDA_MPS_PIPE_DIRECTORY")
    if asked is None or "compute" not in request.capabilities or os.path.normpath(asked) == config.mps_pipe_directory:
        return plan
    from ponytail.lite.records import replace

    warning = (
        f"the container's CUDA_MPS_PIPE_DIRECTORY={asked!r} is not the host's MPS pipe directory "
        f"{config.mps_pipe_directory} ([host] mps_pipe_directory), which is what is mounted: unset it in the image, "
        "or set it to that path"
    )
    return replace(plan, warnings=plan.warnings + (warning,))


# the injected files whose dependencies the image must have: the libraries a capability cannot
# work without, and the binaries
CORE_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")


def _image_dependencies(plan: Plan, host: Host, rootfs: str) -> Plan:
    """A warning (said on stderr too) naming each injected core library or binary that links
    against a library the image lacks (libdl.so.2, libpthread.so.0, librt.so.1 of glibc): the
    start would succeed and the program then fail inside the container."""
    from ponytail.container.image_libs import lacking_dependencies, lacking_message
    from ponytail.lite.records import replace
    from ponytail.plan.operations import Mount

    mounted = {op.source for op in plan.operations if isinstance(op, Mount) and op.kind in ("library", "binary")}
    provided = {lib.soname for lib in host.libraries if lib.host_path in mounted and lib.soname}
    files = [(lib.soname or lib.target, lib.needed) for lib in host.libraries
             if lib.soname in CORE_SONAMES and lib.bits == 64 and lib.host_path in mounted]
    files += [(binary.target, binary.needed) for binary in host.binaries if binary.host_path in mounted]
    warnings = tuple(lacking_message(name, lacking) for name, lacking in lacking_dependencies(rootfs, files, provided))
    return replace(plan, warnings=plan.warnings + warnings, said=plan.said + warnings) if warnings else plan


def _may_have_cuda(rootfs: str) -> bool:
    """False only when the image surely has no /usr/local/cuda (most images): then the CUDA
    compat module is not even imported. Never follows a link: one means 'maybe'."""
    import stat

    path = rootfs
    for name in ("usr", "local", "cuda"):
        path = f"{path}/{name}"
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return False
        if not stat.S_ISDIR(mode):
            return stat.S_ISLNK(mode)
    return True


def _unmet_requirement(
    config: Config, host: Host, request: Request, plan: Plan, tree: str, tree_version: str, compat: Compat | None, notes: list[str]
) -> PonytailError | None:
    if not request.requirements:
        return None
    from ponytail.container.require import Facts, RequirementNotMet, check_requirements
    from ponytail.host.cuda import cuda_driver_version, format_cuda_version
    from ponytail.host.driver_search import find_driver_file

    def cuda() -> str:  # the CUDA of the libcuda the container will load
        if compat is not None and compat.used:
            from ponytail.plan.compat import cuda_version_of_driver

            return cuda_version_of_driver(compat.version) or "0.0"
        version = tree_version or host.driver_version
        try:
            libcuda = find_driver_file(config, version, "libcuda", "libcuda.so.1", host).path
        except ProbeError:
            if host.mismatch and not tree:  # the libraries are another driver's: the one diagnosis of that
                raise ProbeError(host.mismatch) from None
            raise
        if tree:  # not among the request's files when it does not ask for compute
            from ponytail.host.driver_trees import refuse_untrusted_tree

            refuse_untrusted_tree(tree, config.driver_root, [libcuda])
        return format_cuda_version(cuda_driver_version(config.driver_root, libcuda, config.cache_dir, config.timeout_probe, notes))

    try:
        check_requirements(request.requirements, Facts(host.driver_version, cuda, tuple(g.model for g in plan.gpus)))
    except RequirementNotMet as e:
        return e
    return None


def _mig_uuids(config: Config, host: Host, tree: str, tree_version: str) -> dict[str, tuple[int, int, int]]:
    from ponytail.host.driver_search import find_driver_file
    from ponytail.host.mig import mig_uuids

    nvml = find_driver_file(config, tree_version or host.driver_version, "libnvidia-ml", "libnvidia-ml.so.1", host)
    if tree:  # not among the request's files when it does not ask for utility
        from ponytail.host.driver_trees import refuse_untrusted_tree

        refuse_untrusted_tree(tree, config.driver_root, [nvml.path])
    return mig_uuids(nvml.host_path, config.timeout_probe)
