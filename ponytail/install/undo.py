"""What ``ponytail configure`` changed in an engine's config, kept where no engine reads it.

One JSON record per config file in the state directory (default /var/lib/ponytail/configure,
outside every engine's config and drop-in directory: CRI-O reads every file of crio.conf.d,
whatever its name): the file as it was before ponytail (or that there was none), the text
ponytail last wrote, and what it added beside its own entry (a runc table, the default runtime
it replaced). ``--uninstall`` puts the original back byte for byte when the file is still what
ponytail wrote, else takes out exactly what ponytail added, and then forgets the record.

The records decide what ``--uninstall`` writes into root's engine config, so they are held to
the caches' rule (ponytail.fs.trust): the state directory must be a real directory (no link)
owned by root (or the user running ponytail) that group and others cannot write, and each
record a regular file of that owner that group and others can neither read nor write (no link,
no FIFO); anything else is refused with one line before anything is read or written.

Releases before this one kept FILE.ponytail-backup and FILE.ponytail-created beside the file;
they are read as a record (their original, nothing known of what was written) and removed at
uninstall.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from urllib.parse import quote

from ponytail.errors import ConfigError, InjectionError, os_failure
from ponytail.fs.trust import Untrusted, read_private_file, untrusted_store
from ponytail.install import files

LEGACY_BACKUP = ".ponytail-backup"
LEGACY_CREATED = ".ponytail-created"


@dataclass(frozen=True)
class Record:
    """``original``: the file before ponytail (None: there was none); ``written``: what ponytail
    wrote last (None: unknown, or changed by hand since); ``added``: what else it added."""

    path: str
    original: str | None
    written: str | None
    added: dict[str, object] = field(default_factory=dict)
    legacy: tuple[str, ...] = ()  # FILE.ponytail-backup / -created of an older release


def record_path(state_dir: str, path: str) -> str:
    return os.path.join(state_dir, quote(path, safe="") + ".json")


def check_state_dir(state_dir: str) -> bool:
    """Whether the state directory exists; ConfigError when it is there but not root's alone
    (a link, not a directory, another owner, writable by group or others: a sticky 1777 one too)."""
    st = files.lstat_or_none(state_dir, f"cannot examine configure's state directory {state_dir}")
    if st is None:
        return False
    why = untrusted_store(st)
    if why is not None:
        raise ConfigError(
            f"configure's state directory {state_dir} is {why}: its records decide what --uninstall writes into the "
            "engine's config, so it must be a directory only root can change (chown root:root, chmod 0700), or pass --state-dir DIR"
        )
    return True


def read(state_dir: str, path: str) -> Record | None:
    """The record for the config file ``path``, else what an older release left beside it."""
    where = record_path(state_dir, path)
    text = _read_record(state_dir, where)
    legacy = tuple(p for p in (path + LEGACY_BACKUP, path + LEGACY_CREATED) if os.path.lexists(p))
    if text is not None:
        try:
            data = json.loads(text)
            original, written, added = data["original"], data["written"], data["added"]
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{where} is not a record ponytail wrote ({e}); remove it, then configure again") from e
        return Record(path, original, written, dict(added), legacy)
    if not legacy:
        return None
    backup = files.read_text(path + LEGACY_BACKUP) if os.path.lexists(path + LEGACY_BACKUP) else None
    return Record(path, backup, None, {}, legacy)


def _read_record(state_dir: str, where: str) -> str | None:
    """The record's text, None when there is none; ConfigError when the directory or the file
    may be someone else's doing."""
    if not check_state_dir(state_dir):
        return None
    try:
        raw = read_private_file(state_dir, os.path.basename(where), files.MAX_BYTES)
    except Untrusted as e:
        raise ConfigError(
            f"configure's record {e} (only a regular file of root's that no one else may read or write is believed); "
            "remove it, then configure again"
        ) from None
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not a record ponytail wrote (not UTF-8); remove it, then configure again") from None


def write(state_dir: str, record: Record) -> str:
    """Save ``record`` (before the config file is changed, so a crash between the two loses nothing)."""
    where = record_path(state_dir, record.path)
    text = json.dumps({"path": record.path, "original": record.original, "written": record.written, "added": record.added},
                      indent=1) + "\n"
    if not check_state_dir(state_dir):
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
        except OSError as e:
            raise os_failure(f"cannot make the state directory {state_dir}", e, InjectionError) from e
        check_state_dir(state_dir)
    files.write_atomically(where, text, new_mode=0o600)  # a config may hold secrets
    return where


def forget(state_dir: str, record: Record) -> list[str]:
    """Remove the record and an older release's files; the paths removed."""
    check_state_dir(state_dir)
    gone = []
    for path in (record_path(state_dir, record.path), *record.legacy):
        if os.path.lexists(path):
            files.remove(path)
            gone.append(path)
    try:
        os.rmdir(state_dir)  # the last record gone: nothing of ponytail's is left
    except OSError:
        pass
    return gone
