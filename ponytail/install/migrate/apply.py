"""Apply a migration's plan, and undo it: the only code here that changes files.

A migration is a transaction (journal.py keeps its record): the space it needs is checked first
(statvfs); then every original is saved in STATE/files and made durable, the record written, and
each path changed in one atomic step (a rename, or an unlink), its directory fsynced. An error
puts every path back from its saved copy, and the state directory goes only once all are back.
``undo`` checks that each path holds what the migration left there (or, after an interrupted
run, what was there before) and that each saved copy is the one recorded, before it changes
anything; then it puts each original back by a rename from a link (or a copy) beside it, with the
record's mode, owner and times, and removes the record. A rerun of ``migrate`` after an interrupted
run brings every path forward; ``--undo`` brings every path back.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil

from ponytail.errors import PonytailError
from ponytail.fs.atomic import replace_file, replace_with_symlink, temporary_name, writer_pid
from ponytail.install.migrate import journal
from ponytail.install.migrate.journal import FILES, MIGRATE, RECORD, UNDO, saved_name
from ponytail.install.migrate.nvidia import under
from ponytail.install.migrate.plan import Plan, remedy

DEFAULT_STATE_DIR = "/var/lib/ponytail/migrate"  # where no engine reads


def apply(root: str, state_dir: str, plan: Plan, source: str) -> list[str]:
    doing = "not migrating"
    state = under(root, state_dir)
    with _locked(state, doing):
        if journal.read_record(root, state_dir, doing) is not None:
            raise PonytailError(f"{doing}: {os.path.join(state_dir, RECORD)} records a migration already; undo it first ({UNDO})")
        entries = []
        for step in plan.steps:
            before = journal.describe(under(root, step.path))
            entries.append({"path": step.path, "before": before, "left": journal.left_for(step.data, step.link, before),
                            **({"restore": step.restore} if step.restore else {})})
        record = {"version": journal.VERSION, "from": source, "entries": entries}
        _check_space_to_migrate(root, state, entries, len(str(record)))
        try:
            _save_originals(root, state_dir, entries)
            journal.write_record(state, record)
        except (OSError, PonytailError, KeyboardInterrupt) as e:  # nothing changed yet: no trace of this run either
            shutil.rmtree(state, ignore_errors=True)
            raise _stopped(doing, e, "nothing was changed; ", f"then run {MIGRATE} again") from e
        lines = _forward(root, state_dir, entries, fresh=True)
    lines = [f"{step.path}: {step.why}; {line}" for step, line in zip(plan.steps, lines, strict=True)]
    return lines + [f"undo with: {UNDO} (record: {os.path.join(state_dir, RECORD)})"]


def resume(root: str, state_dir: str, record: dict, dry_run: bool) -> list[str]:
    """``migrate`` over a record: complete a migration (or an undo) that was interrupted; refuse a complete one."""
    doing = "not migrating"
    already = f"{doing}: {os.path.join(state_dir, RECORD)} records a migration already; undo it first ({UNDO})"
    if record.get("version") != journal.VERSION:
        raise PonytailError(already)
    if dry_run:
        if all(s == "left" for s in _states(root, record["entries"], doing)):
            raise PonytailError(already)
        return [f"would complete the migration that was interrupted (record: {os.path.join(state_dir, RECORD)})", "dry run: nothing changed"]
    with _locked(under(root, state_dir), doing):
        record = _reread(root, state_dir, doing)
        if all(s == "left" for s in _states(root, record["entries"], doing, tidy=True)):
            raise PonytailError(already)
        lines = _forward(root, state_dir, record["entries"], fresh=False)
    return [f"{entry['path']}: completing the migration that was interrupted; {line}" for entry, line in zip(record["entries"], lines, strict=True)] + [
        f"undo with: {UNDO} (record: {os.path.join(state_dir, RECORD)})"]


def undo(root: str, state_dir: str, dry_run: bool = False) -> list[str]:
    doing = "not undoing"
    state = under(root, state_dir)
    record = journal.read_record(root, state_dir, doing)
    if record is None:
        return _nothing_to_undo(root, state_dir, dry_run)
    record = journal.upgrade(root, state_dir, record)
    if dry_run:
        entries = record["entries"]
        _verify_copies(root, state_dir, entries, _states(root, entries, doing))
        return [*_undo_lines(root, entries, True), "dry run: nothing changed"]
    with _locked(state, doing):
        record = journal.upgrade(root, state_dir, _reread(root, state_dir, doing))
        entries = record["entries"]
        states = _states(root, entries, doing, tidy=True)
        _verify_copies(root, state_dir, entries, states)
        _check_space_to_undo(root, state, entries, states)
        lines = _undo_lines(root, entries, False)
        try:
            for entry, now in zip(reversed(entries), reversed(states), strict=True):
                if now == "left":
                    _put_back(root, state, entry)
            os.unlink(os.path.join(state, RECORD))  # every original is back, and durable: the record can go
            _fsync_dir(state)
        except (OSError, PonytailError, KeyboardInterrupt) as e:
            raise _stopped(doing, e, "the record keeps every original; ", f"run {UNDO} again") from e
        shutil.rmtree(state, ignore_errors=True)
    lines.append(f"removed {state_dir}")
    _remove_if_empty(os.path.dirname(state))  # /var/lib/ponytail, when nothing else of ponytail's is in it
    return lines


def _nothing_to_undo(root: str, state_dir: str, dry_run: bool) -> list[str]:
    state = under(root, state_dir)
    if not os.path.isdir(state):
        if not dry_run:
            _remove_if_empty(os.path.dirname(state))  # a migration killed as it began made it
        raise PonytailError(f"nothing to undo: no migration is recorded in {state_dir}")
    # a run stopped before its record was written, or an undo after it removed the record: nothing of it is in use
    if not dry_run:
        with _locked(state, "not undoing"):
            shutil.rmtree(state, ignore_errors=True)
        _remove_if_empty(os.path.dirname(state))
    return [f"nothing to undo: no migration is recorded in {state_dir}; {'would remove' if dry_run else 'removed'} what an interrupted run left there"]


def _reread(root: str, state_dir: str, doing: str) -> dict:
    record = journal.read_record(root, state_dir, doing)
    if record is None:
        raise PonytailError(f"{doing}: the migration's record went away meanwhile (another run?); run the command again")
    return record


def _undo_lines(root: str, entries: list[dict], dry_run: bool) -> list[str]:
    lines = []
    for entry in reversed(entries):
        if journal.holds(under(root, entry["path"]), entry["before"]):
            lines.append(f"{entry['path']} is as it was already")
        elif entry["before"]["kind"] != "nothing":
            lines.append(f"{'would put' if dry_run else 'put'} {entry['path']} back as it was")
        else:
            lines.append(f"{'would remove' if dry_run else 'removed'} {entry['path']} (ponytail's; there was none)")
    return lines


def _states(root: str, entries: list[dict], doing: str, tidy: bool = False) -> list[str]:
    """For each entry, 'before' (as it was) or 'left' (as the migration left it); PonytailError
    naming the first path that is neither (changed since), before anything changes. ``tidy``: the
    temporary files a killed run left beside them are removed first."""
    states = []
    for entry in entries:
        full = under(root, entry["path"])
        if tidy:
            _tidy(full)
        if journal.holds(full, entry["left"]):
            states.append("left")
        elif journal.holds(full, entry["before"]):
            states.append("before")
        else:
            what = "was removed or replaced" if entry["left"]["kind"] == "file" and not os.path.isfile(full) else "was changed"
            if entry["left"]["kind"] == "link":
                what = "was changed (it is no longer ponytail's link)"
            elif entry["left"]["kind"] == "nothing":
                what = "was created"
            raise PonytailError(f"{doing}: {entry['path']} {what} since the migration; {remedy(root, entry)}, "
                                "then run the command again; nothing was changed")
    return states


def _verify_copies(root: str, state_dir: str, entries: list[dict], states: list[str]) -> None:
    """Every saved copy undo will put back is the one recorded (its SHA-256), before anything changes."""
    files = os.open(os.path.join(under(root, state_dir), FILES), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for entry, now in zip(entries, states, strict=True):
            if now == "left" and entry["before"]["kind"] == "file":
                _verify_copy(files, state_dir, entry)
    finally:
        os.close(files)


def _verify_copy(files: int, state_dir: str, entry: dict) -> None:
    before = entry["before"]
    copy = os.path.join(state_dir, FILES, saved_name(entry["path"]))
    try:
        digest, size = journal.file_digest(saved_name(entry["path"]), dir_fd=files)
    except OSError as e:
        why = f"cannot be read ({e.strerror})"
    else:
        if digest == before["sha256"]:
            return
        why = f"is not what was saved ({size} bytes, SHA-256 {digest[:12]}...; {before['size']} bytes, {before['sha256'][:12]}... recorded)"
    raise PonytailError(f"not undoing: the saved original of {entry['path']} ({copy}) {why}; nothing was changed; put "
                            f"{entry['path']}'s original there by hand (e.g. reinstall nvidia-container-toolkit's package), then run {UNDO} again")


def _forward(root: str, state_dir: str, entries: list[dict], fresh: bool) -> list[str]:
    """Every path as the migration leaves it; on an error, a fresh run puts every path back (and then
    goes), a resumed one stops, its record kept. A line for each entry."""
    doing = "not migrating"
    states = _states(root, entries, doing, tidy=True)
    if any(e["left"]["kind"] == "file" and e["left"].get("data") is None for e in entries):
        raise PonytailError(f"{doing}: the record was written by an earlier release, which cannot complete it; run {UNDO}")
    lines, at = [], ""
    try:
        for entry, now in zip(entries, states, strict=True):
            at = entry["path"]
            if now == "before":
                _bring_forward(under(root, entry["path"]), entry["left"])
            else:
                _fsync_dir(os.path.dirname(under(root, entry["path"])))
            kept = (f"kept in {os.path.join(state_dir, FILES, saved_name(entry['path']))}" if entry["before"]["kind"] == "file"
                    else f"it was a link to {entry['before']['target']}" if entry["before"]["kind"] == "link" else "there was none")
            lines.append(f"now {_leaves(entry['left'])} ({kept})")
    except (OSError, PonytailError, KeyboardInterrupt) as e:
        if not fresh:
            raise _stopped(doing, e, f"stopped at {at}; the record keeps every original; ",
                           f"run {MIGRATE} again to complete it, or {UNDO}") from e
        state = under(root, state_dir)
        try:
            for entry in reversed(entries):
                _tidy(under(root, entry["path"]), ours=True)  # what this run was writing when it stopped
                _put_back(root, state, entry, when_left_only=True)
        except (OSError, PonytailError, KeyboardInterrupt) as again:
            raise _stopped(doing, e, f"stopped at {at}, and putting the originals back failed too ({_why(again)}); "
                           f"the record in {state_dir} keeps every original; ", f"run {UNDO}") from e
        shutil.rmtree(state, ignore_errors=True)
        raise _stopped("migration stopped and rolled back", e, "every file is as it was; ", f"then run {MIGRATE} again") from e
    return lines


def _leaves(left: dict) -> str:
    return f"a link to {left['target']}" if left["kind"] == "link" else "ponytail's file" if left["kind"] == "file" else "nothing"


def _bring_forward(full: str, left: dict) -> None:
    directory = os.path.dirname(full)
    if left["kind"] == "link":
        replace_with_symlink(left["target"], full)
        _fsync_dir(directory)
    elif left["kind"] == "file":
        os.makedirs(directory, exist_ok=True)
        owner = (left["uid"], left["gid"]) if "uid" in left else None
        try:
            replace_file(full, journal.left_data(left), left["mode"], owner=owner)
        except OSError as e:
            raise OSError(e.errno, e.strerror, e.filename or full) from e
    else:
        os.unlink(full)
        _fsync_dir(directory)


def _put_back(root: str, state: str, entry: dict, when_left_only: bool = False) -> None:
    """The original of ``entry`` back at its path, in one rename, with the record's mode, owner and times."""
    full = under(root, entry["path"])
    if when_left_only and not journal.holds(full, entry["left"]):
        return  # as it was (never changed)
    before, directory = entry["before"], os.path.dirname(full)
    if before["kind"] == "nothing":
        if os.path.lexists(full):
            os.unlink(full)
    elif before["kind"] == "link":
        replace_with_symlink(before["target"], full)
        os.chown(full, before["uid"], before["gid"], follow_symlinks=False)
    else:
        beside = os.path.join(directory, temporary_name(os.path.basename(full)))
        saved = os.path.join(state, FILES, saved_name(entry["path"]))
        try:
            _link_or_copy(saved, beside, before)
            os.chown(beside, before["uid"], before["gid"], follow_symlinks=False)
            os.chmod(beside, before["mode"], follow_symlinks=False)
            os.utime(beside, ns=(before["atime_ns"], before["mtime_ns"]), follow_symlinks=False)
            _fsync_file(beside)
            os.rename(beside, full)
        except BaseException:
            _remove_quietly(beside)
            raise
    _fsync_dir(directory)


def _save_originals(root: str, state_dir: str, entries: list[dict]) -> None:
    """Each original file in STATE/files (a hard link where it can be: the same inode, no space taken;
    else a copy), checked against its digest and durable, before the first change."""
    state = under(root, state_dir)
    files = os.path.join(state, FILES)
    os.makedirs(os.path.dirname(state), mode=0o755, exist_ok=True)
    for directory in (state, files):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    journal.check_store(root, state_dir, "not migrating")
    for name in os.listdir(files):  # what a run stopped before its record left: never in use
        os.unlink(os.path.join(files, name))
    for entry in entries:
        before = entry["before"]
        if before["kind"] != "file":
            continue
        saved = os.path.join(files, saved_name(entry["path"]))
        _link_or_copy(under(root, entry["path"]), saved, before)
        _fsync_file(saved)
    _fsync_dir(files)
    _fsync_dir(state)
    _fsync_dir(os.path.dirname(state))


def _link_or_copy(source: str, target: str, before: dict) -> None:
    """``target`` a new name of the file ``source`` (else a copy of it: another file system), whose
    SHA-256 must be the recorded one."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.EACCES):
            raise
        _copy(source, target)
    digest, size = journal.file_digest(target)
    if digest != before["sha256"]:
        _remove_quietly(target)
        raise PonytailError(f"{source} changed while it was being saved ({size} bytes now); run the command again")


def _copy(source: str, target: str) -> None:
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while chunk := os.read(src, 1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view):]
            os.fsync(dst)
        except BaseException:
            os.close(dst)
            _remove_quietly(target)
            raise
        os.close(dst)
    finally:
        os.close(src)


def _check_space_to_migrate(root: str, state: str, entries: list[dict], record_size: int) -> None:
    needs: dict[str, tuple[int, int]] = {}

    def add(directory: str, size: int) -> None:
        directory = _existing(directory)
        old = needs.get(directory, (0, 0))
        needs[directory] = (old[0] + journal.rounded(size), old[1] + 1)

    add(state, 2 * record_size)  # the record and its temporary file
    state_dev = os.stat(_existing(state)).st_dev
    for entry in entries:
        full, before, left = under(root, entry["path"]), entry["before"], entry["left"]
        if before["kind"] == "file" and os.stat(os.path.dirname(full)).st_dev != state_dev:
            add(state, before["size"])  # a copy: another file system than the state directory's
        if left["kind"] == "file":
            add(os.path.dirname(full), len(left["data"]) * 3 // 4)
    journal.check_space(needs, "not migrating", f"run {MIGRATE} again")


def _check_space_to_undo(root: str, state: str, entries: list[dict], states: list[str]) -> None:
    needs: dict[str, tuple[int, int]] = {}
    try:
        files_dev = os.stat(os.path.join(state, FILES)).st_dev
    except FileNotFoundError:
        files_dev = -1  # no originals kept: none to copy (a saved copy missing is refused before)
    for entry, now in zip(entries, states, strict=True):
        directory = os.path.dirname(under(root, entry["path"]))
        if now == "left" and entry["before"]["kind"] == "file" and os.stat(directory).st_dev != files_dev:
            old = needs.get(directory, (0, 0))
            needs[directory] = (old[0] + journal.rounded(entry["before"]["size"]), old[1] + 1)
    journal.check_space(needs, "not undoing", f"run {UNDO} again")


def _existing(path: str) -> str:
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


def _stopped(doing: str, e: BaseException, said: str, then: str) -> PonytailError:
    return PonytailError(f"{doing}: {_why(e)}; {said}{then}")


def _why(e: BaseException) -> str:
    if isinstance(e, PonytailError):
        return e.message
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    if isinstance(e, OSError):
        return f"{e.filename}: {e.strerror}" if e.filename else str(e.strerror or e)
    return str(e)


def _tidy(full: str, ours: bool = False) -> None:
    """The temporary files a killed run left beside ``full`` (replace_file's, undo's), when their writer is
    gone (``ours``: or is this process, stopped in the middle of a step)."""
    directory, name = os.path.split(full)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for other in names:
        pid = writer_pid(other) if other.startswith(f".{name}.") else None
        if pid is not None and ((ours and pid == os.getpid()) or not _alive(pid)):
            _remove_quietly(os.path.join(directory, other))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _locked(state: str, doing: str) -> _Lock:
    return _Lock(os.path.dirname(state), doing)


class _Lock:
    """An exclusive flock on the state directory's parent for the whole run (another migrate or undo at
    the same time is refused with one line)."""

    def __init__(self, directory: str, doing: str) -> None:
        self.directory, self.doing, self.fd, self.made = directory, doing, -1, False

    def __enter__(self) -> _Lock:
        self.made = not os.path.isdir(self.directory)
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        self.fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise PonytailError(f"{self.doing}: another ponytail migrate is running ({self.directory} is locked); "
                                "wait for it to finish, then run the command again") from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.close(self.fd)
        if self.made:  # made for this run, which left nothing in it (refused before it began)
            _remove_if_empty(self.directory)


def _fsync_dir(directory: str) -> None:
    _fsync(directory, os.O_DIRECTORY)


def _fsync_file(path: str) -> None:
    _fsync(path, os.O_NOFOLLOW | os.O_NONBLOCK)


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from e
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass


