"""What ``ponytail configure`` is asked, and the edit it plans for one file (plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field

CONFIG_CHARS = 1 << 20  # the most of an engine's config file read (ponytail.fs.hostfiles.read_head)


@dataclass(frozen=True)
class Settings:
    """``runtime_path``: the ponytail-runtime command (docker, containerd, CRI-O);
    ``hook_path``: the ponytail command (podman's hooks.d file), run with ``-config hook_config``
    when that is set."""

    runtime_name: str = "ponytail"
    runtime_path: str = "/usr/local/bin/ponytail-runtime"
    hook_path: str = "/usr/local/bin/ponytail"
    set_as_default: bool = False
    hook_config: str | None = None


@dataclass(frozen=True)
class Edit:
    """One file's new text (None: remove the file) and each change with its reason; ``added``:
    what ponytail put there beside its own entry, for an uninstall to take out again
    ("runc": the runc runtime it defined; "default": the default runtime it replaced, None: unset)."""

    path: str
    old_text: str | None
    new_text: str | None
    changes: tuple[str, ...]
    added: dict[str, object] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.old_text != self.new_text


@dataclass(frozen=True)
class Registered:
    """What an engine's configuration says of ponytail, read back from the files ``edit()`` writes.

    ``where``: how a finding names the entry ("BinaryName in FILE"); ``program``: the command the
    engine runs (None: ponytail's file is there, but the engine cannot read it); ``hook``: a hooks.d
    file, whose missing command the engine skips silently, rather than a runtime entry."""

    path: str
    where: str
    program: str | None
    hook: bool = False


@dataclass(frozen=True)
class Unregistered:
    """Where an engine's configuration was read and names no ponytail it runs.

    ``what``: what is missing, as a finding says it; ``fix``: the command that registers ponytail when
    it is not ``ponytail configure`` (hooks.d: ``ponytail install-hook``); ``files``: (path, text) of the
    files read, which may name NVIDIA's runtime (then ``ponytail migrate`` is the remedy); ``mentioned``:
    ponytail is named there all the same (set up for it, whether or not that works)."""

    what: str
    fix: str | None = None
    files: tuple[tuple[str, str], ...] = ()
    mentioned: bool = False


def ponytails(program: object) -> bool:
    """A command ponytail installed: its file name says so (ponytail, ponytail-runtime)."""
    return isinstance(program, str) and "ponytail" in program.rsplit("/", 1)[-1]


def lookup(table: object, *keys: str) -> object:
    """``table[k1][k2]...`` of a parsed config, None where a key is missing or a value is not a table."""
    for key in keys:
        if not isinstance(table, dict):
            return None
        table = table.get(key)
    return table

