"""How much ponytail adds to a container start: `runc run` of a busybox container that runs
/bin/true, timed from the command's start to its exit, median of N runs each:

  plain runc                        no hook
  runc + ponytail prestart hook     NVIDIA_VISIBLE_DEVICES=0: nodes, libraries, nvidia-smi,
                                    ldconfig, device cgroup
  ponytail-runtime -> runc          the Docker shim passing a non-GPU container through

Every run gets a fresh copy of the rootfs (made outside the timing) and its own container
id; the variants alternate so that drift hits them alike. With a loaded NVIDIA driver the
real one is injected; otherwise a simulated driver tree (tests/support/fakehost.py) stands in,
which has the same files, nodes and ldconfig work but no GPU behind the nodes.

    sudo .venv/bin/python bench/runc_start.py [--runs 21]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.fakehost import FakeHost, gpus, make_rootfs  # noqa: E402

BIN = Path(sys.executable).parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21, help="runs per variant (default 21)")
    runs = parser.parse_args().runs
    for script in ("ponytail", "ponytail-runtime"):
        if not (BIN / script).exists():
            print(f"{BIN / script} is missing: run 'make setup' first", file=sys.stderr)
            return 2
    work = Path(tempfile.mkdtemp(prefix="ponytail-bench-"))
    try:
        config, driver = _config(work)
        template = make_rootfs(work / "template")
        hook = {"prestart": [{"path": str(BIN / "ponytail"), "args": ["ponytail", "-config", str(config)]}]}
        variants = {
            "plain runc": (["runc"], None, []),
            "runc + ponytail prestart hook": (["runc"], hook, ["NVIDIA_VISIBLE_DEVICES=0"]),
            "ponytail-runtime -> runc (non-GPU)": ([str(BIN / "ponytail-runtime")], None, []),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(runs):
            for name, (runtime, hooks, env) in variants.items():
                bundle = _bundle(work / f"run-{i}-{len(times[name])}-{uuid.uuid4().hex[:6]}", template, hooks, env)
                times[name].append(_timed_run(runtime, bundle, config))
                shutil.rmtree(bundle)
        print(f"container start+exit (runc run, /bin/true), {runs} runs each, driver: {driver}")
        base = statistics.median(times["plain runc"])
        for name, values in times.items():
            median = statistics.median(values)
            extra = f"  (+{median - base:.1f} ms)" if name != "plain runc" else ""
            print(f"  {name:36s} median {median:6.1f} ms  min {min(values):6.1f}  max {max(values):6.1f}{extra}")
        injected = re.findall(r"injected into \S+: (.*); ([0-9.]+) ms$", (work / "ponytail.log").read_text(), re.M)
        own = [float(ms) for _, ms in injected]
        print(f"  the hook's own work, from its log lines: median {statistics.median(own):.1f} ms ({len(own)} runs)")
        print(f"  what it injected each time: {injected[-1][0]}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _config(work: Path) -> tuple[Path, str]:
    if Path("/proc/driver/nvidia/version").exists():
        config = work / "config.toml"
        config.write_text(f'[log]\nfile = "{work}/ponytail.log"\n')
        return config, "the real NVIDIA driver of this machine"
    host = FakeHost(work / "host", gpu_list=gpus(2))
    host.log = work / "ponytail.log"
    return host.write_config(), "SIMULATED (no NVIDIA driver on this machine; tests/support/fakehost.py)"


def _bundle(bundle: Path, template: Path, hooks: dict | None, env: list[str]) -> Path:
    bundle.mkdir(parents=True)
    shutil.copytree(template, bundle / "rootfs", symlinks=True)
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"].update(terminal=False, args=["/bin/true"])
    spec["process"]["env"] += env
    if hooks:
        spec["hooks"] = hooks
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def _timed_run(runtime: list[str], bundle: Path, config: Path) -> float:
    container_id = f"ponytail-bench-{uuid.uuid4().hex[:12]}"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PONYTAIL_CONFIG": str(config)}
    start = time.perf_counter()
    result = subprocess.run([*runtime, "run", "--bundle", str(bundle), container_id], capture_output=True, env=env)
    elapsed = (time.perf_counter() - start) * 1000.0
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(runtime)} run failed: {result.stderr.decode().strip()}")
    return elapsed


if __name__ == "__main__":
    raise SystemExit(main())
