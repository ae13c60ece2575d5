"""The oci-hooks file (hooks.d, version 1.0.0) that makes podman and CRI-O run ponytail.

podman silently drops a hook whose ``path`` does not exist, and a malformed file
in a hooks directory makes every podman run fail: ``ponytail install-hook``
writes the file atomically, with the absolute path of this install's command.
The repository ships the same file for the usual path (hooks.d/ponytail.json).
"""

from __future__ import annotations

import json
import os
import re

import tomlkit
from tomlkit.exceptions import TOMLKitError

from ponytail.container.gpu_markers import GPU_ANNOTATION, GPU_ANNOTATION_VALUE
from ponytail.engines.configread import read_config
from ponytail.engines.model import Registered, Unregistered
from ponytail.errors import UsageError, os_failure
from ponytail.fs.atomic import replace_file
from ponytail.fs.hostfiles import under_root

FILE_NAME = "ponytail.json"
DEFAULT_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"  # what Debian 12's podman 4.3.1 reads
HOOKS_DIRS = (DEFAULT_HOOKS_DIR, "/etc/containers/oci/hooks.d")  # podman's and CRI-O's, unless hooks_dir says otherwise


def hook_file_text(command: str, config: str | None = None, always: bool = False) -> str:
    """The hooks.d JSON: run ``command`` at prestart of containers annotated com.example.gpu=true
    (``always``: of every container; the hook injects only into those that ask for GPUs).
    Without ``config`` the hook reads /etc/ponytail/config.toml if it exists, else its defaults."""
    args = ["ponytail", "-config", config] if config else ["ponytail"]
    when: dict = {"always": True} if always else {
        "annotations": {f"^{re.escape(GPU_ANNOTATION)}$": f"^{re.escape(GPU_ANNOTATION_VALUE)}$"}
    }
    document = {"version": "1.0.0", "hook": {"path": command, "args": args}, "when": when, "stages": ["prestart"]}
    return json.dumps(document, indent=2) + "\n"


def install_hook(directory: str, command: str, config: str | None) -> str:
    """Write ``directory``/ponytail.json atomically; returns its path."""
    if not os.path.isabs(command) or not os.path.isfile(command) or not os.access(command, os.X_OK):
        raise UsageError(f"hook command {command} is not an executable file given by an absolute path (podman would skip the hook)")
    if config is not None and not os.path.isabs(config):
        raise UsageError(f"--config {config}: must be an absolute path (the hook runs in the bundle directory)")
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, FILE_NAME)
        replace_file(path, hook_file_text(command, config).encode(), 0o644)
    except OSError as e:
        raise os_failure(f"cannot write the hook file in {directory}", e, UsageError) from e
    return path


def registered(root: str, configs: tuple[str, ...]) -> Registered | None:
    """ponytail's hooks.d file in the first hooks directory of an engine whose config files (or
    drop-in directories) are ``configs``; None when there is none."""
    found = hook_files(root, hooks_dirs(root, configs)[0])
    if not found:
        return None
    path, command = found[0]
    return Registered(path, path, command, hook=True)


def unregistered(root: str, configs: tuple[str, ...]) -> Unregistered:
    """No ponytail.json where the engine reads: the command that writes it. Mentioned: the file is
    in a default directory the engine was moved away from."""
    dirs, where = hooks_dirs(root, configs)
    return Unregistered(f"no {FILE_NAME} in {' or '.join(dirs)} ({where})", f"'ponytail install-hook --dir {dirs[0]}'",
                        mentioned=bool(hook_files(root, HOOKS_DIRS)))


def hooks_dirs(root: str, configs: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The hooks directories an engine reads: ``hooks_dir`` of its config files (the last one set
    wins, and replaces the defaults; a directory: its .conf files in name order), else the
    defaults; and where that was read."""
    dirs: tuple[str, ...] = HOOKS_DIRS
    where = "the default hooks directories"
    for config in configs:
        path = under_root(root, config)
        try:
            files = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".conf")] if os.path.isdir(path) else [path]
        except OSError:  # a directory this user may not read, or gone meanwhile: nothing read from it
            files = []
        for name in files:
            found = hooks_dir_setting(read_config(root, name))
            if found:
                dirs, where = found, f"hooks_dir in {name}"
    return dirs, where


def hooks_dir_setting(text: str | None) -> tuple[str, ...] | None:
    """The absolute directories of the first ``hooks_dir`` of a TOML config (containers.conf's
    [engine], CRI-O's [crio.runtime]), None when it sets none."""
    try:
        document = tomlkit.parse(text or "").unwrap()
    except (TOMLKitError, RecursionError):
        return None
    value = _first(document, "hooks_dir")
    items = value if isinstance(value, list) else [value]
    return tuple(i for i in items if isinstance(i, str) and i.startswith("/")) or None


def _first(table: dict, key: str) -> object:
    if key in table:
        return table[key]
    for value in table.values():
        if isinstance(value, dict):
            found = _first(value, key)
            if found is not None:
                return found
    return None


def hook_files(root: str, dirs: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """(path, the command it runs; None: not an oci-hooks file) of ponytail.json in each of ``dirs``."""
    found = []
    for directory in dirs:
        path = under_root(root, f"{directory.rstrip('/')}/{FILE_NAME}")
        if os.path.exists(path):
            found.append((path, hook_command(read_config(root, path))))
    return found


def hook_command(text: str | None) -> str | None:
    """The command of an oci-hooks file's ``hook``; None when it is not one."""
    try:
        document = json.loads(text or "")
    except ValueError:
        return None
    hook = document.get("hook") if isinstance(document, dict) else None
    command = hook.get("path") if isinstance(hook, dict) else None
    return command if isinstance(command, str) else None
