"""``ponytail check``: the doctor. Looks at the host, the container engines and (given a
bundle or a rootfs) one container, and says in one line per finding what is wrong and
what to do. Exit status 0 only when every finding is ``ok``; 1 otherwise.

Nothing here changes anything, loads a driver library or runs a program of an image.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import asdict, dataclass

from ponytail.config import Config

OK, WARN, FAIL = "ok", "warning", "problem"
EXPECTED_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")
HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
PERSISTENCED_SOCKET = "/run/nvidia-persistenced/socket"


@dataclass(frozen=True)
class Finding:
    area: str  # "host", "engine", "container"
    subject: str  # what was looked at: "driver", "/dev/nvidia0", "docker", "libcuda.so.1"
    level: str  # ok, warning, problem
    message: str  # what was found; for warnings and problems also what to do


def run_check(config: Config, bundle: str | None, rootfs: str | None, engine_root: str, as_json: bool) -> tuple[str, int]:
    """The report (text or JSON) and the exit status."""
    findings = check_host(config)
    findings += check_engines(engine_root, config)
    if bundle is not None or rootfs is not None:
        findings += check_container(config, bundle, rootfs)
    status = 0 if all(f.level == OK for f in findings) else 1
    if as_json:
        document = {"ok": status == 0, "findings": [asdict(f) for f in findings]}
        return json.dumps(document, indent=2) + "\n", status
    from ponytail.errors import one_line

    lines = [f"{f.level:8} {f.area:9} {one_line(f.subject)}: {one_line(f.message)}" for f in findings]
    bad = sum(1 for f in findings if f.level != OK)
    lines.append("all is well" if status == 0 else f"{bad} finding(s) need attention")
    return "\n".join(lines) + "\n", status


# -- the host -------------------------------------------------------------------------

def check_host(config: Config) -> list[Finding]:
    from ponytail.errors import PonytailError
    from ponytail.host.driver import read_driver_version
    from ponytail.host.probe import probe_host

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
    for node in [*host.gpu_nodes.values(), *host.control_nodes.values()]:
        if node.name == "nvidia-modeset" and node.problem is not None and "does not exist" in node.problem:
            continue  # only display drivers create it
        if node.problem is None:
            out.append(Finding("host", f"/dev/{node.name}", OK, f"c {node.major}:{node.minor}"))
        elif "nvidia-uvm module" in node.problem:
            if node.name == "nvidia-uvm":
                out.append(Finding("host", "nvidia-uvm", FAIL, node.problem))
        else:
            out.append(Finding("host", f"/dev/{node.name}", FAIL, f"{node.problem}: run 'nvidia-modprobe -c0 -u' or recreate it with mknod"))
    out += [Finding("host", "gpus", WARN, note) for note in host.notes]
    out.append(_persistenced(config))
    out.append(_cgroup(config))
    from ponytail.container.umd import describe_trees

    for tree, version, problem in describe_trees(config, kernel):
        if problem is None:
            out.append(Finding("host", f"driver tree {tree.name}", OK, f"{tree.root}, version {version}"))
        else:
            out.append(Finding("host", f"driver tree {tree.name}", FAIL, f"{problem}: fix [drivers.{tree.name}] in {config.path or 'the config'} or the tree"))
    return out


def _library_versions(config: Config, kernel: str) -> list[Finding]:
    """What libcuda.so.1 and libnvidia-ml.so.1 of the driver root lead to must be the kernel
    module's version: anything else is NVML's 'Driver/library version mismatch'."""
    from ponytail.host.files import host_path, mismatch_message, soname_version

    out = []
    for soname in EXPECTED_SONAMES:
        found = soname_version(config.driver_root, soname)
        if found is None:
            out.append(Finding("host", soname, FAIL, f"no {soname} named by version under the driver root {config.driver_root}: install the driver's libraries or set [host] driver_root"))
        elif found[0] == kernel:
            out.append(Finding("host", soname, OK, f"{host_path(config.driver_root, found[1])} matches the kernel module {kernel}"))
        else:
            out.append(Finding("host", soname, FAIL, mismatch_message(config.driver_root, soname, *found, kernel)))
    return out


def _firmware(config: Config, kernel: str) -> list[Finding]:
    from ponytail.host.files import host_path

    base = host_path(config.driver_root, "/lib/firmware/nvidia")
    try:
        versions = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    except OSError:
        return []  # no GSP firmware installed: older GPUs and drivers need none
    if kernel in versions:
        return [Finding("host", "firmware", OK, f"{base}/{kernel}")]
    return [Finding("host", "firmware", FAIL, f"no GSP firmware for {kernel} in {base} (found {', '.join(versions) or 'none'}): reinstall the driver's firmware package")]


def _persistenced(config: Config) -> Finding:
    from ponytail.host.files import host_path

    path = host_path(config.ipc_root, PERSISTENCED_SOCKET)
    try:
        is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        is_socket = False
    if is_socket:
        return Finding("host", "nvidia-persistenced", OK, f"socket {path}")
    return Finding("host", "nvidia-persistenced", WARN, f"no socket {path}: start nvidia-persistenced (GPUs are re-initialised at every container start without it)")


def _cgroup(config: Config) -> Finding:
    root = os.path.join(config.sys_root, "fs/cgroup")
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        return Finding("host", "cgroup", OK, "cgroup v2: device access comes from eBPF programs; with Docker use ponytail-runtime, which writes the rules into config.json")
    if os.path.isdir(os.path.join(root, "devices")):
        return Finding("host", "cgroup", OK, "cgroup v1: the hook allows each injected node in the container's devices cgroup")
    return Finding("host", "cgroup", WARN, f"no cgroup hierarchy under {root}: mount cgroup2 on /sys/fs/cgroup, or check [host] sys_root")


# -- the engines ----------------------------------------------------------------------

def check_engines(root: str = "/", config: Config | None = None) -> list[Finding]:
    """Each installed engine, and whether it will run ponytail. ``root`` prefixes every
    configuration path (a test's fake /etc); programs are looked up on PATH."""
    out = []
    if _installed("dockerd", root, "/etc/docker"):
        out.append(_docker(root))
    if _installed("containerd", root, "/etc/containerd"):
        out.append(_containerd(root))
    for program, engine, config_dir, configs in (
        ("podman", "podman", "/etc/containers", ("/etc/containers/containers.conf",)),
        ("crio", "CRI-O", "/etc/crio", ("/etc/crio/crio.conf", "/etc/crio/crio.conf.d")),
    ):
        if _installed(program, root, config_dir):
            dirs, where = _hooks_dirs(root, configs)
            out.append(_hooksd_engine(engine, _hook_files(root, dirs), dirs, where))
    if not out:
        out.append(Finding("engine", "engines", WARN, "no docker, containerd, CRI-O or podman found: install one, or run ponytail as a hook of your runtime by hand"))
    out += _cdi_specs(root, config or Config())
    return out


def _installed(program: str, root: str, config_dir: str) -> bool:
    return (root == "/" and shutil.which(program) is not None) or os.path.isdir(_under(root, config_dir))


def _docker(root: str) -> Finding:
    path = _under(root, "/etc/docker/daemon.json")
    data = _read_json(path)
    runtimes = data.get("runtimes") if isinstance(data, dict) else None
    if isinstance(runtimes, dict):
        for name, entry in runtimes.items():
            runtime = entry.get("path", "") if isinstance(entry, dict) else ""
            if isinstance(runtime, str) and "ponytail" in os.path.basename(runtime):
                default = isinstance(data, dict) and data.get("default-runtime") == name
                how = "the default runtime" if default else f"used by 'docker run --runtime {name}'"
                return _program_finding("docker", runtime, root, f"runtime '{name}' in {path} ({how})")
    return Finding("engine", "docker", FAIL, f"{path} registers no ponytail-runtime: add {{\"runtimes\": {{\"ponytail\": {{\"path\": \"/usr/local/bin/ponytail-runtime\"}}}}}} and restart dockerd")


def _containerd(root: str) -> Finding:
    path = _under(root, "/etc/containerd/config.toml")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "BinaryName" and "ponytail" in value:
            return _program_finding("containerd", value.strip().strip("\"'"), root, f"BinaryName in {path}")
    return Finding("engine", "containerd", FAIL, f"{path} has no runtime whose BinaryName is ponytail-runtime: add one under [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes] and restart containerd")


def _hooksd_engine(engine: str, hooks: list[tuple[str, str | None]], dirs: tuple[str, ...], where: str) -> Finding:
    if not hooks:
        return Finding("engine", engine, FAIL, f"no ponytail.json in {' or '.join(dirs)} ({where}): run 'ponytail install-hook --dir {dirs[0]}'")
    path, command = hooks[0]
    if command is None:
        return Finding("engine", engine, FAIL, f"{path} is not a valid oci-hooks file: run 'ponytail install-hook' to rewrite it")
    if not (os.path.isfile(command) and os.access(command, os.X_OK)):
        return Finding("engine", engine, FAIL, f"{path} runs {command}, which does not exist ({engine} skips such a hook silently): run 'ponytail install-hook'")
    return Finding("engine", engine, OK, f"{path} runs {command}")


def _hooks_dirs(root: str, configs: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The hooks directories an engine reads: ``hooks_dir`` of its config files (the last
    one set wins, and replaces the defaults), else the defaults; and where that was read."""
    dirs: tuple[str, ...] = HOOKS_DIRS
    where = "the default hooks directories"
    for config in configs:
        path = _under(root, config)
        files = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".conf")] if os.path.isdir(path) else [path]
        for name in files:
            found = _hooks_dir_setting(name)
            if found:
                dirs, where = found, f"hooks_dir in {name}"
    return dirs, where


def _hooks_dir_setting(path: str) -> tuple[str, ...] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    for number, line in enumerate(lines):
        key, sep, value = line.partition("=")
        if sep and key.strip() == "hooks_dir":
            text = value.split("#", 1)[0]
            for more in lines[number + 1 :]:  # an array over several lines
                if "]" in text:
                    break
                text += more.split("#", 1)[0]
            items = (v.strip().strip("\"'") for v in text.strip().strip("[]").split(","))
            return tuple(i for i in items if i.startswith("/")) or None
    return None


def _hook_files(root: str, dirs: tuple[str, ...]) -> list[tuple[str, str | None]]:
    found = []
    for directory in dirs:
        path = _under(root, f"{directory.rstrip('/')}/ponytail.json")
        if os.path.exists(path):
            data = _read_json(path)
            hook = data.get("hook") if isinstance(data, dict) else None
            command = hook.get("path") if isinstance(hook, dict) else None
            found.append((path, command if isinstance(command, str) else None))
    return found


def _program_finding(engine: str, program: str, root: str, where: str) -> Finding:
    located = program if program.startswith("/") else shutil.which(program)
    if located is None or not os.access(located, os.X_OK):
        return Finding("engine", engine, FAIL, f"{where} names {program}, which is not an executable: install ponytail or fix the path")
    return Finding("engine", engine, OK, f"{where} runs {located}")


def _cdi_specs(root: str, config: Config) -> list[Finding]:
    """Each NVIDIA GPU spec in the engines' CDI directories (ponytail's or another
    generator's), checked against the running driver and GPUs with the same test as
    ``ponytail cdi check``: a driver upgrade leaves a spec naming libraries that are gone."""
    from ponytail.engines.cdi.files import read_spec, stale
    from ponytail.errors import PonytailError

    out = []
    for directory in CDI_DIRS:
        base = _under(root, directory)
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".json", ".yaml", ".yml")):
                continue
            path = os.path.join(base, name)
            regenerate = f"regenerate it: ponytail cdi generate --output {path}"
            try:
                spec = read_spec(path)
            except PonytailError as e:
                if "nvidia.com/" in _head(path) or "ponytail" in name:
                    out.append(Finding("engine", "CDI", FAIL, f"{e.message}: the engines refuse it; {regenerate}"))
                continue
            if not str(spec.get("kind", "")).startswith("nvidia.com/"):
                continue  # another vendor's devices: not ours to judge
            try:
                found = stale(spec, config)
            except PonytailError as e:  # no driver loaded: check_host says so already
                found = [e.message]
            if found:
                more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
                out.append(Finding("engine", "CDI", FAIL, f"{path} is stale: {found[0]}{more}: {regenerate}"))
            else:
                out.append(Finding("engine", "CDI", OK, f"{path} is true for the running driver and GPUs"))
    return out


def _head(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(4096)
    except OSError:
        return ""


def _under(root: str, path: str) -> str:
    return path if root == "/" else root.rstrip("/") + path


def _read_json(path: str) -> object:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None


# -- one container --------------------------------------------------------------------

def check_container(config: Config, bundle: str | None, rootfs: str | None) -> list[Finding]:
    """Which libcuda.so.1 and libnvidia-ml.so.1 the container's loader will pick once
    ponytail has injected the driver, and whether their versions match the kernel module."""
    from ponytail.cli.loaderview import loader_view
    from ponytail.errors import PonytailError

    env: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if bundle is not None:
        from ponytail.container.oci import State, load_container

        try:
            container = load_container(State("check", 1, os.path.abspath(bundle), "created", {}))
        except PonytailError as e:
            return [Finding("container", "bundle", FAIL, e.message)]
        env, annotations = container.env, container.annotations
        rootfs = rootfs or container.rootfs
    assert rootfs is not None
    if not os.path.isdir(rootfs):
        return [Finding("container", "rootfs", FAIL, f"{rootfs} is not a directory: pass the container's rootfs")]
    try:
        return loader_view(config, rootfs, env, annotations)
    except PonytailError as e:
        return [Finding("container", "driver", FAIL, e.message)]
