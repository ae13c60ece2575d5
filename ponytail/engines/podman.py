"""podman (and CRI-O's hooks_dir): ponytail's hooks.d file, as ``ponytail install-hook`` writes it.

The file is ponytail's own: a broken one (every podman run fails on it) is replaced. With
--set-as-default the hook runs for every container (``"always": true``) and injects only
into those that ask for GPUs; without it, for containers annotated com.example.gpu=true.
"""

from __future__ import annotations

import tomlkit
from tomlkit.exceptions import TOMLKitError

from ponytail.engines import hooksd
from ponytail.engines.configread import read_config
from ponytail.engines.hooksd import hook_file_text
from ponytail.engines.model import Edit, Registered, Settings, Unregistered, lookup
from ponytail.fs.hostfiles import under_root

CONFIG_PATH = "/usr/share/containers/oci/hooks.d/ponytail.json"  # what Debian 12's podman reads
HOOKS_CONFIGS = ("/etc/containers/containers.conf",)  # may set hooks_dir
CONTAINERS_CONFS = ("/usr/share/containers/containers.conf", "/etc/containers/containers.conf")  # the package's, then root's


def edit(path: str, text: str | None, settings: Settings, remove: bool = False, added: dict | None = None) -> Edit:
    """The file is ponytail's own: a removal removes it (``added`` is not needed)."""
    if remove:
        return Edit(path, text, None, (f"removed {path}",) if text is not None else ())
    wanted = hook_file_text(settings.hook_path, settings.hook_config, always=settings.set_as_default)
    if text == wanted:
        return Edit(path, text, text, ())
    when = "every container (it injects only into those that ask)" if settings.set_as_default else \
        "containers annotated com.example.gpu=true"
    with_config = f" -config {settings.hook_config} ($PONYTAIL_CONFIG)" if settings.hook_config else ""
    return Edit(path, text, wanted, (f"hooks.d file: runs {settings.hook_path}{with_config} at prestart of {when}",))


def registered(root: str) -> Registered | None:
    """ponytail.json in the hooks directory podman reads (containers.conf's hooks_dir, else the defaults)."""
    return hooksd.registered(root, HOOKS_CONFIGS)


def unregistered(root: str) -> Unregistered:
    return hooksd.unregistered(root, HOOKS_CONFIGS)


def configured_runtime(root: str) -> tuple[str, str] | None:
    """(runtime, the file that sets it) of podman's ``runtime`` under [engine] in containers.conf, the
    last file that sets it; None where none does (podman's default: crun where it is installed)."""
    found = None
    for path in CONTAINERS_CONFS:
        try:
            runtime = lookup(tomlkit.parse(read_config(root, under_root(root, path))).unwrap(), "engine", "runtime")
        except (TOMLKitError, RecursionError):
            continue
        if isinstance(runtime, str) and runtime:
            found = runtime, path
    return found
