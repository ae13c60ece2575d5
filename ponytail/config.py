"""config.toml -> a typed, validated Config. Errors name the file and the key."""

from __future__ import annotations

import os

from ponytail.errors import ConfigError
from ponytail.lite.plaintoml import loads_plain
from ponytail.lite.records import field, record

DEFAULT_CONFIG_PATH = "/etc/ponytail/config.toml"
CONFIG_ENV_VAR = "PONYTAIL_CONFIG"

MAX_CONFIG_BYTES = 1 << 20


@record(frozen=True)
class Config:
    """Everything ponytail reads from config.toml, with the built-in defaults."""

    path: str | None = None
    driver_root: str = "/"
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    dev_root: str = "/dev"
    ipc_root: str = "/"
    mps_pipe_directory: str = "/tmp/nvidia-mps"  # noqa: S108 - the host's MPS daemon's CUDA_MPS_PIPE_DIRECTORY, under ipc_root
    ldconfig: str = ""  # empty: the host's /sbin/ldconfig or /usr/sbin/ldconfig
    library_paths: tuple[str, ...] = ()  # the user's own library globs, added to the capabilities' libraries
    log_file: str = "/var/log/ponytail.log"
    # extra library names and binaries per driver capability: {"compute": {"libraries": (...), "binaries": (...)}}
    capability_extras: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict, compare=False)
    runtime_path: str = "runc"  # ponytail-runtime execs this (a name on PATH, or an absolute path)
    # false: an unprivileged container's NVIDIA_VISIBLE_DEVICES selects nothing; only the device plugin's list does
    accept_env_when_unprivileged: bool = True
    # Kubernetes namespaces whose pods' NVIDIA_VISIBLE_DEVICES is believed all the same (management pods), and
    # the CRI implementation whose namespace annotation is read (ponytail.container.deviceplugin)
    env_namespaces: tuple[str, ...] = ()
    cri: str = ""
    # Docker Swarm's generic-resource variables read as a GPU request (DOCKER_RESOURCE_GPU); none: off
    swarm_resource: tuple[str, ...] = ()
    # true: a privileged container's GPU nodes that were not allotted are hidden inside it (ponytail.plan.operations.HideNode)
    isolate_privileged: bool = False
    # deadlines, in seconds: a forked probe (libcuda's cuDriverGetVersion, NVML), the host's
    # ldconfig, and the wait for another run into the same rootfs (ponytail.apply.rootlock)
    timeout_probe: float = 5.0
    timeout_ldconfig: float = 10.0
    timeout_lock: float = 10.0
    # [drivers.NAME]: user-mode driver trees a container may select by name (ponytail.host.driver_trees; which one a container asks for: ponytail.container.driver_trees)
    drivers: dict[str, DriverTree] = field(default_factory=dict, compare=False)
    cuda_compat: bool = True  # [cuda] compat: honour an image's /usr/local/cuda/compat (ponytail.plan.compat)
    cache_dir: str = "/run/ponytail"  # [cache] dir: the probe cache (ponytail.host.probecache); "" turns it off
    # [cgroup] extend_denying_programs: also extend a cgroup v2 device program that denies an injected node on
    # purpose (it allows devices it does not name: another tool's deny list); false: such a program wins
    extend_denying_programs: bool = False
    # [guard]: where the hooks record each GPU container they start (""; under [cache] dir), whether
    # `ponytail guard` gives back lost device access, its safety interval and its metrics file
    guard_records: str = ""
    guard_repair: bool = True
    guard_interval: float = 60.0
    guard_textfile: str = ""
    # [cdi] unknown_nvidia_hooks: a hook subcommand of NVIDIA's that ponytail does not serve (a spec written by a
    # newer toolkit): "warn" (logged, the start goes on, as NVIDIA's own binary does) or "fail" (the start stops)
    unknown_nvidia_hooks: str = "warn"

    @property
    def records_dir(self) -> str:
        """The directory of the containers' records ("": none are kept)."""
        if self.guard_records:
            return self.guard_records
        return self.cache_dir.rstrip("/") + "/containers" if self.cache_dir else ""


@record(frozen=True)
class DriverTree:
    """A registered user-mode driver build: ``root`` is searched like the host's driver root."""

    name: str
    root: str
    description: str = ""
    kernel_modules: tuple[str, ...] = ()  # kernel-module versions it may run against besides its own; "*": any


# table -> key -> (Config field, expected type, what it means): the one description of each key,
# which docs/configuration.md is generated from (scripts/gendocs.py)
_SCHEMA: dict[str, dict[str, tuple[str, type, str]]] = {
    "host": {
        "driver_root": ("driver_root", str, "Where the driver's libraries, binaries and firmware are: `/` for a driver "
                        "installed on the host, `/run/nvidia/driver` under the GPU operator's driver container."),
        "proc_root": ("proc_root", str, "The host's `/proc` (relocatable for tests and unusual hosts)."),
        "sys_root": ("sys_root", str, "The host's `/sys` (relocatable for tests and unusual hosts)."),
        "dev_root": ("dev_root", str, "The host's `/dev`, where the GPU device nodes are (relocatable for tests and unusual hosts)."),
        "ipc_root": ("ipc_root", str, "Where the driver daemons keep their sockets (nvidia-persistenced, "
                     "nvidia-fabricmanager, the MPS pipe directory)."),
        "mps_pipe_directory": ("mps_pipe_directory", str, "The MPS pipe directory of the host's MPS daemon (the "
                               "`CUDA_MPS_PIPE_DIRECTORY` it was started with), under `ipc_root`; mounted at the same path with "
                               "`compute`. A host setting: a container's own `CUDA_MPS_PIPE_DIRECTORY` is never taken as a host path."),
        "ldconfig": ("ldconfig", str, "The host's ldconfig, run against the container's rootfs (never the image's own). "
                     "Empty: the first of `/sbin/ldconfig`, `/usr/sbin/ldconfig`."),
    },
    "library": {
        "paths": ("library_paths", list, "Your own library globs under the driver root, injected besides the requested "
                  "capabilities' libraries; the driver root's `etc/ld.so.cache` is searched for the same names. Only "
                  "files of the running driver's version are injected."),
    },
    "log": {"file": ("log_file", str, "The run log: every run appends what it injected, or its error. The file is created if "
                     "missing, its directory never: a run whose log directory does not exist says so once on stderr and logs nothing.")},
    "runtime": {
        "path": ("runtime_path", str, "The real runtime `ponytail-runtime` (the Docker shim) execs: a name on `PATH` "
                 "or an absolute path."),
    },
    "request": {
        "accept_env_when_unprivileged": (
            "accept_env_when_unprivileged", bool,
            "Whether an unprivileged container's own `NVIDIA_VISIBLE_DEVICES` may select GPUs. `false` on a cluster: "
            "GPUs only from the device plugin's list (volume mounts or CDI annotations). Privileged containers are "
            "always believed.",
        ),
        "env_namespaces": (
            "env_namespaces", list,
            "Kubernetes namespaces whose pods' `NVIDIA_VISIBLE_DEVICES` is believed even when "
            "`accept_env_when_unprivileged = false`: the management pods that need GPUs without asking the scheduler "
            "(the device plugin itself, dcgm-exporter, GPU feature discovery), e.g. `[\"gpu-operator\"]`. Needs `cri`. "
            "Only someone allowed to create pods in these namespaces gets the GPUs this way.",
        ),
        "swarm_resource": (
            "swarm_resource", list,
            "The Docker Swarm generic-resource variables read as a GPU request, e.g. `[\"DOCKER_RESOURCE_GPU\"]` (Swarm "
            "sets `DOCKER_RESOURCE_<KIND>` from the node's `node-generic-resources`); empty: none is read (an image's "
            "`DOCKER_RESOURCE_*` is ignored). They never widen `NVIDIA_VISIBLE_DEVICES`: they replace it only when it is "
            "unset or `all`, and two lists neither of which holds the other stop the start.",
        ),
        "isolate_privileged": (
            "isolate_privileged", bool,
            "`true`: a privileged container that asks for some GPUs gets only those: the engine gives it every host "
            "device, so the other GPUs' `/dev/nvidiaN` are made unusable inside it (each bound onto itself with `nodev` in "
            "the container's mount namespace: opening it fails with EACCES; the host's `/dev` is untouched), as "
            "`/proc/driver/nvidia/gpus` already shows only its GPUs. It can undo that (it may unmount): it keeps pods "
            "from using GPUs they were not allotted by mistake, it is not a security boundary.",
        ),
        "cri": (
            "cri", str,
            "The CRI implementation that starts this node's pods, `\"containerd\"` or `\"cri-o\"`: the pod's namespace "
            "for `env_namespaces` is read only from the annotation it writes over any a pod brings "
            "(`io.kubernetes.cri.sandbox-namespace`, `io.kubernetes.pod.namespace`), and the device plugin's "
            "`cdi.k8s.io/*` annotations only from where it puts the kubelet's container annotations (CRI-O: "
            "`io.kubernetes.cri-o.Annotations`). Unset under `accept_env_when_unprivileged = false`: no CDI annotation "
            "gives an unprivileged container GPUs (volume mounts still do).",
        ),
    },
    "timeouts": {
        "probe": ("timeout_probe", float, "Seconds a forked probe may take (libcuda's `cuDriverGetVersion` for "
                  "`NVIDIA_REQUIRE_CUDA`, NVML for `MIG-` UUIDs); above 0, at most 600."),
        "ldconfig": ("timeout_ldconfig", float, "Seconds the host's `ldconfig` may take on the rootfs; above 0, at most 600."),
        "lock": ("timeout_lock", float, "Seconds a run waits for another run into the same rootfs directory; above 0, at most 600."),
    },
    "cuda": {
        "compat": ("cuda_compat", bool, "Honour an image's newer libcuda in `/usr/local/cuda/compat` (CUDA forward "
                   "compatibility); `false`: never."),
    },
    "cache": {"dir": ("cache_dir", str, "Where the probe cache and the CUDA-version cache are kept (only root's 0600 files in a "
                      "directory only root can change are read); `\"\"` turns both off.")},
    "guard": {
        "records": ("guard_records", str, "Where the hooks record each GPU container they start (one root-only file per "
                    "container, read by `ponytail guard`); `\"\"`: `containers/` under `[cache] dir` (none when that is `\"\"`)."),
        "repair": ("guard_repair", bool, "`ponytail guard` gives back a recorded container's GPU nodes when its device "
                   "rules lost them (a systemd reload); `false`: it only reports, as `--report-only`."),
        "interval": ("guard_interval", float, "Seconds between the guard daemon's passes besides those on the driver's "
                     "udev events: a systemd reload makes no event, so this is how long a container may be without a GPU "
                     "node a reload took; above 0, at most 600."),
        "textfile": ("guard_textfile", str, "A Prometheus text file the guard rewrites after each pass, for node "
                     "exporter's textfile collector (`.../ponytail.prom`); `\"\"`: none."),
    },
    "cdi": {
        "unknown_nvidia_hooks": (
            "unknown_nvidia_hooks", str,
            "What ponytail does, serving NVIDIA's hook names, with a hook subcommand it does not know (a CDI spec "
            "written by a newer toolkit): `\"warn\"` logs a warning and the start goes on, as NVIDIA's own hook binary "
            "does; `\"fail\"` stops the start with one line. An unknown flag of a known subcommand is always an error.",
        ),
    },
    "cgroup": {
        "extend_denying_programs": (
            "extend_denying_programs", bool,
            "cgroup v2: extend a device program that allows devices it does not name but denies an injected node "
            "(another tool's deliberate deny). `false`: such a program wins and the start fails with one line naming "
            "the node and the program; allow-list programs (runc's, crun's, systemd's) are always extended.",
        ),
    },
}
# the tables of named sub-tables, [capabilities.NAME] and [drivers.NAME]: table -> key -> (type, what it means)
_NAMED_TABLES: dict[str, dict[str, tuple[str, str]]] = {
    "capabilities": {
        "libraries": ("list", "More library names (without `.so.<version>`) for the driver capability NAME "
                      "(compute, compat32, graphics, utility, video, display, ngx)."),
        "binaries": ("list", "More binaries for the driver capability NAME, found in the driver root's bin directories."),
    },
    "drivers": {
        "root": ("str", "Required. The directory of a user-mode driver tree a container may select with "
                 "`PONYTAIL_DRIVER=NAME`, laid out like a driver root."),
        "description": ("str", "Free text, shown by `ponytail info`."),
        "kernel_modules": ("list", "Kernel-module versions the tree may run against besides its own; `[\"*\"]`: any."),
    },
}


def schema() -> list[tuple[str, str, object, str]]:
    """Every config key as (key, type, default, meaning): ``[table] key`` from the schema, with the
    built-in default, then the keys of the named tables (``capabilities.NAME.libraries``...)."""
    defaults = Config()
    keys: list[tuple[str, str, object, str]] = []
    for table, entries in _SCHEMA.items():
        for key, (field_name, expected, meaning) in entries.items():
            keys.append((f"{table}.{key}", expected.__name__, getattr(defaults, field_name), meaning))
    for table, named in _NAMED_TABLES.items():
        for key, (type_name, meaning) in named.items():
            keys.append((f"{table}.NAME.{key}", type_name, None, meaning))
    return keys


MAX_TIMEOUT_S = 600.0
UNKNOWN_HOOK_CHOICES = ("warn", "fail")
_DRIVER_KEYS = tuple(_NAMED_TABLES["drivers"])
# [request] cri -> the annotation that CRI implementation writes into every container's config.json
# with its pod's namespace, after (over) the annotations a pod may bring: containerd's comes from
# the sandbox's metadata (internal/cri/annotations DefaultCRIAnnotations, applied after the
# pod_annotations/container_annotations pass-through); CRI-O's from the kubelet's container labels,
# added after the pod's annotations (internal/factory/container SpecAddAnnotations). Each key can
# be forged on the other engine: only the configured engine's key is read.
NAMESPACE_ANNOTATIONS = {"containerd": "io.kubernetes.cri.sandbox-namespace", "cri-o": "io.kubernetes.pod.namespace"}
_NAMESPACE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")  # a DNS label, as Kubernetes names namespaces
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def config_path(cli_path: str | None, environ: dict[str, str] | None = None) -> tuple[str, bool]:
    """The config file to read and whether the user named it explicitly.

    ``-config`` beats ``$PONYTAIL_CONFIG`` beats the default path. Only an
    explicitly named file must exist; a missing default means built-in defaults.
    """
    if cli_path:
        return cli_path, True
    env = (os.environ if environ is None else environ).get(CONFIG_ENV_VAR)
    if env:
        return env, True
    return DEFAULT_CONFIG_PATH, False


def load_config(path: str, required: bool) -> Config:
    """Read and validate ``path``; a missing file that was not required gives the defaults."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        if required:
            if os.environ.get(CONFIG_ENV_VAR) == path:  # named by the environment, not on the command line
                raise ConfigError(f"config file {path} does not exist (${CONFIG_ENV_VAR} names it): create it, or set "
                                  f"${CONFIG_ENV_VAR} to an existing file or unset it") from None
            raise ConfigError(f"config file {path} does not exist: create it or pass an existing -config FILE") from None
        return Config()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    return parse_config(raw, path)


def parse_config(raw: bytes, path: str) -> Config:
    """Validate TOML text against the schema; unknown keys and wrong types are errors."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    data = loads_plain(text)  # the usual plain config, without importing tomllib (ponytail/lite/)
    if data is None:
        data = _load_toml(text, path)
    values: dict[str, object] = {"path": path}
    capabilities = data.pop("capabilities", None)
    if capabilities is not None:
        values["capability_extras"] = _capability_extras(path, capabilities)
    drivers = data.pop("drivers", None)
    if drivers is not None:
        values["drivers"] = _driver_trees(path, drivers)
    for table, content in data.items():
        keys = _SCHEMA.get(table)
        if keys is None:
            known = ", ".join(f"[{t}]" for t in (*_SCHEMA, "capabilities.<name>", "drivers.<name>"))
            raise ConfigError(f"config file {path}: unknown table [{table}] (known: {known})")
        if not isinstance(content, dict):
            raise ConfigError(f"config file {path}: '{table}' must be a table ([{table}])")
        for key, value in content.items():
            if key not in keys:
                known = ", ".join(keys)
                raise ConfigError(f"config file {path}: unknown key '{table}.{key}' (known in [{table}]: {known})")
            field_name, expected, _ = keys[key]
            values[field_name] = _check_type(path, f"{table}.{key}", value, expected)
    mps = values.get("mps_pipe_directory")
    if isinstance(mps, str) and os.path.normpath(mps) != mps:
        raise ConfigError(f"config file {path}: 'host.mps_pipe_directory' must be a plain absolute path (no '..', '.', '//', trailing '/'), not {mps!r}")
    _check_namespaces(path, values)
    unknown = values.get("unknown_nvidia_hooks", "warn")
    if unknown not in UNKNOWN_HOOK_CHOICES:
        raise ConfigError(f"config file {path}: 'cdi.unknown_nvidia_hooks' must be \"warn\" or \"fail\", not {unknown!r}")
    return Config(**values)  # type: ignore[arg-type]  # each value was checked against its field type above


def _check_namespaces(path: str, values: dict[str, object]) -> None:
    """[request] cri names a known CRI implementation; env_namespaces are namespace names and need it."""
    cri = values.get("cri", "")
    if cri not in ("", *NAMESPACE_ANNOTATIONS):
        raise ConfigError(f"config file {path}: 'request.cri' must be one of {', '.join(map(repr, NAMESPACE_ANNOTATIONS))}, not {cri!r}")
    namespaces = values.get("env_namespaces", ())
    for name in namespaces if isinstance(namespaces, tuple) else ():
        if not (0 < len(name) <= 63 and set(name) <= _NAMESPACE_CHARS and not name.startswith("-") and not name.endswith("-")):
            raise ConfigError(f"config file {path}: 'request.env_namespaces' entry {name!r} is not a Kubernetes namespace name")
    if namespaces and not cri:
        raise ConfigError(
            f"config file {path}: 'request.env_namespaces' needs 'request.cri' (\"containerd\" or \"cri-o\"): a pod's "
            "namespace is read only from the annotation that CRI implementation writes, which a pod cannot set"
        )


def _capability_extras(path: str, table: object) -> dict[str, dict[str, tuple[str, ...]]]:
    from ponytail.capabilities import CAPABILITIES

    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: 'capabilities' must be a table of [capabilities.<name>] tables")
    extras: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, content in table.items():
        if name not in CAPABILITIES:
            raise ConfigError(f"config file {path}: unknown capability [capabilities.{name}] (known: {', '.join(CAPABILITIES)})")
        if not isinstance(content, dict):
            raise ConfigError(f"config file {path}: 'capabilities.{name}' must be a table")
        extras[name] = {}
        for key, value in content.items():
            if key not in _NAMED_TABLES["capabilities"]:
                raise ConfigError(f"config file {path}: unknown key 'capabilities.{name}.{key}' (known: libraries, binaries)")
            if not isinstance(value, list) or not all(isinstance(v, str) and v and "/" not in v for v in value):
                raise ConfigError(f"config file {path}: 'capabilities.{name}.{key}' must be a list of file names (no '/')")
            extras[name][key] = tuple(value)
    return extras


def _driver_trees(path: str, table: object) -> dict[str, DriverTree]:
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: 'drivers' must be a table of [drivers.<name>] tables")
    trees: dict[str, DriverTree] = {}
    for name, content in table.items():
        where = f"config file {path}: [drivers.{name}]"
        if not name or not _NAME_CHARS.issuperset(name) or name in (".", ".."):
            raise ConfigError(f"{where}: a driver name is letters, digits, '_', '.' and '-' only")
        if not isinstance(content, dict):
            raise ConfigError(f"config file {path}: 'drivers.{name}' must be a table")
        for key in content:
            if key not in _DRIVER_KEYS:
                raise ConfigError(f"{where}: unknown key 'drivers.{name}.{key}' (known: {', '.join(_DRIVER_KEYS)})")
        root = content.get("root")
        if root is None:
            raise ConfigError(f"{where}: 'drivers.{name}.root' is missing (the tree's directory, e.g. \"/opt/umd/build-1234\")")
        if not isinstance(root, str) or not root.startswith("/") or "\0" in root:
            raise ConfigError(f"{where}: 'drivers.{name}.root' must be an absolute path string, not {root!r}")
        description = content.get("description", "")
        if not isinstance(description, str):
            raise ConfigError(f"{where}: 'drivers.{name}.description' must be a string, not {_toml_type(description)}")
        modules = content.get("kernel_modules", [])
        if not isinstance(modules, list) or not all(isinstance(m, str) and _is_module_version(m) for m in modules):
            raise ConfigError(
                f"{where}: 'drivers.{name}.kernel_modules' must be a list of driver versions (\"550.54.15\") or [\"*\"] (any)"
            )
        trees[name] = DriverTree(name, os.path.normpath(root), description, tuple(modules))
    return trees


def _is_module_version(text: str) -> bool:
    parts = text.split(".")
    return text == "*" or (1 <= len(parts) <= 3 and all(p.isascii() and p.isdigit() for p in parts))


def _load_toml(text: str, path: str) -> dict:
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: TOML syntax error: {e}") from e
    except RecursionError:
        raise ConfigError(f"config file {path}: arrays or tables nested too deeply") from None
    except ValueError as e:  # a value tomllib cannot convert: an integer of over 4300 digits
        reason = str(e).partition("; use sys.")[0]
        raise ConfigError(f"config file {path}: a value cannot be read: {reason}") from None


def _check_type(path: str, key: str, value: object, expected: type) -> object:
    if expected is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config file {path}: '{key}' must be true or false, not {_toml_type(value)}")
        return value
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT_S:
            raise ConfigError(f"config file {path}: '{key}' must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}")
        return float(value)

    if expected is str:
        if not isinstance(value, str):
            raise ConfigError(f"config file {path}: '{key}' must be a string, not {_toml_type(value)}")
        if (key.startswith("host.") and key != "host.ldconfig" or key in ("cache.dir", "guard.records", "guard.textfile") and value) and not value.startswith("/"):
            raise ConfigError(f"config file {path}: '{key}' must be an absolute path, not {value!r}")
        if "\0" in value:
            raise ConfigError(f"config file {path}: '{key}' contains a NUL character")
        return value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"config file {path}: '{key}' must be a list of strings")
    if key == "request.env_namespaces":
        return tuple(value)  # checked with request.cri (_check_namespaces)
    if key == "request.swarm_resource":
        for v in value:
            if not v or not set(v) <= _NAME_CHARS or v[0].isdigit():
                raise ConfigError(f"config file {path}: '{key}' entry {v!r} is not an environment variable name (e.g. \"DOCKER_RESOURCE_GPU\")")
        return tuple(value)
    for v in value:
        if not v.startswith("/") or "\0" in v:
            raise ConfigError(f"config file {path}: '{key}' entry {v!r} must be an absolute path or glob")
    return tuple(value)


def _toml_type(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", list: "an array", dict: "a table"}.get(
        type(value), type(value).__name__
    )

