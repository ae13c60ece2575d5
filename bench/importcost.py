#!/usr/bin/env python3
"""What each of ponytail's stand-ins for a standard module saves on a hook's start.

    python3 bench/importcost.py [--runs N]

Each case runs in a fresh interpreter (this one, ``-I`` plus ponytail's source on the
path) that has first imported, untimed, the standard modules a hook run imports anyway
(``ALREADY``), so that only what the case adds counts; it reports the CPU time it spent
from just before the case's first import to the end
(CPU time, not wall time: on a machine shared with other work the wall time mostly
measures the wait for a core); the cases run interleaved. Printed: the median of
each, and what the stand-in saves against its standard equivalent (ponytail/lite/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = (REPO / "config" / "config.toml").read_text()
CLASSES = 34  # ponytail's record classes
# what a warm hook run imports anyway (the probe cache hit: no glob; plain JSON: no json, re or enum)
BASE = "import operator, struct, ctypes, bisect, select"
ALREADY = BASE + "\n"
# an OCI state and a config.json as runc writes them (`runc spec`, two GPUs asked for)
STATE = json.dumps({"ociVersion": "1.0.2", "id": "c" * 64, "status": "created", "pid": 4242, "bundle": "/run/b/" + "c" * 64})
SPEC = json.dumps({
    "ociVersion": "1.0.2",
    "process": {
        "terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["sh"], "cwd": "/",
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm",
                "NVIDIA_VISIBLE_DEVICES=0,1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471"],
        "capabilities": {k: ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
                         for k in ("bounding", "effective", "permitted", "ambient")},
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}], "noNewPrivileges": True,
    },
    "root": {"path": "rootfs", "readonly": True}, "hostname": "runc",
    "mounts": [{"destination": d, "type": t, "source": t, "options": ["nosuid", "noexec", "nodev"]}
               for d, t in (("/proc", "proc"), ("/dev", "tmpfs"), ("/dev/pts", "devpts"), ("/dev/shm", "tmpfs"),  # noqa: S108 - a mount in a config.json
                            ("/dev/mqueue", "mqueue"), ("/sys", "sysfs"), ("/sys/fs/cgroup", "cgroup"))],
    "hooks": {"prestart": [{"path": "/usr/bin/ponytail", "args": ["ponytail"]}]},
    "linux": {
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")],
        "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                        "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    },
}, indent="\t").encode()
FIELDS = "\n".join(f"    f{i}: int = {i}" for i in range(5))
CLASS_BODY = f"class C{{i}}:\n{FIELDS}\n"

# (stand-in, its standard equivalent): statements run in a fresh interpreter
PAIRS = {
    "records / dataclasses": (
        f"from ponytail.lite.records import record\nfor i in range({CLASSES}):\n    exec({CLASS_BODY!r}.format(i=i), {{'record': record}})\n"
        .replace("class C", "@record(frozen=True)\\nclass C"),
        f"from dataclasses import dataclass\nfor i in range({CLASSES}):\n    exec({CLASS_BODY!r}.format(i=i), {{'dataclass': dataclass}})\n"
        .replace("class C", "@dataclass(frozen=True)\\nclass C"),
    ),
    "lite.argv / click": (
        "from ponytail.options import parse_hook_args\nparse_hook_args(['-config', '/etc/ponytail/config.toml'])\n",
        "from ponytail.cli.commands import cli\ncli.make_context('ponytail', ['-config', '/etc/ponytail/config.toml'])\n",
    ),
    "plainjson / json (the OCI state and config.json)": (
        f"from ponytail.lite.plainjson import loads_plain\nloads_plain({STATE.encode()!r})\nloads_plain({SPEC!r})\n",
        f"import json\njson.loads({STATE.encode()!r})\njson.loads({SPEC!r})\n",
    ),
    "require without re / with re": (
        "from ponytail.container.require import _parse_constraint\n_parse_constraint('driver>=470')\n",
        "import re\nre.compile(r'^(cuda|driver|arch|brand)(>=|<=|!=|==|=|<|>)(\\S+)$').match('driver>=470')\n"
        "re.compile(r'^\\d+(\\.\\d+)*$').match('470')\n",
    ),
    "plaintoml / tomllib": (
        f"from ponytail.lite.plaintoml import loads_plain\nloads_plain({CONFIG!r})\n",
        f"import tomllib\ntomllib.loads({CONFIG!r})\n",
    ),
}


# standard modules a hook imports where it once had a stand-in (nothing to save: what they cost)
STANDARD = {
    "glob, fnmatch, contextlib (driver files)": "import glob\nglob.glob('/lib/firmware/nvidia/*/gsp*.bin')\n",
    "signal (ldconfig's signal dispositions)": "from signal import SIGKILL, SIGPIPE, SIGXFSZ\n",
}


def timed(statements: str, already: str = ALREADY) -> str:
    return (
        already + "\nimport time\n_t = time.process_time()\n" + statements
        + "print(time.process_time() - _t)\n"
    )


def run_once(statements: str, already: str = ALREADY) -> float:
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + timed(statements, already)],
        capture_output=True, text=True, check=True,
    ).stdout
    return float(out) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=31, help="runs of each case (default 31)")
    args = parser.parse_args()
    cases = [(name, side, code) for name, pair in PAIRS.items() for side, code in zip(("stand-in", "standard"), pair, strict=True)]
    times: dict[tuple[str, str], list[float]] = {(n, s): [] for n, s, _ in cases}
    for name in STANDARD:
        times[(name, "alone")] = []
    for _ in range(args.runs):
        for name, side, code in cases:
            times[(name, side)].append(run_once(code))
        for name, code in STANDARD.items():
            times[(name, "alone")].append(run_once(code, BASE))
    print(f"Python {sys.version.split()[0]}, CPU time, medians of {args.runs} fresh interpreters, interleaved")
    print("| stand-in / standard | stand-in ms | standard ms | saved ms |")
    print("| --- | --- | --- | --- |")
    for name in PAIRS:
        ours, std = (statistics.median(times[(name, side)]) for side in ("stand-in", "standard"))
        print(f"| {name} | {ours:.2f} | {std:.2f} | {std - ours:.2f} |")
    print()
    print("| standard module on the hook's path | ms |")
    print("| --- | --- |")
    for name in STANDARD:
        print(f"| {name} | {statistics.median(times[(name, 'alone')]):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
