"""``ponytail check``: the doctor. Looks at the host, the container engines in use and (given
a bundle or a rootfs) one container, and says in one line per finding what is wrong and
what to do. Exit status 0 only when every finding is ``ok``; 1 otherwise.

Nothing here changes anything, loads a driver library or runs a program of an image. The hook
never loads this module: it imports what it uses plainly, at the top.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat

from ponytail.config import Config
from ponytail.container.oci import State, load_container
from ponytail.doctor.beside import containerd_cdi, podman_runtime
from ponytail.doctor.cdi import cdi_findings
from ponytail.doctor.findings import FAIL, OK, WARN, Finding, report
from ponytail.doctor.loader import loader_view
from ponytail.engines import registry
from ponytail.engines.hooksd import HOOKS_DIRS
from ponytail.engines.model import Registered
from ponytail.engines.registry import ENGINES, KUBELET_CONFIGS, Engine
from ponytail.errors import PonytailError
from ponytail.fs.hostfiles import under_root
from ponytail.guard.watch import guard_pass
from ponytail.host.devchar import OK as LINKED
from ponytail.host.devchar import probe_char_links
from ponytail.host.driver import read_driver_version
from ponytail.host.driver_files import mismatch_message, soname_version
from ponytail.host.driver_search import firmware_dirs
from ponytail.host.driver_trees import describe_trees
from ponytail.host.filelist import FILELIST, missing_from_tables, read_filelist
from ponytail.host.nodes import NODE_MISSING, NODE_MODULE_NOT_LOADED
from ponytail.host.probe import probe_host
from ponytail.install.migrate.nvidia import runtime_values

__all__ = ["HOOKS_DIRS", "KUBELET_CONFIGS", "check_all", "check_container", "check_engines", "check_host", "check_running_containers", "run_check"]

EXPECTED_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")
PERSISTENCED_SOCKET = "/run/nvidia-persistenced/socket"


def run_check(
    config: Config, bundle: str | None, rootfs: str | None, engine_root: str, as_json: bool, engines: tuple[str, ...] = (),
    width: int | None = None,
) -> tuple[str, int]:
    """The report (text or JSON) and the exit status; ``width``: wrap the text's lines there
    (a terminal's width), their continuations indented under the message."""
    return report(check_all(config, bundle, rootfs, engine_root, engines), as_json, width)


def check_all(config: Config, bundle: str | None, rootfs: str | None, engine_root: str, engines: tuple[str, ...] = ()) -> list[Finding]:
    """Every finding: the host, the running GPU containers, the engines and (given a bundle or a rootfs) one container."""
    findings = check_host(config)
    findings += check_running_containers(config)
    findings += check_engines(engine_root, config, engines)
    if bundle is not None or rootfs is not None:
        findings += check_container(config, bundle, rootfs)
    return findings


# -- the running GPU containers ponytail started (ponytail guard's records) --------------

def check_running_containers(config: Config) -> list[Finding]:
    """What a report-only guard pass finds: containers that lost a GPU node, containers on a stale
    driver or CDI spec. Nothing when no container is recorded."""
    report = guard_pass(config, repair=False)
    out = [Finding("container", "guard records", WARN, problem) for problem in report.problems if "nothing is watched" not in problem]
    for c in report.containers:
        if c.state == "lost":
            out.append(Finding("container", c.id, FAIL, f"lost access to {', '.join(c.lost)} (a systemd reload?): run 'ponytail guard --once' "
                                                       "to give them back, and see docs/cgroup-v2-and-systemd.md"))
        if c.stale and c.state != "gone":
            out.append(Finding("container", c.id, WARN, f"bound to a driver that no longer runs: {'; '.join(c.stale)}; restart it"))
    if report.watched and not out:
        out.append(Finding("container", "guard", OK, f"{report.watched} running GPU container(s) recorded: none lost a node, none on a stale driver"))
    return out


# -- the host -------------------------------------------------------------------------

def check_host(config: Config) -> list[Finding]:
    out: list[Finding] = []
    try:
        kernel = read_driver_version(config.proc_root)
    except PonytailError as e:
        return [Finding("host", "driver", FAIL, e.message)]
    out.append(Finding("host", "driver", OK, f"NVIDIA kernel module {kernel} loaded"))
    try:
        host = probe_host(config, ("utility", "compute"), udev=False)
    except PonytailError as e:
        return out + [Finding("host", "probe", FAIL, e.message)]
    out += _library_versions(config, kernel)
    out += _firmware(config, kernel)
    out += _filelist(config)
    for node in [*host.gpu_nodes.values(), *host.control_nodes.values()]:
        if node.name == "nvidia-modeset" and node.kind == NODE_MISSING:
            continue  # only display drivers create it
        if node.problem is None:
            out.append(Finding("host", f"/dev/{node.name}", OK, f"c {node.major}:{node.minor}"))
        elif node.kind == NODE_MODULE_NOT_LOADED:  # one finding for the module, not one per node
            if node.name == "nvidia-uvm":
                out.append(Finding("host", "nvidia-uvm", FAIL, node.problem))
        else:
            out.append(Finding("host", f"/dev/{node.name}", FAIL, f"{node.problem}: run 'nvidia-modprobe -c0 -u' or recreate it with mknod"))
    out += _char_links(config, {node.name for node in [*host.gpu_nodes.values(), *host.control_nodes.values()] if node.problem is not None})
    out += [Finding("host", "gpus", WARN, note) for note in host.notes]
    out.append(_persistenced(config))
    out.append(_cgroup(config))
    for tree, version, problem in describe_trees(config, kernel):
        if problem is None:
            out.append(Finding("host", f"driver tree {tree.name}", OK, f"{tree.root}, version {version}"))
        else:
            out.append(Finding("host", f"driver tree {tree.name}", FAIL, f"{problem}: fix [drivers.{tree.name}] in {config.path or 'the config'} or the tree"))
    return out


def _char_links(config: Config, broken: set[str]) -> list[Finding]:
    """Every NVIDIA node's /dev/char/M:m link (but those of the ``broken`` nodes, which have a
    finding of their own): without one, runc under the systemd cgroup driver leaves the node out
    of the container's DeviceAllow= list, and 'systemctl daemon-reload' takes it away from
    running containers."""
    links = [link for link in probe_char_links(config.dev_root, config.proc_root) if link.node not in broken]
    if not links:
        return []
    subject = os.path.join(config.dev_root, "char")
    bad = [link for link in links if link.state != LINKED]
    if not bad:
        return [Finding("host", subject, OK, f"a link for each of the {len(links)} NVIDIA node(s)")]
    named = ", ".join(f"{link.link} ({link.node}: {link.state}{', ' + link.found if link.found else ''})" for link in bad[:_NAMED])
    more = f" and {len(bad) - _NAMED} more ('ponytail dev-char-links --dry-run' lists them)" if len(bad) > _NAMED else ""
    return [Finding(
        "host", subject, WARN,
        f"no good link for {len(bad)} NVIDIA node(s): {named}{more}; running containers lose these on 'systemctl "
        "daemon-reload' under the systemd cgroup driver: run 'ponytail dev-char-links' (its units in packaging/systemd keep them current)",
    )]


_NAMED = 2  # nodes a finding names before it counts the rest


def _library_versions(config: Config, kernel: str) -> list[Finding]:
    """What libcuda.so.1 and libnvidia-ml.so.1 of the driver root lead to must be the kernel
    module's version: anything else is NVML's 'Driver/library version mismatch'."""
    out = []
    for soname in EXPECTED_SONAMES:
        found = soname_version(config.driver_root, soname)
        if found is None:
            out.append(Finding("host", soname, FAIL, f"no {soname} named by version under the driver root {config.driver_root}: install the driver's libraries or set [host] driver_root"))
        elif found[0] == kernel:
            out.append(Finding("host", soname, OK, f"{under_root(config.driver_root, found[1])} matches the kernel module {kernel}"))
        else:
            out.append(Finding("host", soname, FAIL, mismatch_message(config.driver_root, soname, *found, kernel)))
    return out


def _firmware(config: Config, kernel: str) -> list[Finding]:
    for directory in firmware_dirs(config.sys_root, kernel):  # where the kernel looks first (updates, firmware_class.path)
        if os.path.isdir(under_root(config.driver_root, directory)):
            return [Finding("host", "firmware", OK, under_root(config.driver_root, directory))]
    base = under_root(config.driver_root, "/lib/firmware/nvidia")
    try:
        versions = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    except OSError:
        return []  # no GSP firmware installed: older GPUs and drivers need none
    if kernel in versions:
        return [Finding("host", "firmware", OK, f"{base}/{kernel}")]
    return [Finding("host", "firmware", FAIL, f"no GSP firmware for {kernel} in {base} (found {', '.join(versions) or 'none'}): reinstall the driver's firmware package")]


def _filelist(config: Config) -> list[Finding]:
    """The driver's own list of container files against the capability tables: what the
    tables miss (injected from the list all the same) and what in the list was unusable."""
    entries, notes = read_filelist(config.driver_root)
    out = [Finding("host", "driver file list", WARN, note) for note in notes]
    if not entries:
        return out
    missing = missing_from_tables(entries)
    if not missing:
        return out + [Finding("host", "driver file list", OK, f"the capability tables cover all {len(entries)} entries of {FILELIST}")]
    listed = ", ".join(f"{path} ({cap})" for path, cap in missing)
    return out + [Finding(
        "host", "driver file list", WARN,
        f"{len(missing)} of {len(entries)} files in {FILELIST} are not in ponytail's capability tables: {listed}; "
        "they are injected from the list; report them so the tables learn them",
    )]


def _persistenced(config: Config) -> Finding:
    path = under_root(config.ipc_root, PERSISTENCED_SOCKET)
    try:
        is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        is_socket = False
    if is_socket:
        return Finding("host", "nvidia-persistenced", OK, f"socket {path}")
    return Finding("host", "nvidia-persistenced", WARN, f"no socket {path}: start nvidia-persistenced (GPUs are re-initialised at every container start without it)")


def _cgroup(config: Config) -> Finding:
    """The cgroup version under [host] sys_root; a sys_root without cgroups (a simulated host,
    as the demo's) leaves the machine's own /sys/fs/cgroup, which the containers use."""
    root = os.path.join(config.sys_root, "fs/cgroup")
    where = ""
    if not _cgroup_version(root) and os.path.normpath(config.sys_root) != "/sys":
        where = f" (read at /sys/fs/cgroup: [host] sys_root {config.sys_root} has no fs/cgroup)"
        root = "/sys/fs/cgroup"
    version = _cgroup_version(root)
    if version == "v2":
        return Finding("host", "cgroup", OK, f"cgroup v2{where}: device access comes from eBPF programs; with Docker use ponytail-runtime, "
                                             "which writes the rules into config.json")
    if version == "v1":
        return Finding("host", "cgroup", OK, f"cgroup v1{where}: the hook allows each injected node in the container's devices cgroup")
    return Finding("host", "cgroup", WARN, f"no cgroup hierarchy under {root}: mount cgroup2 on /sys/fs/cgroup (containers need one)")


def _cgroup_version(root: str) -> str | None:
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        return "v2"
    if os.path.isdir(os.path.join(root, "devices")):
        return "v1"
    return None


# -- the engines ----------------------------------------------------------------------

def check_engines(root: str = "/", config: Config | None = None, engines: tuple[str, ...] = ()) -> list[Finding]:
    """The engines in use, and whether each will run ponytail: those named in ``engines``, else
    those whose service runs (its socket answers) and those already configured for ponytail; an
    engine that is only installed is not checked. ``root`` prefixes every configuration path and
    socket (a test's fake /etc and /run); programs are looked up on PATH. Every engine of
    ponytail.engines.registry, in its order, asked what its configuration registers."""
    out = []
    for engine in ENGINES:
        installed = _installed(engine, root)
        if engines:
            if engine.name not in engines:
                continue
            if not installed and not _running(engine, root):
                out.append(Finding("engine", engine.label, FAIL, f"{engine.label} is not installed here (no {engine.program} on PATH, "
                                                                 f"no {engine.config_dir}): install it, or leave out --engine {engine.name}"))
                continue
            out.append(_engine(engine, root))
        elif _running(engine, root) or installed and _configured(engine, root):
            out.append(_engine(engine, root))
        elif installed:
            out.append(Finding("engine", engine.label, OK, "installed, but its service is not running and it is not configured for "
                                                           f"ponytail: not checked ('ponytail check --engine {engine.name}' checks it)"))
    if not out:
        out.append(Finding("engine", "engines", WARN, "no docker, containerd, CRI-O or podman found: install one, or run ponytail as a hook of your runtime by hand"))
    out += containerd_cdi(out, root)
    out += podman_runtime(out, root, config or Config())
    out += cdi_findings(root, config or Config())
    return out


def _engine(engine: Engine, root: str) -> Finding:
    """What the engine's configuration registers (the engine's own reading of what configure wrote)."""
    found = engine.registered(root)
    if found is None:
        missing = engine.unregistered(root)
        fix = missing.fix or _set_up_line(engine.name, root, under_root(root, engine.config_path), missing.files)
        return Finding("engine", engine.label, FAIL, f"{missing.what}: run {fix}")
    if found.hook:
        return _hook_finding(engine.label, found)
    return _program_finding(engine.label, found.program or "", found.where)


def _running(engine: Engine, root: str) -> bool:
    """The engine's service runs: its API socket answers (a socket file a crashed daemon left
    does not). An engine that may serve only another (Debian's docker.io runs a system containerd
    for dockerd alone) counts, while that one runs too, only where a kubelet is configured."""
    if not any(_answers(under_root(root, path)) for path in engine.sockets):
        return False
    if engine.backend_of is not None and _running(registry.engine(engine.backend_of), root):
        return any(os.path.exists(under_root(root, path)) for path in KUBELET_CONFIGS)
    return True


def _answers(path: str) -> bool:
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
        directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(1)
            # by the directory's descriptor: a path of any length, and nothing sent
            client.connect(f"/proc/self/fd/{directory}/{os.path.basename(path)}")
        return True
    except OSError:
        return False
    finally:
        os.close(directory)


def _configured(engine: Engine, root: str) -> bool:
    """The engine's configuration names ponytail (set up for it, whether or not that works): ponytail
    registered, or named where it is not read (a hooks file in a default directory the engine left)."""
    return engine.registered(root) is not None or engine.unregistered(root).mentioned


def _installed(engine: Engine, root: str) -> bool:
    return (root == "/" and shutil.which(engine.program) is not None) or os.path.isdir(under_root(root, engine.config_dir))


def _set_up_line(engine: str, root: str, path: str, files: tuple[tuple[str, str], ...]) -> str:
    """The command that sets this engine up for ponytail: 'ponytail migrate --from nvidia' where its
    configuration runs NVIDIA's runtime (configure would add ponytail beside it), else configure."""
    nvidia = [name for name, text in files if runtime_values(text)]
    if nvidia:
        return (f"'ponytail migrate --from nvidia' ({', '.join(nvidia)} runs NVIDIA's nvidia-container-runtime: "
                "the migration replaces NVIDIA's toolkit, and --undo puts it back)")
    return _configure_line(engine, root, path)


def _configure_line(engine: str, root: str, path: str) -> str:
    """The command that registers this install with ``engine`` (its output says what to restart)."""
    where = f" --config-file {path}" if root != "/" else ""
    return f"'ponytail configure --runtime {engine}{where}' (it says what to restart)"


def _hook_finding(engine: str, hook: Registered) -> Finding:
    """A hooks.d file: the engine runs its command at prestart, and skips it silently when it is gone."""
    if hook.program is None:
        return Finding("engine", engine, FAIL, f"{hook.path} is not a valid oci-hooks file: run 'ponytail install-hook' to rewrite it")
    if not (os.path.isfile(hook.program) and os.access(hook.program, os.X_OK)):
        return Finding("engine", engine, FAIL, f"{hook.path} runs {hook.program}, which does not exist ({engine} skips such a hook "
                                               "silently): run 'ponytail install-hook'")
    return Finding("engine", engine, OK, f"{hook.path} runs {hook.program}")


def _program_finding(engine: str, program: str, where: str) -> Finding:
    located = program if program.startswith("/") else shutil.which(program)
    if located is None or not os.access(located, os.X_OK):
        return Finding("engine", engine, FAIL, f"{where} names {program}, which is not an executable: install ponytail or fix the path")
    return Finding("engine", engine, OK, f"{where} runs {located}")


# -- one container --------------------------------------------------------------------

def check_container(config: Config, bundle: str | None, rootfs: str | None) -> list[Finding]:
    """Which libcuda.so.1 and libnvidia-ml.so.1 the container's loader will pick once
    ponytail has injected the driver, and whether their versions match the kernel module."""
    env: dict[str, str] = {}
    annotations: dict[str, str] = {}
    privileged = True  # a rootfs alone: as a privileged container, whose choice of tree is always taken
    if bundle is not None:
        try:
            container = load_container(State("check", 1, os.path.abspath(bundle), "created", {}))
        except PonytailError as e:
            return [Finding("container", "bundle", FAIL, e.message)]
        env, annotations, privileged = container.env, container.annotations, container.privileged
        rootfs = rootfs or container.rootfs
    if rootfs is None:
        return [Finding("container", "rootfs", FAIL, "no container to check: pass --bundle or --rootfs")]
    if not os.path.isdir(rootfs):
        return [Finding("container", "rootfs", FAIL, f"{rootfs} is not a directory: pass the container's rootfs")]
    try:
        return loader_view(config, rootfs, env, annotations, privileged)
    except PonytailError as e:
        return [Finding("container", "driver", FAIL, e.message)]
