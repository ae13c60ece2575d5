"""config.toml -> a typed, validated Config. Errors name the file and the key."""

from __future__ import annotations

import os
from ponytail.lite.records import field, record

from ponytail.errors import ConfigError
from ponytail.lite.plaintoml import loads_plain

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
    ldconfig: str = ""  # empty: the host's /sbin/ldconfig or /usr/sbin/ldconfig
    library_paths: tuple[str, ...] = ()  # the user's own library globs, added to the capabilities' libraries
    log_file: str = "/var/log/ponytail.log"
    # extra library names and binaries per driver capability: {"compute": {"libraries": (...), "binaries": (...)}}
    capability_extras: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict, compare=False)
    runtime_path: str = "runc"  # ponytail-runtime execs this (a name on PATH, or an absolute path)


# table -> key -> (Config field, expected type)
_SCHEMA: dict[str, dict[str, tuple[str, type]]] = {
    "host": {
        "driver_root": ("driver_root", str),
        "proc_root": ("proc_root", str),
        "sys_root": ("sys_root", str),
        "dev_root": ("dev_root", str),
        "ipc_root": ("ipc_root", str),
        "ldconfig": ("ldconfig", str),
    },
    "library": {"paths": ("library_paths", list)},
    "log": {"file": ("log_file", str)},
    "runtime": {"path": ("runtime_path", str)},
}


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
            raise ConfigError(f"config file {path} does not exist: create it or pass an existing -config FILE")
        return Config()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}")
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    return parse_config(raw, path)


def parse_config(raw: bytes, path: str) -> Config:
    """Validate TOML text against the schema; unknown keys and wrong types are errors."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text")
    data = loads_plain(text)  # the usual plain config, without importing tomllib (ponytail/lite/)
    if data is None:
        data = _load_toml(text, path)
    values: dict[str, object] = {"path": path}
    capabilities = data.pop("capabilities", None)
    if capabilities is not None:
        values["capability_extras"] = _capability_extras(path, capabilities)
    for table, content in data.items():
        keys = _SCHEMA.get(table)
        if keys is None:
            known = ", ".join(f"[{t}]" for t in (*_SCHEMA, "capabilities.<name>"))
            raise ConfigError(f"config file {path}: unknown table [{table}] (known: {known})")
        if not isinstance(content, dict):
            raise ConfigError(f"config file {path}: '{table}' must be a table ([{table}])")
        for key, value in content.items():
            if key not in keys:
                known = ", ".join(keys)
                raise ConfigError(f"config file {path}: unknown key '{table}.{key}' (known in [{table}]: {known})")
            field_name, expected = keys[key]
            values[field_name] = _check_type(path, f"{table}.{key}", value, expected)
    return Config(**values)  # type: ignore[arg-type]


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
            if key not in ("libraries", "binaries"):
                raise ConfigError(f"config file {path}: unknown key 'capabilities.{name}.{key}' (known: libraries, binaries)")
            if not isinstance(value, list) or not all(isinstance(v, str) and v and "/" not in v for v in value):
                raise ConfigError(f"config file {path}: 'capabilities.{name}.{key}' must be a list of file names (no '/')")
            extras[name][key] = tuple(value)
    return extras


def _load_toml(text: str, path: str) -> dict:
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: TOML syntax error: {e}")
    except RecursionError:
        raise ConfigError(f"config file {path}: arrays or tables nested too deeply")


def _check_type(path: str, key: str, value: object, expected: type) -> object:
    if expected is str:
        if not isinstance(value, str):
            raise ConfigError(f"config file {path}: '{key}' must be a string, not {_toml_type(value)}")
        if key.startswith("host.") and key != "host.ldconfig" and not value.startswith("/"):
            raise ConfigError(f"config file {path}: '{key}' must be an absolute path, not {value!r}")
        if "\0" in value:
            raise ConfigError(f"config file {path}: '{key}' contains a NUL character")
        return value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"config file {path}: '{key}' must be a list of strings")
    for v in value:
        if not v.startswith("/") or "\0" in v:
            raise ConfigError(f"config file {path}: '{key}' entry {v!r} must be an absolute path or glob")
    return tuple(value)


def _toml_type(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", list: "an array", dict: "a table"}.get(
        type(value), type(value).__name__
    )

