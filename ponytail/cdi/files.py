"""CDI specs from this host's plans, written, read, listed and checked.

The spec is what ``ponytail.plan.operations.build_plan`` plans for this host, once for no GPU (the
shared edits) and once per device (its own nodes): the same probe, capabilities, library
search and driver root as a hook run, never a second discovery path.
"""

from __future__ import annotations

import os
import stat

from ponytail.capabilities import CAPABILITIES, FEATURES, IMEX_FEATURE, FeatureAsk
from ponytail.config import Config
from ponytail.container.request import build_request
from ponytail.errors import InputError, ProbeError, UsageError, one_line, os_failure
from ponytail.fs.atomic import replace_file
from ponytail.host.driver import NODE_MODULES, node_drift, nvidia_major, read_char_majors, read_driver_version
from ponytail.host.driver_search import find_driver_library, find_ldconfig
from ponytail.host.features import FeatureFinding
from ponytail.host.mig import mig_uuids
from ponytail.host.probe import Gpu, Host, probe_gpus, probe_host
from ponytail.lite.plainjson import dumps, loads
from ponytail.lite.records import replace
from ponytail.plan.cdi import VERSIONS, build_feature_spec, build_spec, problems
from ponytail.plan.operations import build_plan, feature_mounts
from ponytail.plan.select import Selection, find_device

STRATEGIES = ("index", "uuid", "both")
# `cdi generate` and `cdi list` name GPUs alike: by index (podman --device nvidia.com/gpu=0), by UUID
# (Docker's --gpus device=GPU-..., the device plugin) and 'all'
DEFAULT_STRATEGY = "both"
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
DEFAULT_NAME = "nvidia"


def generate(
    config: Config, hook_command: str, strategy: str = DEFAULT_STRATEGY, capabilities: str = "all", version: str | None = None
) -> tuple[dict, list[str], dict[str, dict]]:
    """This host's spec, the plan's warnings, and the specs of the opt-in features it has (feature_specs)."""
    if strategy not in STRATEGIES:
        raise UsageError(f"--device-name-strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    request = build_request(cli_device="all", cli_capabilities=capabilities)
    host = probe_host(config, request.capabilities, features=tuple(FeatureAsk(name, "all", f"CDI {name}") for name in FEATURES))
    features, host = host.features, replace(host, features=())
    ldconfig = find_ldconfig(config.ldconfig)
    ldconfig = os.path.abspath(ldconfig) if ldconfig else None
    if not host.gpus:
        raise ProbeError(f"driver {host.driver_version} offers no GPU on this host: a CDI spec needs at least one device")
    shared = build_plan(host, request, Selection(), {}, ldconfig)
    if shared.problems:
        raise ProbeError(shared.problems[0])
    migs = [m for g in host.gpus for m in g.mig_devices]
    mig_uuid = _mig_uuids(config, host) if migs and strategy != "index" else {}
    devices = []
    for gpu in host.gpus:
        devices += [(name, Selection((gpu,))) for name in _names(strategy, str(gpu.index), gpu.uuid)]
    for mig in migs:
        devices += [(name, Selection((), (mig,))) for name in _names(strategy, mig.name, mig_uuid.get(mig.name))]
    devices.append(("all", Selection(host.gpus, tuple(migs))))
    planned = []
    # a device's entry is the nodes its plan adds to the shared ones: only its nodes are planned (nodes_only:
    # no libraries, files, masked /proc or linker cache, which are the shared plan's; an 18-GPU spec plans
    # 37 devices), without the capabilities that bring no node of a GPU's own (theirs are shared anyway) but
    # with those that do (graphics, display: its /dev/dri nodes)
    own_nodes = replace(request, capabilities=tuple(c for c in request.capabilities if CAPABILITIES[c].dri_nodes))
    for name, selection in devices:
        plan = build_plan(host, own_nodes, selection, {}, ldconfig, nodes_only=True)
        if plan.problems:
            raise ProbeError(f"device {name}: {plan.problems[0]}")
        planned.append((name, plan))
    # absolute: the hook runs with the rootfs as its working directory (runc), where a relative path is the image's
    config_option = ["-config", os.path.abspath(config.path)] if config.path else []
    options = config_option + ["--driver-version", host.driver_version] + node_arguments(config, host)
    spec = build_spec(shared, planned, hook_command, options, config_option)
    if version is not None:
        if version not in VERSIONS:
            raise UsageError(f"--spec-version {version}: not a released CDI version ({', '.join(VERSIONS)})")
        if VERSIONS.index(version) < VERSIONS.index(spec["cdiVersion"]):
            raise UsageError(f"--spec-version {version}: this spec needs at least {spec['cdiVersion']}")
        spec["cdiVersion"] = version
    found = problems(spec)
    if found:  # a bug: never write a spec the engines would refuse
        raise ProbeError(f"the generated spec is not valid CDI: {found[0]}")
    return spec, list(shared.warnings), feature_specs(features)


def feature_specs(features: tuple[FeatureFinding, ...]) -> dict[str, dict]:
    """A spec per opt-in feature this host has, by feature name: ``nvidia.com/imex-channel=N``
    (and ``=all``), ``nvidia.com/gds=all``, ``nvidia.com/mofed=all``... A feature whose module
    or nodes are missing is not offered."""
    specs = {}
    for feature in features:
        if feature.problems or not feature.nodes:
            continue
        ops = feature_mounts(feature)
        devices = [(str(op.rdev[1]), [op]) for op in ops if op.rdev is not None] if feature.name == IMEX_FEATURE else []
        spec = build_feature_spec(f"nvidia.com/{feature.name}", devices + [("all", ops)])
        found = problems(spec)
        if found:  # a bug: never write a spec the engines would refuse
            raise ProbeError(f"the generated spec of nvidia.com/{feature.name} is not valid CDI: {found[0]}")
        specs[feature.name] = spec
    return specs


def feature_spec_path(output: str, feature: str) -> str:
    """Where the spec of ``feature`` goes beside the GPUs' spec ``output``: nvidia.yaml -> nvidia-gds.yaml."""
    stem, ext = os.path.splitext(output)
    return f"{stem}-{feature}{ext}"


def node_arguments(config: Config, host: Host) -> list[str]:
    """What the spec's device nodes depend on, for the hook to check cheaply at each start
    (ponytail.host.driver.node_drift): each GPU's minor, bus id and UUID, the modules' majors."""
    majors = read_char_majors(config.proc_root)
    args = []
    for name in NODE_MODULES:
        if name in majors:
            args += ["--major", name, str(majors[name])]
    for gpu in host.gpus:
        args += ["--gpu", str(gpu.minor), gpu.pci_bus_id, gpu.uuid]
    return args


def _names(strategy: str, index_name: str, uuid: str | None) -> list[str]:
    names = [index_name] if strategy in ("index", "both") or uuid is None else []
    if strategy in ("uuid", "both") and uuid is not None:
        names.append(uuid)
    return names


def _mig_uuids(config: Config, host: Host) -> dict[str, str]:
    """MIG device name (GPU:GI:CI) -> MIG UUID, asked of NVML (the driver's own libnvidia-ml)."""
    by_minor = {g.minor: g.index for g in host.gpus}
    nvml = find_driver_library(config, host.driver_version, "libnvidia-ml", "libnvidia-ml.so.1", host)
    return {f"{by_minor[minor]}:{gi}:{ci}": uuid for uuid, (minor, gi, ci) in mig_uuids(nvml).items() if minor in by_minor}


def render(spec: dict, form: str) -> bytes:
    """The spec as JSON or YAML text; the same spec always gives the same bytes."""
    if form == "json":
        return (dumps(spec, indent=2) + "\n").encode()
    import yaml  # here, not at the top: a JSON spec is written without it (its import is most of cdi generate's run)

    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=False, width=4096).encode()


def form_of(path: str | None, form: str | None) -> str:
    if form is not None:
        return form
    return "json" if path is not None and path.endswith(".json") else "yaml"


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` by a new file (0644) with ``data``: a reader sees the old spec or the new one."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        replace_file(path, data, 0o644)
    except OSError as e:
        raise os_failure(f"cannot write {path}", e, UsageError) from e


def read_spec(path: str) -> dict:
    """A spec file (.json, or else YAML), checked against the CDI specification."""
    try:
        with open(path, "rb") as f:
            raw = f.read(16 << 20)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from e
    try:
        if path.endswith(".json"):
            spec = loads(raw)
        else:
            import yaml  # here: as in render

            try:
                spec = yaml.safe_load(raw)
            except yaml.YAMLError as e:
                raise _not_a_spec(path, e) from e
    except (ValueError, RecursionError) as e:  # bad JSON, bad UTF-8, a bad YAML value (a date, a float), nesting too deep
        raise _not_a_spec(path, e) from e
    found = problems(spec)
    if found or not isinstance(spec, dict):  # problems() finds a spec that is not an object
        raise InputError(f"{path} is not a valid CDI spec: {found[0] if found else 'not an object'}")
    return spec


def _not_a_spec(path: str, e: Exception) -> InputError:
    return InputError(f"{path} is not a CDI spec: {type(e).__name__}: {one_line(str(e))}")


def default_spec_path() -> str:
    """The first nvidia.yaml / nvidia.json in the engines' spec directories."""
    for directory in SPEC_DIRS:
        for ext in (".yaml", ".json"):
            path = os.path.join(directory, DEFAULT_NAME + ext)
            if os.path.exists(path):
                return path
    raise UsageError(f"no spec found ({', '.join(f'{d}/{DEFAULT_NAME}.yaml' for d in SPEC_DIRS)}); name one, or run 'ponytail cdi generate --output {SPEC_DIRS[0]}/{DEFAULT_NAME}.yaml'")


def qualified_names(spec: dict) -> list[str]:
    return [f"{spec['kind']}={d['name']}" for d in spec["devices"]]


def stale(spec: dict, config: Config) -> list[str]:
    """Why ``spec`` is no longer true for this host (empty: it still is): host paths gone, a
    device node changed, the driver version changed, GPUs gone or added."""
    found = []
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec["devices"]]
    for e in edits:
        for mount in e.get("mounts") or []:
            if not os.path.lexists(mount["hostPath"]):
                found.append(f"{mount['hostPath']} (mounted at {mount['containerPath']}) no longer exists")
        for node in e.get("deviceNodes") or []:
            found += _node_problems(node)
        for hook in e.get("hooks") or []:
            if not os.access(hook["path"], os.X_OK):
                found.append(f"the hook {hook['path']} is not an executable file")
    running = read_driver_version(config.proc_root)
    for e in edits:
        for hook in e.get("hooks") or []:
            args = hook.get("args") or []
            marker = next((m for m in ("--driver-version", "--host-driver-version") if m in args[:-1]), None)  # ponytail's, NVIDIA's
            if marker is not None:
                made_for = args[args.index(marker) + 1]
                if made_for != running:
                    found.append(f"the spec was made for driver {made_for}; the running driver is {running}")
    recorded: tuple[list[tuple[int, str, str]], dict[str, int]] = ([], {})
    ours = False
    for e in edits:
        for hook in e.get("hooks") or []:
            ours = ours or (hook.get("args") or [])[1:2] == ["cdi-hook"]
            recorded = _recorded(hook.get("args") or [], recorded)
    if ours and not recorded[0]:
        found.append("its hook records no GPU minors or majors (an older ponytail wrote it), so it cannot refuse renumbered GPUs")
    found += node_drift(config.proc_root, *recorded)
    try:
        gpus = probe_gpus(config, udev=False).gpus
    except ProbeError as e:
        return list(dict.fromkeys(found + [e.message]))
    found += _device_drift(spec, gpus, recorded[1] or read_char_majors(config.proc_root))
    named = {d["name"]: find_device(gpus, d["name"]) for d in spec["devices"]}  # by the hook's grammar (plan/select.py)
    for name in sorted(n for n, device in named.items() if device is None and n != "all" and not n.upper().startswith("MIG-")):
        found.append(f"device {name} is not on this host any more")
    for gpu in gpus:
        if gpu not in named.values():
            found.append(f"GPU {gpu.index} ({gpu.uuid}) is not in the spec")
    return list(dict.fromkeys(found))


def _recorded(args: list, before: tuple[list[tuple[int, str, str]], dict[str, int]]) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """The GPUs and majors a ponytail cdi-hook's arguments record (``before`` for another hook)."""
    # here, not at the top: hooks.cdi loads the hook's own modules (logfile...), which cdi generate never needs
    from ponytail.hooks.cdi import parse_args, recorded_nodes

    if args[1:2] != ["cdi-hook"] or not all(isinstance(a, str) for a in args):
        return before
    try:
        options = parse_args(args[2:])
    except UsageError:
        return before
    recorded = recorded_nodes(options) if options else before
    return recorded if recorded[0] or recorded[1] else before  # a device's own hook (its links) records none


def _device_drift(spec: dict, gpus: tuple, majors: dict[str, int]) -> list[str]:
    """Each device's GPU node is the minor its GPU (by index or UUID) has now."""
    gpu_major = nvidia_major(majors)
    found = []
    for device in spec["devices"]:
        gpu = find_device(gpus, device["name"])  # the hook's grammar for names (plan/select.py)
        if not isinstance(gpu, Gpu):
            continue
        for node in (device.get("containerEdits") or {}).get("deviceNodes") or []:
            numbers = runtime_numbers(node)
            if numbers is None:
                continue  # its node is gone: _node_problems says so
            major, minor = numbers
            if major == gpu_major and minor < 254 and minor != gpu.minor:
                found.append(f"device {device['name']} ({gpu.pci_bus_id}) has node {node['path']} c {gpu_major}:{minor}, "
                             f"but the GPU's minor is {gpu.minor} now")
    return found


def runtime_numbers(node: dict) -> tuple[int, int] | None:
    """The major and minor the CDI runtime gives ``node``, as its fillMissingInfo does: the spec's
    own when it names a major (a missing minor is 0: Go's omitempty leaves out 'minor: 0'), else
    the numbers of the node at hostPath (or path) on this host; None when that node is not there.
    nvidia-ctk writes nodes without numbers, and without 'minor: 0'."""
    if node.get("major"):
        return int(node["major"]), int(node.get("minor") or 0)
    try:
        st = os.stat(node.get("hostPath") or node["path"])
    except OSError:
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def _node_problems(node: dict) -> list[str]:
    path = node.get("hostPath") or node["path"]
    try:
        st = os.stat(path)
    except OSError:
        return [f"device node {path} no longer exists"]
    if node.get("major") and (not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != runtime_numbers(node)):
        return [f"device node {path} is no longer c {node['major']}:{node.get('minor') or 0}"]
    return []
