"""The migration's plan: for each path NVIDIA's toolkit has, what ponytail leaves there (plain data).

Every path the migration touches is moved aside whole (its bytes, mode, owner and times kept in the
state directory) and then holds ponytail's replacement or nothing:
  NVIDIA's CDI specs       -> ponytail's spec of nvidia.com/gpu at the first one's path, the others gone
  engine entries           -> the same file, its entries running ponytail-runtime instead of
                              nvidia-container-runtime (their names kept: --runtime nvidia, RuntimeClass nvidia)
  hook binaries on PATH    -> a link to ponytail where ponytail answers to the name (nvidia-container-runtime-hook),
                              ponytail's hook script for nvidia-cdi-hook (the specs other node daemons write name it),
                              else nothing
  its config               -> nothing (ponytail reads /etc/ponytail/config.toml)
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ponytail.engines.migrate.nvidia import SERVED, Toolkit, replace_runtime, under
from ponytail.errors import PonytailError


@dataclass(frozen=True)
class Step:
    path: str  # on the node
    why: str
    data: bytes | None = None  # the file ponytail leaves there
    link: str | None = None  # or the link it leaves there (neither: nothing)

    @property
    def leaves(self) -> str:
        if self.link is not None:
            return f"a link to {self.link}"
        return "ponytail's file" if self.data is not None else "nothing"


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    notes: tuple[str, ...]  # what the migration cannot do itself


def make_plan(root: str, toolkit: Toolkit, ponytail: str, runtime: str, spec_files: dict[str, bytes]) -> Plan:
    """``spec_files``: ponytail's CDI spec(s) by path, written where NVIDIA's first spec was."""
    steps: list[Step] = []
    for path in toolkit.specs:
        steps.append(Step(path, "NVIDIA's CDI spec (nvidia-ctk's): one generator per kind, ponytail's replaces it", spec_files.get(path)))
    steps += [Step(path, "ponytail's spec of an opt-in feature", data) for path, data in spec_files.items() if path not in toolkit.specs]
    for path in toolkit.engine_files:
        text = _read_text(under(root, path))
        steps.append(Step(path, "its runtime entries run ponytail-runtime instead of nvidia-container-runtime (their names kept)",
                          replace_runtime(text, runtime).encode()))
    for path in toolkit.binaries:
        served = SERVED.get(os.path.basename(path))
        if served == "link":
            steps.append(Step(path, "NVIDIA's hook on the engines' PATH: ponytail answers to its name", link=ponytail))
        elif served == "script":
            from ponytail.engines.cdi.nvidiainstall import script

            steps.append(Step(path, "NVIDIA's CDI hook on the engines' PATH: ponytail's hook script, for the specs the device "
                                    "plugin and the DRA driver write", data=script(ponytail)))
        else:
            steps.append(Step(path, "NVIDIA's program on the engines' PATH"))
    if toolkit.config is not None:
        steps.append(Step(toolkit.config, "NVIDIA's runtime config (ponytail reads /etc/ponytail/config.toml; docs/migration.md maps the keys)"))
    notes = []
    if toolkit.refresh_units:
        notes.append(f"NVIDIA's {', '.join(toolkit.refresh_units)} regenerates its CDI spec on driver changes (a second spec of "
                     "nvidia.com/gpu again): systemctl disable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service")
    for hook in toolkit.oci_hooks:
        notes.append(f"NVIDIA's {hook} (podman's hook mode) is left in place: it runs nvidia-container-runtime-hook, "
                     "which is ponytail's link now, so podman's GPU containers of that mode go through ponytail")
    if toolkit.binaries:
        notes.append("a package upgrade of nvidia-container-toolkit puts its programs back: hold or remove the packages "
                     "(apt-mark hold nvidia-container-toolkit nvidia-container-toolkit-base)")
    for step in steps:
        refuse_what_cannot_be_undone(root, step.path)
    return Plan(tuple(steps), tuple(notes))


def refuse_what_cannot_be_undone(root: str, path: str) -> None:
    """One line, before anything changes, for a path whose state a migration could not give back:
    not a regular file or a link, or in a directory it cannot write."""
    full = under(root, path)
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        st = None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise PonytailError(f"not migrating: {path} is not a regular file or a link, which could not be put back as it was; move it by hand")
    directory = os.path.dirname(full)
    if not os.access(directory, os.W_OK) or os.statvfs(directory).f_flag & os.ST_RDONLY:
        raise PonytailError(f"not migrating: {os.path.dirname(path)} cannot be written (read-only), so {path} could not be put back")


def _read_text(path: str) -> str:
    from ponytail.engines.configure.files import read_text

    text = read_text(path)  # a symlink, a non-UTF-8 or huge file is refused with one line
    return text or ""
