"""Apply a migration's plan, and undo it: the only code here that changes files.

The record (STATE/record.json, written before the first change) lists each path, whether it had a
file or link (kept as STATE/files/<path, quoted>, a copy with its mode, owner and times) and what
ponytail left there (a file by its SHA-256, a link by its target, or nothing). ``undo`` first checks
that every path still holds what ponytail left, and refuses with one line naming the first that does
not; then it puts each original back by a rename from a copy beside it (a reader sees the old file
or the new one) and removes the record.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from urllib.parse import quote

from ponytail.engines.migrate.nvidia import under
from ponytail.errors import PonytailError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ponytail.engines.migrate.plan import Plan, Step

DEFAULT_STATE_DIR = "/var/lib/ponytail/migrate"  # where no engine reads
RECORD = "record.json"


def record_path(root: str, state_dir: str) -> str:
    return os.path.join(under(root, state_dir), RECORD)


def apply(root: str, state_dir: str, plan: Plan, source: str) -> list[str]:
    state = under(root, state_dir)
    if os.path.lexists(os.path.join(state, RECORD)):
        raise PonytailError(f"not migrating: {os.path.join(state_dir, RECORD)} records a migration already; "
                            "undo it first (ponytail migrate --from nvidia --undo)")
    entries: list[dict] = []
    for step in plan.steps:
        had = os.path.lexists(under(root, step.path))
        left: dict[str, str] = {"kind": "nothing"}
        if step.link is not None:
            left = {"kind": "link", "target": step.link}
        elif step.data is not None:
            left = {"kind": "file", "sha256": hashlib.sha256(step.data).hexdigest()}
        entries.append({"path": step.path, "saved": _saved_name(step.path) if had else None, "left": left,
                        **({"restore": step.restore} if step.restore else {})})
    os.makedirs(os.path.join(state, "files"), mode=0o700, exist_ok=True)
    _write_record(state, {"from": source, "entries": entries})
    lines: list[str] = []
    done: list[dict] = []
    try:
        for step, entry in zip(plan.steps, entries, strict=True):
            _apply_step(root, state, step, entry)
            done.append(entry)
            kept = f"kept in {os.path.join(state_dir, 'files', entry['saved'])}" if entry["saved"] else "there was none"
            lines.append(f"{step.path}: {step.why}; now {step.leaves} ({kept})")
    except OSError as e:
        for entry in reversed(done):  # back to where it started: nothing half-migrated
            _restore(root, state, entry)
        shutil.rmtree(state, ignore_errors=True)
        raise PonytailError(f"migration stopped and rolled back: {e.filename or ''}: {e.strerror}") from e
    lines.append(f"undo with: ponytail migrate --from {source} --undo (record: {os.path.join(state_dir, RECORD)})")
    return lines


def _apply_step(root: str, state: str, step: Step, entry: dict) -> None:
    full = under(root, step.path)
    if entry["saved"] is not None:
        _copy_exactly(full, os.path.join(state, "files", entry["saved"]))
    if step.link is not None:
        from ponytail.fs.atomic import replace_with_symlink

        replace_with_symlink(step.link, full)
    elif step.data is not None:
        _write(full, step.data, keep_from=full if entry["saved"] else None)
    elif entry["saved"] is not None:
        os.unlink(full)


def _restore(root: str, state: str, entry: dict) -> None:
    full = under(root, entry["path"])
    if entry["saved"] is not None:
        _put_back(os.path.join(state, "files", entry["saved"]), full)
    elif os.path.lexists(full):
        os.unlink(full)


def undo(root: str, state_dir: str, dry_run: bool = False) -> list[str]:
    state = under(root, state_dir)
    record = _read_record(state, state_dir)
    entries = record["entries"]
    for entry in entries:
        problem = _not_as_left(under(root, entry["path"]), entry["left"])
        if problem is not None:
            from ponytail.engines.migrate.plan import remedy

            raise PonytailError(f"not undoing: {entry['path']} {problem} since the migration; {remedy(root, entry)}, "
                                "then undo again; nothing was changed")
    lines = []
    for entry in reversed(entries):
        if entry["saved"] is not None:
            lines.append(f"{'would put' if dry_run else 'put'} {entry['path']} back as it was")
        else:
            lines.append(f"{'would remove' if dry_run else 'removed'} {entry['path']} (ponytail's; there was none)")
        if not dry_run:
            _restore(root, state, entry)
    if not dry_run:
        shutil.rmtree(state)
        lines.append(f"removed {state_dir}")
        try:
            os.rmdir(os.path.dirname(state))  # /var/lib/ponytail, when nothing else of ponytail's is in it
        except OSError:
            pass
    else:
        lines.append("dry run: nothing changed")
    return lines


def _saved_name(path: str) -> str:
    return quote(path, safe="")


def _write_record(state: str, record: dict) -> None:
    from ponytail.fs.atomic import replace_file

    replace_file(os.path.join(state, RECORD), (json.dumps(record, indent=1) + "\n").encode(), 0o600)


def _read_record(state: str, state_dir: str) -> dict:
    try:
        with open(os.path.join(state, RECORD), "rb") as f:
            record = json.loads(f.read())
        if not isinstance(record, dict) or not isinstance(record.get("entries"), list):
            raise ValueError("no entries")
    except FileNotFoundError as e:
        raise PonytailError(f"nothing to undo: no migration is recorded in {state_dir}") from e
    except (OSError, ValueError) as e:
        raise PonytailError(f"{os.path.join(state_dir, RECORD)} is not a migration record ponytail wrote ({e}); undo by hand") from e
    return record


def _not_as_left(path: str, left: dict) -> str | None:
    """What is wrong with ``path`` against what the migration left there (None: as left)."""
    kind = left.get("kind")
    if kind == "nothing":
        return "was created" if os.path.lexists(path) else None
    if kind == "link":
        if not os.path.islink(path) or os.readlink(path) != left.get("target"):
            return "was changed (it is no longer ponytail's link)"
        return None
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "was removed or replaced"
    return None if digest == left.get("sha256") else "was changed"


def _copy_exactly(source: str, target: str) -> None:
    """A copy of ``source`` (a file or a link) with its mode, owner and times."""
    if os.path.lexists(target):
        os.unlink(target)
    shutil.copy2(source, target, follow_symlinks=False)
    st = os.lstat(source)
    os.lchown(target, st.st_uid, st.st_gid)


def _put_back(saved: str, path: str) -> None:
    """``saved`` back at ``path`` in one rename (a copy beside ``path`` first: another file system)."""
    from ponytail.fs.atomic import temporary_name

    os.makedirs(os.path.dirname(path), exist_ok=True)
    beside = os.path.join(os.path.dirname(path), temporary_name(os.path.basename(path)))
    _copy_exactly(saved, beside)
    os.rename(beside, path)


def _write(path: str, data: bytes, keep_from: str | None) -> None:
    from ponytail.fs.atomic import replace_file

    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, data, 0o644, keep_mode=keep_from is not None, keep_owner=keep_from is not None)
