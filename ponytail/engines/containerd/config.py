"""containerd: a CRI runtime entry in config.toml (config versions 2, 3 and 4).

The entry copies runc's (``runtime_type`` and its ``options``, e.g. ``SystemdCgroup``) and
points ``BinaryName`` at ponytail-runtime, which execs the runtime of ponytail's ``[runtime]
path`` (runc from PATH by default): a custom BinaryName in runc's entry is named in the change,
with the line that keeps it. With --set-as-default it becomes ``default_runtime_name``. Every
other key and comment stays as it was (tomlkit). A runtime table without the default runtime in
it makes containerd's CRI plugin fail to load, so ``runc`` is added too when it is the default
and missing. An uninstall takes out the entry, that runc (when nothing else needs it) and puts
the default back as it was.

CDI annotations (``cdi.k8s.io/*``, the device plugin's ``cdi-annotations`` strategy) go to whoever
resolves them, never to both: containerd itself when its CDI is on (config versions 3 and 4, i.e.
containerd 2.x, unless ``enable_cdi = false``; version 2 with ``enable_cdi = true``, containerd
1.7), from the CDI spec ``ponytail cdi generate`` keeps in /var/run/cdi, and then the entry does
not pass them to the runtime; else (containerd 1.6, 1.7 without CDI) the entry lists them in
``container_annotations`` and ponytail-runtime reads them.

A pod's own annotations are the pod author's: a ``pod_annotations`` pattern of runc's entry that
would let a ``cdi.k8s.io/*`` pod annotation through (containerd writes it into config.json beside the
container's, indistinguishable) is left out of ponytail's entry, and the change says so.
"""

from __future__ import annotations

import glob
import os
import re
from fnmatch import fnmatchcase

import tomlkit
from tomlkit import TOMLDocument
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Table

from ponytail.engines.configread import read_config
from ponytail.engines.containerd import k3s
from ponytail.engines.model import Edit, Registered, Settings, Unregistered, lookup, ponytails
from ponytail.errors import ConfigError, PonytailError
from ponytail.fs.hostfiles import under_root

CONFIG_PATH = "/etc/containerd/config.toml"
IMPORTS_KEY = "imports"

RUNC_V2 = "io.containerd.runc.v2"
# config version -> the CRI plugin's table holding `containerd.runtimes`: version 2 is containerd
# 1.x's, 3 containerd 2.0-2.2's, 4 (2.3 on: `containerd config default`, `config migrate`) the same plugins
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}
CDI_ANNOTATIONS = "cdi.k8s.io/*"  # passed to the runtime: how the device plugin may name GPUs
CDI_SPEC = "/var/run/cdi/ponytail.yaml"  # where the installer keeps ponytail's CDI spec


def edit(path: str, text: str | None, settings: Settings, remove: bool = False, added: dict | None = None) -> Edit:
    k3s.refuse_generated(path, text)  # k3s/RKE2 write it at every start: their template is edited instead
    if k3s.is_template(path, text):
        return k3s.edit(path, text, settings, remove)
    document = _parse(path, text)
    version = _version(path, document, text)
    if "version" not in document:
        document["version"] = version
    plugin = CRI_PLUGIN[version]
    where = f'plugins."{plugin}".containerd'
    containerd = _table(path, document, ("plugins", plugin, "containerd"), create=not remove)
    if containerd is None:
        return Edit(path, text, text, ())
    runtimes = _table(path, containerd, ("runtimes",), create=not remove, where=where)
    if remove or runtimes is None:  # None only for a removal, which creates no table
        return _result(path, text, document, _remove(containerd, runtimes, where, settings.runtime_name, added or {}))
    changes: list[str] = []
    recorded: dict[str, object] = {}
    name = settings.runtime_name
    default = str(containerd.get("default_runtime_name", "runc"))
    runc = runtimes.get("runc")
    if runc is not None and not isinstance(runc, dict):
        raise ConfigError(f"{path}: [{where}.runtimes.runc] is not a table; fix it by hand first")
    cdi = _resolves_cdi(document, plugin, version)
    wanted = _entry(runc, settings, pass_cdi_annotations=not cdi)
    dropped = [p for p in (_plain(runc).get("pod_annotations") or [] if runc is not None else []) if p not in wanted.get("pod_annotations", [])]
    current = runtimes.get(name)
    if current is None or _plain(current) != wanted:
        runtimes[name] = _new_table(wanted, last=True)
        verb = "added" if current is None else "updated"
        changes.append(f"{verb} [{where}.runtimes.{name}]: runtime_type {wanted['runtime_type']!r}, "
                       f"options.BinaryName = {settings.runtime_path!r}" + (" (runc's options kept)" if runc else ""))
        if dropped:
            changes.append(
                f"left runc's pod_annotations {', '.join(map(repr, dropped))} out of [{where}.runtimes.{name}]: they let a pod's own "
                "cdi.k8s.io/* annotations through, which would read as the device plugin's"
            )
        if cdi:
            changes.append(
                f"containerd resolves CDI itself ({plugin}.enable_cdi): the device plugin's cdi.k8s.io/* annotations are not "
                f"passed to ponytail-runtime; keep ponytail's CDI spec current: ponytail cdi generate --output {CDI_SPEC}"
            )
        custom = _plain(runc).get("options", {}).get("BinaryName") if runc is not None else None
        if custom and isinstance(custom, str) and custom != "runc":
            changes.append(
                f"runc's BinaryName {custom!r} is not ponytail's: ponytail-runtime execs [runtime] path of its config "
                f"(/etc/ponytail/config.toml; default: runc from PATH); to keep {custom}, set there: [runtime] path = {custom!r}"
            )
    if settings.set_as_default and default != name:
        previous = containerd.get("default_runtime_name")
        recorded["default"] = None if previous is None else str(previous)
        containerd["default_runtime_name"] = name
        changes.append(f"{where}.default_runtime_name = {name!r} (was {default!r})")
        default = name
    if default == "runc" and runc is None:
        runtimes["runc"] = _new_table({"runtime_type": RUNC_V2})
        recorded["runc"] = True
        changes.append(f"added [{where}.runtimes.runc]: the default runtime must be defined or the CRI plugin fails to load")
    planned = _result(path, text, document, changes)
    return Edit(planned.path, planned.old_text, planned.new_text, planned.changes, recorded)


def _remove(containerd: dict, runtimes: dict | None, where: str, name: str, added: dict) -> list[str]:
    """Take out ponytail's runtime, and what ``added`` says ponytail added with it."""
    changes = []
    if runtimes is not None and name in runtimes:
        del runtimes[name]
        changes.append(f"removed [{where}.runtimes.{name}]")
    if containerd.get("default_runtime_name") == name:
        previous = added.get("default", "runc")
        if previous is None:
            del containerd["default_runtime_name"]
            changes.append(f"removed {where}.default_runtime_name (was {name!r}; containerd's default, runc, again)")
        else:
            containerd["default_runtime_name"] = previous
            changes.append(f"{where}.default_runtime_name = {previous!r} (was {name!r})")
    runc = runtimes.get("runc") if runtimes is not None else None
    if runtimes is not None and added.get("runc") and runc is not None and _plain(runc) == {"runtime_type": RUNC_V2} and len(runtimes) == 1:
        del runtimes["runc"]  # ponytail's, and no other runtime needs the default defined
        changes.append(f"removed [{where}.runtimes.runc] (ponytail added it)")
    return changes


def _resolves_cdi(document: dict, plugin: str, version: int) -> bool:
    """containerd's CRI plugin resolves CDI devices itself: on by default from containerd 2.0
    (config version 3 on), opt-in (``enable_cdi = true``) in 1.7."""
    table = document.get("plugins", {}).get(plugin, {})
    enabled = table.get("enable_cdi") if isinstance(table, dict) else None
    return bool(enabled) if isinstance(enabled, bool) else version >= 3


def _entry(runc: dict | None, settings: Settings, pass_cdi_annotations: bool) -> dict:
    """runc's entry (its runtime_type and options) with BinaryName set to ponytail-runtime, and,
    with ``pass_cdi_annotations``, the device plugin's CDI annotations let through to the runtime."""
    base = _plain(runc) if runc is not None else {}
    found = base.get("options")
    options: dict = found if isinstance(found, dict) else {}
    entry = {k: v for k, v in base.items() if k not in ("options", "container_annotations", "pod_annotations")}
    entry["runtime_type"] = base.get("runtime_type") or RUNC_V2
    pod = base.get("pod_annotations")
    if isinstance(pod, list):
        entry["pod_annotations"] = [p for p in pod if not (isinstance(p, str) and lets_cdi_through(p))]
    annotations = [a for a in (base.get("container_annotations") or []) if a != CDI_ANNOTATIONS]
    if pass_cdi_annotations:
        annotations.append(CDI_ANNOTATIONS)
    if annotations or "container_annotations" in base or pass_cdi_annotations:
        entry["container_annotations"] = annotations
    entry["options"] = {**options, "BinaryName": settings.runtime_path}
    return entry


def lets_cdi_through(pattern: str) -> bool:
    """Whether the pass-through ``pattern`` (containerd matches keys with Go's path.Match: ``*`` and
    ``?`` stop at ``/``) matches some ``cdi.k8s.io/NAME`` key: one ``/``, and a first part matching
    ``cdi.k8s.io`` (a pod may pick any NAME, so any second part counts)."""
    first, slash, second = pattern.partition("/")
    if not slash:
        return False
    first = re.sub(r"\\(.)", lambda m: "[" + m.group(1) + "]", first).replace("[^", "[!")  # Go's escapes and negation
    return "/" not in second and bool(second) and fnmatchcase("cdi.k8s.io", first)


def _parse(path: str, text: str | None) -> TOMLDocument:
    try:
        return tomlkit.parse(text or "")
    except TOMLKitError as e:
        raise ConfigError(f"{path} is not valid TOML ({e}); fix it by hand, ponytail will not guess") from e
    except RecursionError as e:
        raise ConfigError(f"{path}: tables or arrays nested too deeply") from e


def _version(path: str, document: dict, text: str | None) -> int:
    version = document.get("version")
    if version is None:
        if text is None or not text.strip():
            return 2  # a new file: what containerd 1.6 and 1.7 write (`containerd config default`)
        raise ConfigError(
            f"{path} has no 'version' key, so containerd reads it as config version 1, which ponytail does not edit: "
            "add 'version = 2' after checking its plugin names (containerd 1.7+: containerd config migrate)"
        )
    if isinstance(version, bool) or version not in CRI_PLUGIN:
        raise ConfigError(
            f"{path}: config version {version!r} is not one ponytail edits (2: containerd 1.x, 3: containerd 2.0-2.2, 4: containerd 2.3 on)"
        )
    return int(version)


def _table(path: str, parent: dict, keys: tuple[str, ...], create: bool, where: str = "") -> dict | None:
    table = parent
    for key in keys:
        where = f"{where}.{key}" if where else key
        child = table.get(key)
        if child is None:
            if not create:
                return None
            child = tomlkit.table(is_super_table=True)
            table[key] = child
            child = table[key]
        if not isinstance(child, dict):
            raise ConfigError(f"{path}: '{where}' is not a table; fix it by hand first")
        table = child
    return table


def _plain(value: object) -> dict:
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if unwrap is not None else dict(value)  # type: ignore[call-overload]  # a plain mapping when not a tomlkit item


def _new_table(values: dict, last: bool = False) -> Table:
    """A table of ``values``; ``last``: end with a blank line, before the file's next table."""
    table = tomlkit.table()
    items = list(values.items())
    for i, (key, value) in enumerate(items):
        if isinstance(value, dict):
            table.append(key, _new_table(value, last and i == len(items) - 1))
        else:
            table.append(key, value)
    if last and not (items and isinstance(items[-1][1], dict)):
        table.add(tomlkit.nl())
    return table


def _result(path: str, text: str | None, document: TOMLDocument, changes: list[str]) -> Edit:
    if not changes:
        return Edit(path, text, text, ())
    new_text = tomlkit.dumps(document)
    if text and not new_text.endswith("\n"):
        new_text += "\n"
    return Edit(path, text, new_text, tuple(changes))


# -- what edit() wrote, read back ------------------------------------------------------

def registered(root: str) -> Registered | None:
    """A runtime whose BinaryName is ponytail-runtime (or named as ``--name`` names it by default) in
    the node's config.toml, a file it imports (the containerd 2.x drop-in ``configure`` writes there),
    or the k3s template of a generated config; None when there is none."""
    for path, text in config_files(root):
        for name, binary in _binaries(path, text):
            if ponytails(binary) or name == Settings.runtime_name:
                return Registered(path, f"BinaryName in {path}", binary)
    return None


def unregistered(root: str) -> Unregistered:
    files = config_files(root)
    return Unregistered(f"{files[0][0]} has no runtime whose BinaryName is ponytail-runtime", files=tuple(files),
                        mentioned=any("ponytail" in text for _, text in files))


def config_files(root: str) -> list[tuple[str, str]]:
    """(path, text) of the node's config.toml and of what it is made of, as ``configure`` writes them:
    the files its imports name, or the template a k3s-generated config is made from."""
    path = under_root(root, CONFIG_PATH)
    text = read_config(root, path)
    files = [(path, text)]
    generated = k3s.generated_by(text)
    if generated is not None:
        template = os.path.join(os.path.dirname(path), os.path.basename(generated[1]))
        return [*files, (template, read_config(root, template))]
    try:
        files += [(p, read_config(root, p)) for p in imported(path, text or None)]
    except PonytailError:
        pass  # a config containerd cannot read: the finding names config.toml
    return files


def _binaries(path: str, text: str) -> list[tuple[str, str]]:
    """(runtime name, BinaryName) of each CRI runtime the config ``text`` defines, whatever its plugin's name."""
    try:
        document = tomlkit.parse(k3s.toml_of(text) if k3s.is_template(path, text) else text).unwrap()
    except (TOMLKitError, RecursionError):
        return []
    found = []
    plugins = lookup(document, "plugins")
    for plugin in plugins.values() if isinstance(plugins, dict) else ():
        runtimes = lookup(plugin, "containerd", "runtimes")
        for name, entry in runtimes.items() if isinstance(runtimes, dict) else ():
            binary = lookup(entry, "options", "BinaryName")
            if isinstance(binary, str):
                found.append((name, binary))
    return found


def node_prefix(main_path: str) -> str | None:
    """Where the node's / is, seen from here, for a config at its usual path: '' for
    /etc/containerd/config.toml, '/host' for /host/etc/containerd/config.toml (the installer's
    view); None elsewhere. ``imports`` name paths as containerd on the node sees them."""
    return main_path[: -len(CONFIG_PATH)] if main_path.endswith(CONFIG_PATH) else None


def imported(main_path: str, main_text: str | None) -> list[str]:
    """The files containerd merges into the config at ``main_path`` (its ``imports``: a glob's matches in
    name order, a relative path beside the config), as seen from here; those that exist. The paths of a
    config at its usual place are the node's (node_prefix); a bad config is a ConfigError."""
    prefix = node_prefix(main_path) or ""
    found: list[str] = []
    for pattern in imports(_parse(main_path, main_text)):
        full = prefix + pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(main_path), pattern)
        matches = sorted(glob.glob(full)) if glob.has_magic(full) else [full]
        found += [m for m in matches if os.path.isfile(m) and m not in found and m != main_path]
    return found


def imports(document: dict) -> list[str]:
    """The config's ``imports``: paths or globs of the files containerd 2.x merges into it."""
    value = document.get(IMPORTS_KEY) or []
    return [str(v) for v in value] if isinstance(value, list) else []
