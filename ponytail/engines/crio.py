"""CRI-O: a drop-in under crio.conf.d with a runtime entry for ponytail-runtime.

crio.conf itself is only read (to refuse one CRI-O could not read either); the drop-in
``<dir of crio.conf>/crio.conf.d/99-ponytail.conf`` is ponytail's own file, read after
crio.conf and the other drop-ins of lower names. Comments added to it by hand are kept.
"""

from __future__ import annotations

import os

from ponytail.engines.model import Edit, Settings
from ponytail.errors import ConfigError

DROP_IN = "99-ponytail.conf"
HEADER = (
    "# Written by `ponytail configure --runtime crio`: the ponytail runtime (runc behind\n"
    "# ponytail-runtime, which gives GPU containers the host's NVIDIA GPUs). Select it per pod\n"
    "# with a RuntimeClass whose handler is its name; remove this file to undo.\n"
)


def drop_in_path(config_file: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(config_file)), "crio.conf.d", DROP_IN)


def check_main_config(path: str, text: str | None) -> None:
    """crio.conf must be TOML that CRI-O can read; ponytail does not change it."""
    if text is None:
        return
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        tomlkit.parse(text)
    except (TOMLKitError, RecursionError) as e:
        raise ConfigError(f"{path} is not valid TOML ({e}); CRI-O cannot read it either: fix it first") from e


def edit(path: str, text: str | None, settings: Settings, remove: bool = False, added: dict | None = None) -> Edit:
    """The file is ponytail's own: a removal removes it (``added`` is not needed)."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    if remove:
        return Edit(path, text, None, (f"removed {path}",) if text is not None else ())
    try:
        document = tomlkit.parse(text) if text and text.strip() else tomlkit.parse(HEADER)
    except (TOMLKitError, RecursionError) as e:
        raise ConfigError(f"{path} is not valid TOML ({e}); fix or remove it, ponytail will not guess") from e
    changes: list[str] = []
    crio = _table(path, document, "crio")
    runtime = _table(path, crio, "runtime")
    runtimes = _table(path, runtime, "runtimes")
    name = settings.runtime_name
    wanted = {"runtime_path": settings.runtime_path, "runtime_type": "oci"}
    current = runtimes.get(name)
    unwrap = getattr(current, "unwrap", None)  # a tomlkit table: its plain dict
    plain = unwrap() if unwrap is not None else current
    if not isinstance(plain, dict) or any(plain.get(k) != v for k, v in wanted.items()):
        entry = tomlkit.table()
        for key, value in ({**plain, **wanted} if isinstance(plain, dict) else wanted).items():
            entry[key] = value
        runtimes[name] = entry
        changes.append(f"[crio.runtime.runtimes.{name}] runtime_path = {settings.runtime_path!r}, runtime_type = 'oci'")
    if settings.set_as_default and runtime.get("default_runtime") != name:
        runtime["default_runtime"] = name
        changes.append(f"[crio.runtime] default_runtime = {name!r}")
    if not settings.set_as_default and runtime.get("default_runtime") == name:
        del runtime["default_runtime"]
        changes.append("[crio.runtime] default_runtime removed (CRI-O's own default again)")
    if not changes:
        return Edit(path, text, text, ())
    return Edit(path, text, tomlkit.dumps(document), tuple(changes))


def _table(path: str, parent: dict, key: str) -> dict:  # tomlkit's documents and tables are dicts
    import tomlkit

    if key not in parent:
        parent[key] = tomlkit.table(is_super_table=True)
    value = parent[key]
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: '{key}' is not a table; fix or remove the file")
    return value
