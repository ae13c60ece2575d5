"""OCI state (stdin) + the bundle's config.json -> Container. Bounded, validated, one-line errors."""

from __future__ import annotations

import os
import stat

from ponytail.errors import InputError
from ponytail.lite.records import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported on the hook's path: for type checkers only
    from typing import BinaryIO

    from ponytail.capabilities import FeatureAsk
    from ponytail.config import Config

MAX_STATE_BYTES = 4 << 20
MAX_BUNDLE_CONFIG_BYTES = 4 << 20


@record(frozen=True)
class Container:
    """The container a hook run serves, read from the OCI state on stdin and the bundle's
    config.json (load_container): where its rootfs is and whose mount namespace it is in (pid),
    what it asks for (env, annotations, the device plugin's list and features), and how much it
    is trusted (privileged). Nothing in it comes from the image's files: the bundle is the
    engine's."""

    id: str
    pid: int
    bundle: str
    rootfs: str  # absolute path, as the runtime sees it in the container's mount namespace
    status: str
    env: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cgroups_path: str | None = None
    privileged: bool = False  # CAP_SYS_ADMIN in the process's bounding set
    plugin_devices: tuple[str, str] | None = None  # (selector, source): the device plugin's list, ponytail.container.deviceplugin
    char_devices: tuple[tuple[int, int], ...] = ()  # major:minor of linux.devices' character devices
    plugin_features: tuple[FeatureAsk, ...] = ()  # opt-in features the device plugin hands over
    handover_refused: str | None = None  # which cdi.k8s.io/* annotations were not believed to be the kubelet's, and why


@record(frozen=True)
class State:
    """The OCI state the engine writes on the hook's stdin."""

    id: str
    pid: int
    bundle: str
    status: str
    annotations: dict[str, str]


def read_bounded(stream: BinaryIO, limit: int, what: str) -> bytes:
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{what} is larger than {limit} bytes; refusing to parse it")
    return data


def parse_json_object(raw: bytes, what: str) -> dict:
    """``json.loads(raw)``, which must be an object, and no lone surrogate in it. Plain JSON (what
    engines write) is read by ``loads_plain`` without importing ``json``; anything else by json."""
    if not raw.strip():
        raise InputError(f"{what} is empty")
    from ponytail.lite.plainjson import loads_plain

    value = loads_plain(raw)
    if isinstance(value, dict):
        return value  # valid UTF-8 and no \uD8xx escape: no lone surrogate
    import json  # anything but plain JSON, and every error's wording

    try:
        value = json.loads(raw)
    except RecursionError:
        raise InputError(f"{what} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{what} is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise InputError(f"{what} must be a JSON object, not {type(value).__name__}")
    try:  # a lone surrogate (\ud800) is valid JSON but no text: it cannot be a path or be printed
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what} contains a string that is not valid Unicode (a lone \\uD8xx escape)") from None
    return value


def parse_state(raw_state: bytes, lowest_pid: int = 1) -> State:
    """The OCI state alone, validated; the bundle is not read yet. (crun sends pid 0 to
    createContainer hooks: ``lowest_pid=0`` accepts it.)"""
    state = parse_json_object(raw_state, "OCI state on stdin")
    container_id = _field(state, "id", "OCI state")
    pid = state.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < lowest_pid:
        raise InputError(f"OCI state for container {container_id}: 'pid' must be a positive integer, got {pid!r}")
    bundle = _field(state, "bundle", "OCI state")
    status = state.get("status", "")
    if not isinstance(status, str):
        raise InputError(f"OCI state for container {container_id}: 'status' must be a string")
    if status == "stopped":
        raise InputError(f"container {container_id} is already stopped; nothing to inject")
    if not os.path.isabs(bundle) or "\0" in bundle:
        raise InputError(f"OCI state for container {container_id}: bundle {bundle!r} is not an absolute path")
    annotations = _string_map(state.get("annotations"), f"OCI state for container {container_id}: 'annotations'")
    return State(container_id, pid, bundle, status, annotations)


def load_container(state: State, raw: dict | None = None, config: Config | None = None) -> Container:
    """The container ``state`` names: its bundle's config.json (``raw`` when read already) validated;
    the device plugin's hand-over read as ``config`` says (default: the built-in config)."""
    bundle = state.bundle
    raw = read_bundle_config(bundle) if raw is None else raw
    root = _section(raw, "root", f"{bundle}/config.json", required=True)
    root_path = root.get("path")
    if not isinstance(root_path, str) or not root_path or "\0" in root_path:
        raise InputError(f"{bundle}/config.json: 'root.path' is missing or not a string")
    annotations = {**_string_map(raw.get("annotations"), f"{bundle}/config.json: 'annotations'"), **state.annotations}
    spec = read_spec(raw, f"{bundle}/config.json", config, annotations)
    from ponytail.container.deviceplugin import plugin_features

    return Container(
        id=state.id,
        pid=state.pid,
        bundle=bundle,
        rootfs=os.path.normpath(os.path.join(bundle, root_path)),
        status=state.status,
        env=spec.env,
        annotations=annotations,
        cgroups_path=spec.cgroups_path,
        privileged=spec.privileged,
        plugin_devices=device_plugin_list(spec),
        char_devices=spec.char_devices,
        plugin_features=plugin_features(spec.mounts, spec.handover),
        handover_refused=spec.handover_refused,
    )


@record(frozen=True)
class Spec:
    """What ponytail reads of a bundle's config.json (the OCI runtime spec), validated: the
    hook's container and ponytail-runtime's bundle edit both read it here."""

    env: dict[str, str]
    annotations: dict[str, str]
    privileged: bool  # CAP_SYS_ADMIN in the process's bounding set
    mounts: object  # 'mounts' as found: ponytail.container.deviceplugin reads the device plugin's list from it
    cgroups_path: str | None
    char_devices: tuple[tuple[int, int], ...]  # major:minor of linux.devices' character devices
    gpu_cdi_hook: bool = False  # a createContainer hook of a GPU CDI spec (ponytail's cdi-hook, NVIDIA's): CDI was applied
    # the cdi.k8s.io/* annotations believed to be the kubelet's (ponytail.container.deviceplugin.handover_annotations)
    handover: dict[str, str] = field(default_factory=dict)
    handover_refused: str | None = None  # which were not, and why

    @property
    def plugin_devices(self) -> tuple[str, str] | None:
        """The device plugin's list, as Container.plugin_devices."""
        return device_plugin_list(self)

    @property
    def plugin_features(self) -> tuple[FeatureAsk, ...]:
        """The features the device plugin hands over, as Container.plugin_features."""
        from ponytail.container.deviceplugin import plugin_features

        return plugin_features(self.mounts, self.handover)


def read_spec(spec: dict, where: str, config: Config | None = None, annotations: dict[str, str] | None = None) -> Spec:
    """``spec`` (a parsed config.json, named ``where`` in errors) read into a Spec; the root is
    left to the caller. Malformed sections are one-line InputErrors. Which of its ``cdi.k8s.io/*``
    annotations (``annotations``: these instead of the spec's) are the device plugin's hand-over is
    decided by ``config``'s ``[request]`` keys (default: the built-in config)."""
    from ponytail.container.deviceplugin import accepts_env, handover_annotations

    process = _section(spec, "process", where)
    env = parse_env(process.get("env"), f"{where}: 'process.env'")
    capabilities = process.get("capabilities")
    if not isinstance(capabilities, dict):
        capabilities = {}
    bounding = capabilities.get("bounding")
    if annotations is None:
        annotations = _string_map(spec.get("annotations"), f"{where}: 'annotations'")
    linux = _section(spec, "linux", where)
    cgroups_path = linux.get("cgroupsPath")
    privileged = isinstance(bounding, list) and "CAP_SYS_ADMIN" in bounding
    if config is None:
        from ponytail.config import Config

        config = Config()
    handover, refused = handover_annotations(annotations, config.cri, privileged or accepts_env(config, annotations))
    return Spec(
        env=env,
        annotations=annotations,
        privileged=privileged,
        mounts=spec.get("mounts"),
        cgroups_path=cgroups_path if isinstance(cgroups_path, str) else None,
        char_devices=_char_devices(linux.get("devices"), f"{where}: 'linux.devices'"),
        gpu_cdi_hook=_gpu_cdi_hook(spec.get("hooks")),
        handover=handover,
        handover_refused=refused,
    )


def device_plugin_list(spec: Spec) -> tuple[str, str] | None:
    """The device plugin's list in ``spec`` (ponytail.container.deviceplugin), from its volume mounts
    and the CDI annotations believed to be the kubelet's (Spec.handover); whether the engine's CDI
    has injected the GPUs already is told by a GPU CDI spec's hook, or, in an unprivileged container
    (which gets only the devices it was given), by NVIDIA nodes in linux.devices."""
    from ponytail.capabilities import NVIDIA_MAJOR
    from ponytail.container.deviceplugin import plugin_devices

    injected = spec.gpu_cdi_hook or (not spec.privileged and any(major == NVIDIA_MAJOR for major, _ in spec.char_devices))
    return plugin_devices(spec.mounts, spec.handover, injected)


GPU_CDI_HOOKS = ("nvidia-cdi-hook", "nvidia-ctk")  # NVIDIA's specs' hook programs; ponytail's runs `ponytail cdi-hook`


def _gpu_cdi_hook(hooks: object) -> bool:
    stage = hooks.get("createContainer") if isinstance(hooks, dict) else None
    for hook in stage if isinstance(stage, list) else []:
        if not isinstance(hook, dict):
            continue
        path, args = hook.get("path"), hook.get("args")
        if isinstance(path, str) and os.path.basename(path) in GPU_CDI_HOOKS:
            return True
        if isinstance(args, list) and len(args) > 1 and args[1] == "cdi-hook":
            return True
    return False


def read_bundle_config(bundle: str) -> dict:
    path = os.path.join(bundle, "config.json")
    try:  # O_NONBLOCK: a FIFO planted as config.json must not hang the container start
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputError(f"{path} is not a regular file")
            raw = read_bounded(f, MAX_BUNDLE_CONFIG_BYTES, path)
    except FileNotFoundError:
        what = "bundle directory" if not os.path.isdir(bundle) else "config.json"
        raise InputError(f"{path} not found (missing {what}); is the OCI state's 'bundle' right?") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from e
    return parse_json_object(raw, path)


def parse_env(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InputError(f"{what} must be a list of KEY=VALUE strings")
    env: dict[str, str] = {}
    for item in value:
        if not isinstance(item, str):
            raise InputError(f"{what} must be a list of KEY=VALUE strings, found {type(item).__name__}")
        key, sep, val = item.partition("=")
        if sep:
            env[key] = val
    return env


def _char_devices(value: object, what: str) -> tuple[tuple[int, int], ...]:
    """(major, minor) of each character device the engine creates in the container."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(d, dict) for d in value):
        raise InputError(f"{what} must be a list of objects")
    found = []
    for d in value:
        major, minor = d.get("major"), d.get("minor")
        if d.get("type") == "c" and type(major) is int and type(minor) is int:
            found.append((major, minor))
    return tuple(found)


def _section(spec: dict, key: str, where: str, required: bool = False) -> dict:
    value = spec.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where}: '{key}' must be an object")
    return value


def _field(obj: dict, key: str, what: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise InputError(f"{what}: '{key}' is missing or not a str")
    return value


def _string_map(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InputError(f"{what} must be an object of strings")
    return dict(value)
