"""What ``ponytail configure`` is asked, and the edit it plans for one file (plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
