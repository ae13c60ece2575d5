"""CRI-O: a drop-in under crio.conf.d with a runtime entry for ponytail-runtime.

crio.conf itself is only read (to refuse one CRI-O could not read either); the drop-in
``<dir of crio.conf>/crio.conf.d/99-ponytail.conf`` is ponytail's own file, read after
crio.conf and the other drop-ins of lower names. Comments added to it by hand are kept.
"""

from __future__ import annotations

import os

import tomlkit
from tomlkit.exceptions import TOMLKitError

from ponytail.engines import hooksd
from ponytail.engines.configread import read_config
from ponytail.engines.model import Edit, Registered, Settings, Unregistered, lookup, ponytails
from ponytail.errors import ConfigError
from ponytail.fs.hostfiles import under_root

CONFIG_PATH = "/etc/crio/crio.conf"
HOOKS_CONFIGS = (CONFIG_PATH, "/etc/crio/crio.conf.d")  # may set hooks_dir
DROP_IN = "99-ponytail.conf"
HEADER = (
    "# Written by `ponytail configure --runtime crio`: the ponytail runtime (runc behind\n"
    "# ponytail-runtime, which gives GPU containers the host's NVIDIA GPUs). Select it per pod\n"
    "# with a RuntimeClass whose handler is its name; remove this file to undo.\n"
)


def drop_in_path(config_file: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(config_file)), "crio.conf.d", DROP_IN)


def edited_file(path: str, text: str | None) -> str:
    """The file ``edit`` changes for the config ``path`` (crio.conf, whose ``text`` is checked): the drop-in beside it."""
    check_main_config(path, text)
    return drop_in_path(path)


def check_main_config(path: str, text: str | None) -> None:
    """crio.conf must be TOML that CRI-O can read; ponytail does not change it."""
    if text is None:
        return
    try:
        tomlkit.parse(text)
    except (TOMLKitError, RecursionError) as e:
        raise ConfigError(f"{path} is not valid TOML ({e}); CRI-O cannot read it either: fix it first") from e


def edit(path: str, text: str | None, settings: Settings, remove: bool = False, added: dict | None = None) -> Edit:
    """The file is ponytail's own: a removal removes it (``added`` is not needed)."""
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


def registered(root: str) -> Registered | None:
    """A runtime that is ponytail-runtime in crio.conf or a file of crio.conf.d (the drop-in ``edit``
    writes), else ponytail's hooks.d file where CRI-O reads hooks; None when neither is there."""
    for path in _config_files(root):
        found = runtime(path, read_config(root, path))
        if found is not None:
            return found
    return hooksd.registered(root, HOOKS_CONFIGS)


def unregistered(root: str) -> Unregistered:
    return hooksd.unregistered(root, HOOKS_CONFIGS)


def runtime(path: str, text: str | None) -> Registered | None:
    """The first ``[crio.runtime.runtimes.NAME]`` of the config ``text`` whose runtime_path is ponytail's."""
    try:
        document = tomlkit.parse(text or "").unwrap()
    except (TOMLKitError, RecursionError):
        return None
    runtimes = lookup(document, "crio", "runtime", "runtimes")
    for name, entry in runtimes.items() if isinstance(runtimes, dict) else ():
        program = lookup(entry, "runtime_path")
        if isinstance(program, str) and (ponytails(program) or name == Settings.runtime_name):
            return Registered(path, f"runtime_path in {path}", program)
    return None


def _config_files(root: str) -> list[str]:
    """crio.conf and the files of crio.conf.d beside it, in the order CRI-O reads them."""
    main = under_root(root, CONFIG_PATH)
    drop_ins = os.path.join(os.path.dirname(main), "crio.conf.d")
    try:
        names = sorted(os.listdir(drop_ins)) if os.path.isdir(drop_ins) else []
    except OSError:  # a directory this user may not read, or gone meanwhile: nothing read from it
        names = []
    return [main, *(os.path.join(drop_ins, n) for n in names)]


def _table(path: str, parent: dict, key: str) -> dict:  # tomlkit's documents and tables are dicts
    if key not in parent:
        parent[key] = tomlkit.table(is_super_table=True)
    value = parent[key]
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: '{key}' is not a table; fix or remove the file")
    return value
