"""``ponytail configure``: register ponytail with a container engine by editing the engine's
own configuration, the way its users would by hand.

probe (read the file, refusing what cannot be edited safely) -> plan (an Edit: the new text
and each change, from a pure function per engine) -> apply (a backup of the original once,
then the new text in one rename). ``--dry-run`` prints the plan as a unified diff.

Engines and what is edited:
  docker      /etc/docker/daemon.json: "runtimes" (and "default-runtime")
  containerd  /etc/containerd/config.toml (version 2 or 3): a CRI runtime entry (and default_runtime_name)
  crio        a drop-in crio.conf.d/99-ponytail.conf beside /etc/crio/crio.conf
  podman      /usr/share/containers/oci/hooks.d/ponytail.json
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType

from ponytail.engines.configure.model import Edit, Settings

ENGINE_NAMES = ("docker", "containerd", "crio", "podman")


@dataclass(frozen=True)
class Outcome:
    edit: Edit
    lines: tuple[str, ...]  # what to print


def engine_module(name: str) -> ModuleType:
    """The engine's module (imported by name, so that PyInstaller sees each one)."""
    from ponytail.engines.configure import containerd, crio, docker, podman

    return {"docker": docker, "containerd": containerd, "crio": crio}.get(name, podman)


def plan(engine: str, config_file: str | None, settings: Settings, remove: bool = False) -> Edit:
    """Read the engine's config (and, for CRI-O, check crio.conf) and plan the edit."""
    from ponytail.engines.configure import files

    module = engine_module(engine)
    path = os.path.abspath(config_file or module.DEFAULT_PATH)
    if engine == "crio":
        module.check_main_config(path, files.read_text(path))
        path = module.drop_in_path(path)
    planned = module.edit(path, files.read_text(path), settings, remove=remove)
    if remove and planned.new_text is not None and os.path.exists(path + files.CREATED_SUFFIX):
        # ponytail created the file: if nothing but ponytail's entries is in it, it goes again
        created = module.edit(path, module.edit(path, None, settings).new_text, settings, remove=True).new_text
        if planned.new_text == created:
            return Edit(path, planned.old_text, None, (*planned.changes, "removed the file (ponytail created it)"))
    return planned


def apply(engine: str, edit: Edit, uninstall: bool = False) -> Outcome:
    """Write ``edit`` (nothing when it changes nothing); the lines saying what was done."""
    from ponytail.engines.configure import files

    restart = engine_module(engine).RESTART
    if not edit.changed:
        state = "not configured for ponytail" if uninstall else "already configured for ponytail"
        return Outcome(edit, (f"{edit.path}: {state}; nothing changed",))
    files.check_writable(edit.path)
    lines = [f"{edit.path}: {change}" for change in edit.changes]
    if edit.new_text is None:
        files.remove(edit.path)
        files.remove(edit.path + files.CREATED_SUFFIX)
    elif uninstall and _backup_matches(edit):
        files.restore_backup(edit.path)
        lines = [f"{edit.path}: restored {edit.path}{files.BACKUP_SUFFIX}, the file as it was before ponytail"]
    else:
        backup = files.write_atomically(edit.path, edit.new_text, backup=not uninstall)
        if edit.old_text is None and not uninstall:
            files.write_atomically(edit.path + files.CREATED_SUFFIX, "", backup=False)
        if backup:
            lines.append(f"{edit.path}: the original is kept in {backup}")
    lines.append(f"restart the engine to apply: {restart}" if not restart.startswith("nothing") else restart)
    return Outcome(edit, tuple(lines))


def _backup_matches(edit: Edit) -> bool:
    """The backup is the file without ponytail's entries: restore it byte for byte (its
    formatting too) rather than write the re-serialised text."""
    from ponytail.engines.configure import files

    try:
        backup = files.read_text(edit.path + files.BACKUP_SUFFIX)
    except Exception:
        return False
    if backup is None or edit.new_text is None:
        return False
    if backup == edit.new_text:
        return True
    import json

    try:  # daemon.json: the same document, written with other whitespace
        return bool(json.loads(backup) == json.loads(edit.new_text))
    except ValueError:
        return False


def render_diff(edit: Edit) -> str:
    """The edit as a unified diff (``--dry-run``)."""
    import difflib

    if not edit.changed:
        return ""
    old = (edit.old_text or "").splitlines(keepends=True)
    new = (edit.new_text or "").splitlines(keepends=True)
    label_old = edit.path if edit.old_text is not None else "/dev/null"
    label_new = edit.path if edit.new_text is not None else "/dev/null"
    text = "".join(difflib.unified_diff(old, new, label_old, label_new))
    return text if text.endswith("\n") else text + "\n\\ No newline at end of file\n"


def configure(
    engine: str, config_file: str | None, path: str | None, name: str, set_as_default: bool, dry_run: bool, uninstall: bool
) -> list[str]:
    """``ponytail configure``: plan, then print the diff (dry run) or apply; the lines to print."""
    from ponytail.engines.command import installed_command
    from ponytail.errors import UsageError

    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"--name {name!r}: a runtime name is letters, digits, '-' and '_'")
    program = "ponytail" if engine == "podman" else "ponytail-runtime"
    command = path or installed_command(program)
    if command is None:
        raise UsageError(f"cannot find this install's {program} command; pass --path CMD (its absolute path on the host)")
    if not os.path.isabs(command):
        raise UsageError(f"--path {command}: must be an absolute path (the engine runs it from its own directory)")
    settings = Settings(name, command, command, set_as_default)
    edit = plan(engine, config_file, settings, remove=uninstall)
    if dry_run:
        diff = render_diff(edit)
        if not diff:
            return [f"{edit.path}: {'not' if uninstall else 'already'} configured for ponytail; nothing would change"]
        return [diff.rstrip("\n"), *(f"{edit.path}: would: {c}" for c in edit.changes), "dry run: nothing written"]
    return list(apply(engine, edit, uninstall).lines)
