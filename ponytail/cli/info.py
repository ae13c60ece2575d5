"""``ponytail info``: the driver and CUDA version and the GPUs, without click.

A read-only command people and scripts run often (``ponytail info --json`` in a
monitoring loop, say): its plain command line (``info``, ``--json``, ``-config FILE``,
in either spelling and any order) is parsed by ponytail.lite.argv as the hook's is, so it does not
pay for importing click. Help and anything out of the ordinary go to the click
command (ponytail.cli.commands), whose ``info`` ends here too: one implementation, two ways in.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

def parse_info_args(args: list[str]) -> tuple[bool, str | None] | None:
    """(as_json, config) for a plain ``info`` command line, else None (help, an unknown
    or repeated option, a missing value: the click command handles and explains it)."""
    from ponytail.lite.argv import parse_command

    values = parse_command(args, ("info",), {"json": 0, "config": 1})
    if values is None:
        return None
    config = values.get("config")
    return bool(values.get("json")), config if isinstance(config, str) else None


def run_info(as_json: bool, config: str | None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Print the host's driver, CUDA version and GPUs; errors as one line. The exit status."""
    from ponytail.config import config_path, load_config
    from ponytail.errors import PonytailError, ProbeError
    from ponytail.host.cuda import cuda_driver_version, format_cuda_version
    from ponytail.host.driver_search import find_driver_file
    from ponytail.host.probe import probe_gpus

    stdout = stdout or sys.stdout
    try:
        loaded = load_config(*config_path(config))
        found = probe_gpus(loaded)
        try:
            libcuda = find_driver_file(loaded, found.driver_version, "libcuda", "libcuda.so.1").path
        except ProbeError:
            libcuda = None  # no compute libraries: info still shows the GPUs
        asked = cuda_driver_version(loaded.driver_root, libcuda, loaded.cache_dir, loaded.timeout_probe) if libcuda else None
        cuda = format_cuda_version(asked) if asked else None
        notes = found.notes
        if libcuda is None:
            from ponytail.host.driver_files import version_mismatch

            mismatch = version_mismatch(loaded.driver_root, found.driver_version)
            notes += (mismatch,) if mismatch else ()
    except PonytailError as e:
        print(f"ponytail: error: {e.message}", file=stderr or sys.stderr)
        return e.exit_code
    if as_json:
        from ponytail.lite.plainjson import dumps  # json.dumps' bytes, without importing json (re, enum)

        gpus = [
            {
                "index": g.index, "minor": g.minor, "pci_bus_id": g.pci_bus_id, "uuid": g.uuid, "model": g.model,
                "mig_enabled": g.mig_enabled,
                "mig_devices": [{"name": m.name, "gpu_instance": m.gi, "compute_instance": m.ci} for m in g.mig_devices],
            }
            for g in found.gpus
        ]
        trees: list[dict[str, object]] = []
        if loaded.drivers:  # ponytail.host.driver_trees only where trees are registered
            from ponytail.host.driver_trees import trees_json

            trees = trees_json(loaded, found.driver_version)
        document = {"driver_version": found.driver_version, "cuda_version": cuda, "gpus": gpus, "notes": list(notes)}
        stdout.write(dumps({**document, "driver_trees": trees}, indent=2) + "\n")
    else:
        from ponytail.plan.render import render_gpus, render_trees

        stdout.write(render_gpus(found.driver_version, cuda, found.gpus, notes) + render_trees(loaded, found.driver_version))
    return 0
