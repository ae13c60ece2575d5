"""CRI-O's configuration, as its documentation (crio.conf(5), crio.conf.d(5)) defines it, for the tests of what
ponytail writes for CRI-O. No package registry this project reaches has CRI-O, so no test starts one: these
tests read the files CRI-O would read, the way CRI-O reads them. crio.conf first, then every file of
crio.conf.d in lexical order of its name, whatever its suffix (so a backup left there is config too); each
file's keys replace the same keys read before, table by table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def crio_config(state: Path, pause_image: str = "registry.k8s.io/pause:3.10.1") -> str:
    """A crio.conf with every path of its own under ``state`` and runc as its default runtime."""
    return f"""# a CRI-O configuration for ponytail's tests
[crio]
root = "{state}/root"
runroot = "{state}/run"
storage_driver = "vfs"
log_dir = "{state}/logs"

[crio.api]
listen = "{state}/crio.sock"

[crio.runtime]
default_runtime = "runc"
conmon_cgroup = "pod"
cgroup_manager = "cgroupfs"
hooks_dir = ["{state}/hooks.d"]
cdi_spec_dirs = ["{state}/cdi"]

[crio.runtime.runtimes.runc]
runtime_path = "/usr/bin/runc"
runtime_root = "{state}/runc"
monitor_path = "/usr/bin/conmon"

[crio.image]
pause_image = "{pause_image}"
"""


class CrioFiles:
    """``STATE/etc/crio/crio.conf`` (crio_config) and its crio.conf.d, hooks.d and CDI directories."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.config = state / "etc/crio/crio.conf"
        self.drop_ins = self.config.parent / "crio.conf.d"
        self.drop_ins.mkdir(parents=True)
        for name in ("hooks.d", "cdi"):
            (state / name).mkdir()
        self.config.write_text(crio_config(state))

    def effective(self) -> dict[str, Any]:
        """The configuration CRI-O would run with (``crio config`` would print it): merged_config."""
        return merged_config(self.config, self.drop_ins)


def merged_config(config: Path, drop_ins: Path) -> dict[str, Any]:
    """crio.conf, then each file of ``drop_ins`` in name order, later keys over earlier ones, table by table."""
    merged = tomllib.loads(config.read_text())
    if drop_ins.is_dir():
        for path in sorted(p for p in drop_ins.iterdir() if p.is_file()):
            _merge(merged, tomllib.loads(path.read_text()))
    return merged


def _merge(into: dict[str, Any], layer: dict[str, Any]) -> None:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
