"""Docker: a runtime in /etc/docker/daemon.json's ``runtimes`` (and ``default-runtime``).

Docker reads no hooks.d directory; ponytail-runtime adds the hook to GPU containers' bundles.
Every other key of daemon.json, and their order, stays as it was.
"""

from __future__ import annotations

import json

from ponytail.engines.configread import read_config
from ponytail.engines.model import Edit, Registered, Settings, Unregistered, ponytails
from ponytail.errors import ConfigError
from ponytail.fs.hostfiles import under_root

CONFIG_PATH = "/etc/docker/daemon.json"


def edit(path: str, text: str | None, settings: Settings, remove: bool = False, added: dict | None = None) -> Edit:
    """``added``: for a removal, what the install recorded ("default": the default-runtime it replaced)."""
    document = _parse(path, text)
    changes: list[str] = []
    recorded: dict[str, object] = {}
    runtimes = document.get("runtimes")
    if runtimes is None:
        runtimes = {}
    if not isinstance(runtimes, dict):
        raise ConfigError(f"{path}: 'runtimes' is not an object; fix it by hand first")
    name = settings.runtime_name
    wanted = {"path": settings.runtime_path}
    if remove:
        if name in runtimes:
            del runtimes[name]
            changes.append(f"removed runtime {name!r}")
        if document.get("default-runtime") == name:
            previous = (added or {}).get("default")
            if isinstance(previous, str):
                document["default-runtime"] = previous
                changes.append(f"default-runtime = {previous!r} again")
            else:
                del document["default-runtime"]
                changes.append("removed default-runtime (Docker's default, runc, again)")
    else:
        current = runtimes.get(name)
        if current != wanted:
            merged = {**current, **wanted} if isinstance(current, dict) else wanted
            if current != merged:
                runtimes[name] = merged
                changes.append(f"runtimes.{name}.path = {settings.runtime_path!r}")
        if settings.set_as_default and document.get("default-runtime") != name:
            changes.append(f"default-runtime = {name!r} (was {document.get('default-runtime', 'runc')!r})")
            recorded["default"] = document.get("default-runtime")
            document["default-runtime"] = name
    if runtimes:
        document["runtimes"] = runtimes
    elif "runtimes" in document:
        del document["runtimes"]
    if not changes:
        return Edit(path, text, text, ())
    return Edit(path, text, json.dumps(document, indent=_indent(text)) + "\n", tuple(changes), recorded)


def registered(root: str) -> Registered | None:
    """The runtime ``edit`` wrote in the node's daemon.json (one named as ``--name`` names it by
    default, or one that runs a ponytail command); None when there is none."""
    path = under_root(root, CONFIG_PATH)
    return runtime(path, read_config(root, path))


def runtime(path: str, text: str | None) -> Registered | None:
    """ponytail's runtime in the daemon.json ``text`` (read from ``path``)."""
    try:
        document = _parse(path, text)
    except ConfigError:
        return None
    runtimes = document.get("runtimes")
    for name, entry in runtimes.items() if isinstance(runtimes, dict) else ():
        program = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(program, str) and (ponytails(program) or name == Settings.runtime_name):
            how = "the default runtime" if document.get("default-runtime") == name else f"used by 'docker run --runtime {name}'"
            return Registered(path, f"runtime '{name}' in {path} ({how})", program)
    return None


def unregistered(root: str) -> Unregistered:
    path = under_root(root, CONFIG_PATH)
    text = read_config(root, path)
    return Unregistered(f"{path} registers no ponytail-runtime", files=((path, text),), mentioned="ponytail" in text)


def _parse(path: str, text: str | None) -> dict:
    if text is None or not text.strip():
        return {}
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); fix it by hand, ponytail will not guess") from e
    if not isinstance(document, dict):
        raise ConfigError(f"{path} must hold a JSON object, not {type(document).__name__}")
    return document


def _indent(text: str | None) -> int:
    """The indentation the file already uses (Docker's documentation uses 4 spaces)."""
    for line in (text or "").splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            return len(line) - len(stripped)
    return 4
