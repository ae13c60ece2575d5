"""containerd 2.x drop-ins: ponytail's runtime in a file of its own, imported by config.toml.

containerd 2.x merges the files its config's ``imports`` names (globs such as
``/etc/containerd/conf.d/*.toml``, NVIDIA's default since toolkit 1.18) into the config. Where the
release supports them (config version 3 or 4), ``ponytail configure --runtime containerd`` writes
its runtime entry as ``99-ponytail.toml`` in a drop-in directory: the one ``--drop-in-config PATH``
names, else the first directory config.toml already imports; config.toml gets an ``imports`` entry
only when nothing it imports covers that file. Both files go through the same record and undo as
any configured file (ponytail.install.undo): ``--uninstall`` removes the drop-in it
created and takes out exactly the import it added.
"""

from __future__ import annotations

import fnmatch
import os

import tomlkit

from ponytail.engines.containerd import config as containerd
from ponytail.engines.containerd.config import IMPORTS_KEY, imported, node_prefix
from ponytail.engines.containerd.config import imports as _imports
from ponytail.engines.model import Edit, Settings
from ponytail.errors import ConfigError
from ponytail.fs.hostfiles import is_under

__all__ = ["DROP_IN_NAME", "IMPORTS_KEY", "drop_in_for", "drop_in_edit", "imported", "main_edit", "node_prefix"]

DROP_IN_NAME = "99-ponytail.toml"


def drop_in_for(main_path: str, main_text: str | None, wanted: str | None) -> str | None:
    """The drop-in ponytail's entry goes to (None: edit config.toml itself): ``wanted``, else
    99-ponytail.toml in the first directory config.toml imports, for a config of containerd 2.x."""
    document = _parse(main_path, main_text)
    version = document.get("version")
    if wanted is not None:
        if not isinstance(version, int) or isinstance(version, bool) or version < 3:
            raise ConfigError(f"{main_path}: config version {version!r} is containerd 1.x's, whose imports ponytail does not use; "
                              "configure config.toml itself (leave out --drop-in-config)")
        return os.path.abspath(wanted)
    prefix = node_prefix(main_path)
    if not isinstance(version, int) or isinstance(version, bool) or version < 3 or prefix is None:
        return None  # containerd 1.x; or a config elsewhere than /etc/containerd/config.toml, whose imports are paths of another view
    for pattern in _imports(document):
        directory, glob = os.path.split(pattern)
        if fnmatch.fnmatch(DROP_IN_NAME, glob) and os.path.isabs(directory):
            return prefix + os.path.join(directory, DROP_IN_NAME)
    return None


def main_edit(path: str, text: str | None, drop_in: str, remove: bool = False, added: dict | None = None) -> Edit:
    """config.toml with an import that covers ``drop_in`` (or, to remove, without the one ponytail added)."""
    document = _parse(path, text)
    imports = _imports(document)
    if remove:
        ours = (added or {}).get("imports")
        if not isinstance(ours, str) or ours not in imports:
            return Edit(path, text, text, ())
        kept = [p for p in imports if p != ours]
        if kept:
            document[IMPORTS_KEY] = kept
        else:
            del document[IMPORTS_KEY]
        return Edit(path, text, tomlkit.dumps(document), (f"removed {ours!r} from imports (ponytail added it)",))
    seen_at = node_prefix(path) or ""
    if any(_covers(seen_at + p, drop_in) for p in imports):
        return Edit(path, text, text, ())
    directory = os.path.dirname(drop_in)
    prefix = node_prefix(path)
    if prefix and is_under(directory, prefix):
        directory = directory[len(prefix):]  # as containerd on the node sees it
    pattern = os.path.join(directory, "*.toml")
    if IMPORTS_KEY in document:
        document[IMPORTS_KEY].append(pattern)
    else:
        document[IMPORTS_KEY] = [pattern]
    return Edit(path, text, tomlkit.dumps(document), (f"imports += {pattern!r}: containerd merges {drop_in} into this config",),
                {"imports": pattern})


def drop_in_edit(path: str, text: str | None, main_text: str | None, settings: Settings, remove: bool = False) -> Edit:
    """The drop-in: the main config's version and ponytail's runtime table (runc's options of the main
    config copied, as in config.toml itself)."""
    main = _parse(path, main_text)
    version = int(main.get("version", 3))
    if remove:
        return Edit(path, text, None, ("removed ponytail's drop-in",)) if text is not None else Edit(path, text, text, ())
    plugin = containerd.CRI_PLUGIN[version]
    table = main.get("plugins", {}).get(plugin, {}).get("containerd", {})
    runc = table.get("runtimes", {}).get("runc") if isinstance(table, dict) else None
    entry = containerd._entry(runc, settings, pass_cdi_annotations=not containerd._resolves_cdi(main, plugin, version))  # noqa: SLF001
    new = _render(version, plugin, settings.runtime_name, entry)
    if text == new:
        return Edit(path, text, text, ())
    return Edit(path, text, new, (f"{'wrote' if text is None else 'rewrote'} [plugins.\"{plugin}\".containerd.runtimes.{settings.runtime_name}] "
                                  f"(options.BinaryName = {settings.runtime_path!r}) in a drop-in of its own",))


def _render(version: int, plugin: str, name: str, entry: dict) -> str:
    document = tomlkit.document()
    document["version"] = version
    runtimes = tomlkit.table(is_super_table=True)
    runtimes[name] = entry
    containerd = tomlkit.table(is_super_table=True)
    containerd["runtimes"] = runtimes
    cri = tomlkit.table(is_super_table=True)
    cri["containerd"] = containerd
    plugins = tomlkit.table(is_super_table=True)
    plugins[plugin] = cri
    document["plugins"] = plugins
    return tomlkit.dumps(document)


def _covers(pattern: str, path: str) -> bool:
    """Whether containerd's import ``pattern`` names ``path``: Go's filepath.Match, whose ``*`` and ``?``
    stop at ``/`` (a file in a directory below the pattern's is not imported)."""
    if "*" not in pattern and "?" not in pattern and "[" not in pattern:
        return os.path.abspath(pattern) == path
    parts, names = pattern.split("/"), path.split("/")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p) for n, p in zip(names, parts, strict=True))


def _parse(path: str, text: str | None) -> dict:
    return containerd._parse(path, text)  # noqa: SLF001 - one TOML reader for containerd's files
