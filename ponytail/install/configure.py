"""``ponytail configure``: register ponytail with a container engine by editing the engine's
own configuration, the way its users would by hand.

probe (read the file, refusing what cannot be edited safely; for an uninstall, what the install
recorded) -> plan (an Edit: the new text and each change, from a pure function per engine) ->
apply (a record of the original, kept where no engine reads it (undo.py), then the new text in
one rename). ``--dry-run`` prints the plan as a unified diff. ``--uninstall`` leaves the file
byte for byte as it was, or, where it was changed by hand since, takes out exactly what ponytail
added, and leaves nothing of ponytail's behind.

Engines and what is edited (their records, default files and restart hints: ponytail.engines.registry):
  docker      daemon.json: "runtimes" (and "default-runtime")
  containerd  config.toml (version 2, 3 or 4): a CRI runtime entry (and default_runtime_name)
  crio        a drop-in crio.conf.d/99-ponytail.conf beside crio.conf
  podman      the hooks.d file ponytail.json
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from types import ModuleType

from ponytail.config import CONFIG_ENV_VAR
from ponytail.engines import registry
from ponytail.engines.containerd import dropin, k3s
from ponytail.engines.model import Edit, Settings
from ponytail.errors import UsageError
from ponytail.hooks.command import installed_command, transient_warning
from ponytail.install import files, undo

DEFAULT_STATE_DIR = "/var/lib/ponytail/configure"  # ponytail.install.undo: where no engine reads


@dataclass(frozen=True)
class Written:
    """What configure's apply did to an engine's config (apply.outcome.Outcome is a hook run's)."""

    edit: Edit
    lines: tuple[str, ...]  # what to print


def engine_module(name: str) -> ModuleType:
    """The engine's configure module (ponytail.engines.registry); an unknown name is a UsageError."""
    return registry.engine(name).module()


def plan(engine: str, config_file: str | None, settings: Settings, remove: bool = False, state_dir: str = DEFAULT_STATE_DIR) -> Edit:
    """Read the engine's config (CRI-O: crio.conf checked, its drop-in edited) and plan the edit; an
    uninstall reads what the install recorded too."""
    module = engine_module(engine)
    path = registry.engine(engine).edited_file(os.path.abspath(config_file or registry.engine(engine).config_path), files.read_text)
    text = files.read_text(path)
    if not remove:
        return module.edit(path, text, settings)
    record = undo.read(state_dir, path)
    if record is not None and record.written is not None and text == record.written:
        # the file is what ponytail wrote: the original, byte for byte
        said = "restored the file as it was before ponytail" if record.original is not None else "removed the file (ponytail created it)"
        return Edit(path, text, record.original, (said,))
    added = record.added if record is not None else {}
    planned: Edit = module.edit(path, text, settings, remove=True, added=added)
    if record is None or planned.new_text is None:
        return planned
    if record.original is None:
        # ponytail created it: if nothing but ponytail's entries is in it, it goes again
        written = record.written if record.written is not None else module.edit(path, None, settings).new_text
        if planned.new_text == module.edit(path, written, settings, remove=True, added=added).new_text:
            return Edit(path, text, None, (*planned.changes, "removed the file (ponytail created it)"))
    elif _same_document(record.original, planned.new_text):
        # the same settings as before ponytail, in other whitespace: the original's bytes
        return Edit(path, text, record.original, (*planned.changes, "restored the file as it was before ponytail"))
    return planned


def apply(engine: str, edit: Edit, uninstall: bool = False, state_dir: str = DEFAULT_STATE_DIR) -> Written:
    """Write ``edit`` (nothing when it changes nothing) and keep, or forget, what undoes it; the
    lines saying what was done."""
    restart = registry.engine(engine).restart
    record = undo.read(state_dir, edit.path)
    if not edit.changed:
        state = "not configured for ponytail" if uninstall else "already configured for ponytail"
        lines = [f"{edit.path}: {state}; nothing changed"]
        if uninstall and record is not None:
            lines += [f"removed {gone} (ponytail's record of the file)" for gone in undo.forget(state_dir, record)]
        return Written(edit, tuple(lines))
    files.check_writable(edit.path)
    lines = [f"{edit.path}: {change}" for change in edit.changes]
    if uninstall:
        if edit.new_text is None:
            files.remove(edit.path)
        else:
            files.write_atomically(edit.path, edit.new_text)
        if record is not None:
            undo.forget(state_dir, record)
            directory = record.added.get("directory")
            if edit.new_text is None and isinstance(directory, str) and directory == os.path.dirname(edit.path):
                _remove_empty_directory(directory)  # ponytail made it (crio.conf.d, hooks.d)
    else:
        if record is None:
            record = undo.Record(edit.path, edit.old_text, edit.old_text)
        # changed by hand since ponytail wrote it: the original is no longer the whole story, and
        # an uninstall takes out what ponytail added instead
        written = edit.new_text if record.written == edit.old_text else None
        added = {**edit.added, **record.added}
        if not os.path.isdir(os.path.dirname(edit.path)):
            added.setdefault("directory", os.path.dirname(edit.path))
        saved = undo.write(state_dir, undo.Record(edit.path, record.original, written, added))
        files.write_atomically(edit.path, edit.new_text or "")
        for gone in record.legacy:
            files.remove(gone)
        what = "the file as it was" if record.original is not None else "that there was no such file"
        lines.append(f"{edit.path}: {what} is kept in {saved} (for --uninstall)")
    lines.append(f"restart the engine to apply: {restart}" if not restart.startswith("nothing") else restart)
    return Written(edit, tuple(lines))


def _remove_empty_directory(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass  # something else is in it now: it stays


def _same_document(original: str, text: str) -> bool:
    """The same text, or (daemon.json) the same JSON document in other whitespace."""
    if original == text:
        return True
    try:
        return bool(json.loads(original) == json.loads(text))
    except ValueError:
        return False


def render_diff(edit: Edit) -> str:
    """The edit as a unified diff (``--dry-run``)."""
    if not edit.changed:
        return ""
    old = (edit.old_text or "").splitlines(keepends=True)
    new = (edit.new_text or "").splitlines(keepends=True)
    label_old = edit.path if edit.old_text is not None else "/dev/null"
    label_new = edit.path if edit.new_text is not None else "/dev/null"
    text = "".join(difflib.unified_diff(old, new, label_old, label_new))
    return text if text.endswith("\n") else text + "\n\\ No newline at end of file\n"


def configure(
    engine: str, config_file: str | None, path: str | None, name: str, set_as_default: bool, dry_run: bool, uninstall: bool,
    state_dir: str = DEFAULT_STATE_DIR, drop_in: str | None = None,
) -> list[str]:
    """``ponytail configure``: plan, then print the diff (dry run) or apply; the lines to print."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"--name {name!r}: a runtime name is letters, digits, '-' and '_'")
    program = registry.engine(engine).runs
    command = path or installed_command(program)
    if command is None:
        raise UsageError(f"cannot find this install's {program} command; pass --path CMD (its absolute path on the host)")
    if not os.path.isabs(command):
        raise UsageError(f"--path {command}: must be an absolute path (the engine runs it from its own directory)")
    hook_config = None
    if registry.engine(engine).runs == "ponytail" and os.environ.get(CONFIG_ENV_VAR):  # the hook reads what this shell's ponytail reads
        hook_config = os.path.abspath(os.environ[CONFIG_ENV_VAR])
    settings = Settings(name, command, command, set_as_default, hook_config)
    if registry.engine(engine).drop_ins:
        lines = _containerd_drop_in(config_file, settings, drop_in, dry_run, uninstall, state_dir)
        if lines is not None:
            return lines
    elif drop_in is not None:
        raise UsageError("--drop-in-config: only for containerd (CRI-O's entry is a drop-in already)")
    edit = plan(engine, config_file, settings, remove=uninstall, state_dir=state_dir)
    warning = None if uninstall or dry_run else transient_warning(command)
    warnings = [f"ponytail: warning: {warning}"] if warning and edit.changed else []
    if dry_run:
        diff = render_diff(edit)
        if not diff:
            return [f"{edit.path}: {'not' if uninstall else 'already'} configured for ponytail; nothing would change"]
        return [*warnings, diff.rstrip("\n"), *(f"{edit.path}: would: {c}" for c in edit.changes), "dry run: nothing written"]
    return [*warnings, *apply(engine, edit, uninstall, state_dir).lines]


def _containerd_drop_in(
    config_file: str | None, settings: Settings, wanted: str | None, dry_run: bool, uninstall: bool, state_dir: str
) -> list[str] | None:
    """containerd 2.x with drop-ins (ponytail.engines.containerd.dropin): ponytail's entry in a file of
    its own and, where config.toml imports nothing that covers it, an import there; None: config.toml
    itself is edited (containerd 1.x, or no drop-in directory in use or asked for)."""
    main = os.path.abspath(config_file or registry.engine("containerd").config_path)
    main_text = files.read_text(main)
    if k3s.is_template(main, main_text) or k3s.generated_by(main_text):
        if wanted is not None:
            raise UsageError(f"--drop-in-config: {main} is k3s's; its template takes ponytail's entry (leave out --drop-in-config)")
        return None
    record = undo.read(state_dir, main)
    recorded = record.added.get("drop_in") if record is not None else None
    path = recorded if uninstall and wanted is None and isinstance(recorded, str) else None
    path = path or dropin.drop_in_for(main, main_text, wanted)  # checks that --drop-in-config suits this config
    if path is None:
        return None
    if uninstall:
        edits = [plan("containerd", path, settings, remove=True, state_dir=state_dir)]
        restored = plan("containerd", main, settings, remove=True, state_dir=state_dir) if record is not None else None
        if restored is not None and restored.new_text != (record.original if record is not None else None):
            restored = dropin.main_edit(main, restored.new_text, path, remove=True, added=record.added if record else None)
            restored = Edit(main, main_text, restored.new_text, restored.changes) if restored.changed else restored
        edits += [restored] if restored is not None else []
    else:
        edits = [dropin.main_edit(main, main_text, path), dropin.drop_in_edit(path, files.read_text(path), main_text, settings)]
        if edits[0].changed:
            edits[0] = Edit(main, main_text, edits[0].new_text, edits[0].changes, {**edits[0].added, "drop_in": path})
    if dry_run:
        out = []
        for edit in edits:
            diff = render_diff(edit)
            out += [diff.rstrip("\n"), *(f"{edit.path}: would: {c}" for c in edit.changes)] if diff else [f"{edit.path}: nothing would change"]
        return out + ["dry run: nothing written"]
    lines: list[str] = []
    changing = [edit for edit in edits if edit.changed] or edits[-1:]  # "nothing changed" only when nothing did
    for edit in changing:
        lines += [line for line in apply("containerd", edit, uninstall, state_dir).lines if line not in lines]
    return lines
