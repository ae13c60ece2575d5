#!/usr/bin/env python3
"""ponytail side by side with NVIDIA's own container tools, on the same fake host (run as root).

    python3 bench/nvidiabench.py [--runs N] [--gpus 2,18] [--tools DIR] [--pip PATH]
                                 [--binary PATH | --no-binary] [--command LABEL=PATH ...]
                                 [--results bench/RESULTS.md | --no-results]

NVIDIA's tools are timed where they are installed (NVIDIA's own packages): ``--tools DIR`` (its programs in
DIR or DIR/bin, libnvidia-container in DIR/lib if there), else ``$NVIDIA_TOOLKIT_DIR``, else ``PATH``. Nothing
here builds, downloads or unpacks them. Without them the benchmark says so and measures ponytail alone:
every ponytail row is always there (the pip install of this checkout, the binary, and any ``--command``,
e.g. an older version's: before and after in one run), and NVIDIA's spec, whose hooks ponytail serves,
is then the one nvidia-ctk 1.20.0 wrote (captured in ../shared/nvidia, made to fit the bench's host).

The fake hosts are bench/hookbench.py's (tests/support/fakehost.py with the full compute+utility
file set and a driver-root ld.so.cache as large as a real host's), for 2 and 18 GPUs. For
NVIDIA's tools each host also gets:

- a fake NVML (bench/fake_nvml.c, built with gcc here, the host's GPU table compiled
  in: nvidia-container-cli chroots into the driver root before it loads NVML) in place
  of the driver root's libnvidia-ml;
- ``proc/driver/nvidia`` and ``dev`` inside the driver root (nvidia-container-cli
  takes the nodes and /proc files it mounts from under ``--root``);
- a private mount namespace, kept for the whole run, in which /proc/driver/nvidia,
  /proc/devices, /dev and /sys/bus/pci/devices show the fake host (the cli has no
  options for them). Every command, ponytail's too, runs in it; each "container" is a
  fresh copy of a busybox rootfs and a fresh process in a copy of that namespace.

Work measured, ponytail vs NVIDIA (each run checked: exit 0; mounts counted):

- inject: ``ponytail -root ROOTFS`` vs ``nvidia-container-cli configure --pid ... ROOTFS``;
- hook: ponytail in hook mode vs ``nvidia-container-runtime-hook prestart`` (which runs
  the cli), OCI state on stdin;
- info: ``ponytail info --json`` vs ``nvidia-container-cli info``;
- cdi generate: ``ponytail cdi generate`` vs ``nvidia-ctk cdi generate``;
- cdi hooks: the createContainer hooks of each spec, run one after the other in the
  container's mount namespace as an engine runs them (NVIDIA's spec names five
  ``nvidia-cdi-hook`` processes);
- nvidia spec hooks: NVIDIA's own spec's hooks, run by ``nvidia-cdi-hook`` vs by the
  nvidia-cdi-hook script each ponytail command's ``install-nvidia-hook`` writes: the same
  five processes, the bundle's config.json listing them as an engine writes it (ponytail's
  rows also without NVIDIA's tools, on the captured spec).

ponytail's CDI rows say "not available in this build" where ``ponytail cdi`` does not
exist. All configurations run interleaved, in a different order each round. The hook
is also run through bench/phases.py, which times each phase of it. Medians, ratios
ponytail/NVIDIA and the targets go to stdout and to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import hookbench as hb  # noqa: E402
from hookbench import LIB_DIR, BenchHost, Sample, Series, StandIn, build_host, fresh_bundle, spawn_timed, state_for  # noqa: E402

TOOL_NAMES = ("nvidia-container-cli", "nvidia-container-runtime-hook", "nvidia-ctk", "nvidia-cdi-hook")
NOT_AVAILABLE = "not available in this build"
GPU_ENV = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
PHASES_SCRIPT = BENCH / "phases.py"
# (work, ponytail/NVIDIA target at these GPU counts, or None for every count)
TARGETS = {
    "hook": (1.0, None),
    "inject": (1.0, (18,)),
    "info": (2.0, None),
    "cdi generate": (1.0, None),
    "cdi hooks": (0.5, None),
    "nvidia spec hooks": (1.0, None),
}
WORKS = ("inject", "hook", "info", "cdi generate", "cdi hooks", "nvidia spec hooks")


# -- NVIDIA's tools and their view of the fake host -------------------------------------


@dataclass
class Tools:
    programs: dict[str, str]  # name -> path
    lib: Path | None = None  # libnvidia-container's directory where it is not the system's

    def bin(self, name: str) -> str:
        return self.programs[name]

    @property
    def env(self) -> dict[str, str]:
        return {**hb.HOOK_ENV, **({"LD_LIBRARY_PATH": str(self.lib)} if self.lib else {})}


def find_tools(given: Path | None) -> tuple[Tools | None, str]:
    """NVIDIA's programs where they are installed: ``given`` (--tools), else $NVIDIA_TOOLKIT_DIR, else PATH."""
    toolkit = given or (Path(os.environ["NVIDIA_TOOLKIT_DIR"]) if os.environ.get("NVIDIA_TOOLKIT_DIR") else None)
    if toolkit is not None:
        where = f"{toolkit}"
        dirs = [toolkit, toolkit / "bin"]
        found = {n: str(d / n) for n in TOOL_NAMES for d in reversed(dirs) if os.access(d / n, os.X_OK)}
        lib = toolkit / "lib" if (toolkit / "lib/libnvidia-container.so.1").exists() else None
    else:
        where = "PATH"
        found = {n: p for n in TOOL_NAMES if (p := shutil.which(n))}
        lib = None
    missing = [n for n in TOOL_NAMES if n not in found]
    if missing:
        return None, (
            f"NVIDIA's tools are not installed ({where}; missing: {', '.join(missing)}): NVIDIA's rows are left out and "
            "ponytail is measured alone, on nvidia-ctk 1.20.0's captured spec (install NVIDIA's container toolkit from "
            "NVIDIA's packages, or set NVIDIA_TOOLKIT_DIR, to time them side by side)"
        )
    return Tools(found, lib), f"NVIDIA's tools from {where}"


def captured_nvidia_spec(bench: BenchHost) -> dict:
    """nvidia-ctk 1.20.0's spec as captured (../shared/nvidia), made to fit the bench's host (tests/support/nvidia_tools.py)."""
    from support.nvidia_tools import derived_spec

    return derived_spec(bench.host)


def install_fake_nvml(bench: BenchHost, work: Path) -> None:
    """bench/fake_nvml.c with this host's GPU table compiled in, as the driver root's libnvidia-ml."""
    host = bench.host
    rows = ", ".join(f'{{ {g.minor}, "{g.bus_id}", "{g.uuid}", "{g.model}" }}' for g in host.gpu_list)
    table = work / f"nvml-table-{bench.gpu_count}.h"
    table.write_text(f"#define FAKE_GPUS {rows}\n")
    version = host.driver_version
    out = host.driver / LIB_DIR.lstrip("/") / f"libnvidia-ml.so.{version}"
    out.unlink()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", f'-DDRIVER_VERSION="{version}"',
         f"-DCUDA_VERSION_INT={host.cuda_version}", "-include", str(table), "-o", str(out), str(BENCH / "fake_nvml.c")],
        check=True,
    )


def mirror_into_driver_root(bench: BenchHost) -> None:
    """nvidia-container-cli reads /proc/driver/nvidia and the device nodes under --root."""
    host = bench.host
    shutil.copytree(host.proc / "driver", host.driver / "proc/driver", symlinks=True)
    subprocess.run(["cp", "-a", f"{host.dev}/.", str(host.driver / "dev")], check=True)


def write_nvidia_config(bench: BenchHost, tools: Tools, work: Path) -> Path:
    """The legacy hook's config.toml: the cli with the fake driver root, the host's ldconfig."""
    path = work / f"nvidia-config-{bench.gpu_count}.toml"
    path.write_text(
        'supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"\n'
        "[features]\nallow-cuda-compat-libs-from-container = true\n"
        "[nvidia-container-cli]\n"
        f'root = "{bench.host.driver}"\npath = "{tools.bin("nvidia-container-cli")}"\n'
        f'ldconfig = "@{hb.ldconfig_path()}"\nenvironment = []\n'
        "[nvidia-container-runtime]\nmode = \"legacy\"\n"
        '[nvidia-container-runtime.modes.legacy]\ncuda-compat-mode = ""\n'
    )
    return path


FAKE_HOST_SCRIPT = r"""
set -e
H=$1
mount -t tmpfs -o mode=755 tmpfs /proc/driver
mkdir /proc/driver/nvidia
mount --bind "$H/proc/driver/nvidia" /proc/driver/nvidia
mount --bind "$H/proc/devices" /proc/devices
mount --bind "$H/sys/bus/pci/devices" /sys/bus/pci/devices
mount -t tmpfs -o mode=755 tmpfs /dev
cp -a "$H/dev/." /dev/
mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; mknod -m 666 /dev/full c 1 7
mknod -m 666 /dev/random c 1 8; mknod -m 666 /dev/urandom c 1 9; mknod -m 666 /dev/tty c 5 0
ln -s /proc/self/fd /dev/fd; ln -s fd/0 /dev/stdin; ln -s fd/1 /dev/stdout; ln -s fd/2 /dev/stderr
mkdir /dev/shm /dev/pts
exec sleep 100000
"""


class FakeHostNamespace:
    """A process in a private mount namespace where /proc, /dev and /sys show the fake host."""

    def __init__(self, bench: BenchHost) -> None:
        argv = ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", FAKE_HOST_SCRIPT, "sh", str(bench.host.base)]
        self.proc = subprocess.Popen(argv)
        for _ in range(2000):
            if self.proc.poll() is not None:
                raise SystemExit("bench: the fake host's mount namespace did not come up")
            try:
                if Path(f"/proc/{self.proc.pid}/comm").read_text().strip() == "sleep":
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.002)
        self.enter = ("nsenter", "-t", str(self.proc.pid), "-m")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- one host: every configuration as a function that returns one checked sample ---------


@dataclass
class Host:
    bench: BenchHost
    ns: FakeHostNamespace
    template: Path
    work: Path
    tools: Tools | None
    nvidia_config: Path | None
    specs: dict[str, dict] = field(default_factory=dict)  # label -> CDI spec (for its hooks)
    did: dict[str, str] = field(default_factory=dict)  # "work: label" -> what the first run did

    @property
    def base(self) -> Path:
        return self.bench.host.base

    def env(self) -> dict[str, str]:
        return self.tools.env if self.tools else dict(hb.HOOK_ENV)

    def run(
        self, what: str, argv: list[str], stdin: bytes = b"", launcher: tuple[str, ...] | None = None, cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> Sample:
        """``argv`` timed in the fake host's namespace (or ``launcher``'s); ``cwd``: where
        it starts there (an engine runs hooks in the bundle)."""
        launcher = self.ns.enter if launcher is None else launcher
        if cwd is not None:  # nsenter --wd would keep a directory of the namespace left behind
            launcher = (*launcher, "/bin/sh", "-c", 'cd "$0" && exec "$@"', str(cwd))
        sample, code, err = spawn_timed(argv, stdin, env={**self.env(), **(env or {})}, launcher=launcher)
        if code != 0:
            raise SystemExit(f"bench: {what} ({self.bench.gpu_count} GPUs): exit {code}: {err.strip()[-2000:]}")
        return sample

    def container(self, hooks: dict | None = None) -> tuple[hb.Bundle, StandIn]:
        bundle = fresh_bundle(self.work, self.template, hooks)
        return bundle, StandIn(bundle.rootfs, launcher=self.ns.enter)

    def in_container(self, what: str, label: str, runner: Callable[[hb.Bundle, StandIn], Sample], hooks: dict | None = None) -> Sample:
        bundle, standin = self.container(hooks)
        try:
            sample = runner(bundle, standin)
            mounts = standin.mounts_under(bundle.rootfs)
        finally:
            standin.stop()
        key = f"{what}: {label}"
        if key not in self.did:
            self.did[key] = f"{mounts} mounts in the container"
        if mounts == 0 and what in ("inject", "hook"):
            raise SystemExit(f"bench: {key} ({self.bench.gpu_count} GPUs): nothing mounted in the container")
        return sample

    # -- NVIDIA
    def nvidia_inject(self) -> Sample:
        assert self.tools
        cli, driver = self.tools.bin("nvidia-container-cli"), str(self.bench.host.driver)

        def runner(bundle: hb.Bundle, standin: StandIn) -> Sample:
            argv = [cli, "--root", driver, "configure", f"--pid={standin.proc.pid}", "--no-cgroups", "--device=all",
                    "--compute", "--utility", f"--ldconfig=@{hb.ldconfig_path()}", str(bundle.rootfs)]
            return self.run("nvidia-container-cli configure", argv)

        return self.in_container("inject", "NVIDIA", runner)

    def nvidia_hook(self) -> Sample:
        assert self.tools and self.nvidia_config
        argv = [self.tools.bin("nvidia-container-runtime-hook"), "-config", str(self.nvidia_config), "prestart"]
        return self.in_container(
            "hook", "NVIDIA", lambda b, s: self.run("nvidia-container-runtime-hook prestart", argv, state_for(b, s.proc.pid), cwd=b.path)
        )

    def nvidia_info(self) -> Sample:
        assert self.tools
        return self.run("nvidia-container-cli info", [self.tools.bin("nvidia-container-cli"), "--root", str(self.bench.host.driver), "info"])

    def nvidia_generate_argv(self, output: Path) -> list[str]:
        assert self.tools
        return [self.tools.bin("nvidia-ctk"), "cdi", "generate", "--driver-root", str(self.bench.host.driver),
                "--dev-root", str(self.base), "--nvidia-cdi-hook-path", self.tools.bin("nvidia-cdi-hook"),
                "--format", "json", "--output", str(output)]

    # -- ponytail (a console script, the binary, another version's command)
    def ponytail_inject(self, command: list[str], label: str) -> Sample:
        def runner(bundle: hb.Bundle, standin: StandIn) -> Sample:
            argv = [*command, "-root", str(bundle.rootfs), "-config", str(self.bench.config)]
            return self.run("ponytail -root", argv, launcher=("nsenter", "-t", str(standin.proc.pid), "-m"))

        return self.in_container("inject", label, runner)

    def ponytail_hook(self, command: list[str], label: str) -> Sample:
        argv = [*command, "-config", str(self.bench.config)]
        return self.in_container("hook", label, lambda b, s: self.run("ponytail hook", argv, state_for(b, s.proc.pid), cwd=b.path))

    def ponytail_info(self, command: list[str]) -> Sample:
        return self.run("ponytail info --json", [*command, "info", "--json", "-config", str(self.bench.config)])

    def ponytail_generate_argv(self, command: list[str], output: Path) -> list[str]:
        # the spec's hook is the command measured (an -IS launcher is not the install's own 'ponytail')
        return [*command, "cdi", "generate", "--format", "json", "--output", str(output), "-config", str(self.bench.config),
                "--hook-path", command[0]]

    # -- CDI: a spec's createContainer hooks, one process after the other
    def as_engine_at_create_container(self, label: str, rootfs: Path, enter: tuple[str, ...]) -> None:
        """What an engine has done by createContainer (not timed): the rootfs is a mount
        point, /proc shows the driver's files, the spec's mounts are in place."""
        pairs = [x for m in self.specs[label].get("containerEdits", {}).get("mounts", []) for x in (m["hostPath"], m["containerPath"])]
        script = [*enter, "/bin/sh", "-c", CDI_CONTAINER_SCRIPT, "sh", str(rootfs), str(self.bench.host.proc / "driver/nvidia"), *pairs]
        subprocess.run(script, check=True)

    def cdi_hooks(self, label: str, what: str = "cdi hooks", spec_key: str | None = None) -> Sample:
        """The createContainer hooks of the spec ``spec_key`` (default: ``label``'s), each with the
        environment the spec gives it; the bundle's config.json lists them, as an engine writes it."""
        spec_key = spec_key or label
        hooks = [h for h in self.specs[spec_key].get("containerEdits", {}).get("hooks", []) if h.get("hookName") == "createContainer"]

        def runner(bundle: hb.Bundle, standin: StandIn) -> Sample:
            # pid 0: at createContainer the hook's parent is the container's init, which a
            # stand-in cannot be (ponytail's cdi-hook checks); the hooks run in its namespace,
            # one after the other from one shell, as runc's init runs them (one parent for all)
            state = bundle.path / "state.json"
            state.write_bytes(state_for(bundle, 0))
            enter = ("nsenter", "-t", str(standin.proc.pid), "-m")
            self.as_engine_at_create_container(spec_key, bundle.rootfs, enter)
            lines = ["set -e"]
            for hook in hooks:
                env = " ".join(shlex.quote(item) for item in hook.get("env", []))
                argv = " ".join(shlex.quote(a) for a in [hook["path"], *hook.get("args", [])[1:]])
                lines.append(f"{env} {argv} < {shlex.quote(str(state))}")
            return self.run(f"the CDI hooks of {spec_key}", ["/bin/sh", "-c", "\n".join(lines)], launcher=enter, cwd=bundle.path)

        key = f"{what}: {label}"
        self.did.setdefault(key, f"{len(hooks)} hook process(es)")
        listed = {"createContainer": [{k: v for k, v in h.items() if k != "hookName"} for h in hooks]}
        return self.in_container(what, label, runner, listed)

    def nvidia_spec_for(self, label: str, command: list[str]) -> str:
        """NVIDIA's spec with its hooks run by the nvidia-cdi-hook script ``command``'s
        ``install-nvidia-hook`` writes; the key of that spec."""
        link = self.work / f"nvidia-hook-{label.replace(' ', '-')}" / "nvidia-cdi-hook"
        subprocess.run([*command, "install-nvidia-hook", "--at", str(link), "--path", command[0]], check=True, capture_output=True)
        spec = json.loads(json.dumps(self.specs["NVIDIA"]))
        for hook in spec.get("containerEdits", {}).get("hooks", []):
            hook["path"] = str(link)
            hook["env"] = [*hook.get("env", []), f"PONYTAIL_CONFIG={self.bench.config}"]
        key = f"NVIDIA spec, {label}"
        self.specs[key] = spec
        return key


CDI_CONTAINER_SCRIPT = r"""
set -e
R=$1; P=$2; shift 2
mount --rbind "$R" "$R"
mount --bind "$P" "$R/proc/driver/nvidia"
while [ $# -gt 0 ]; do
    if [ -d "$1" ]; then mkdir -p "$R$2"; else mkdir -p "$(dirname "$R$2")"; touch "$R$2"; fi
    mount --bind "$1" "$R$2"; mount -o remount,bind,ro "$R$2"
    shift 2
done
"""


ISOLATED_LAUNCHER = """#!{python} -IS
# ponytail's console script started isolated (-I: no PYTHON* variables, no script
# directory on sys.path; -S: no site, so no .pth files run): the installed package's
# directory is put on sys.path by hand. Measured beside pip's own launcher.
import sys
sys.path.append({site_packages!r})
from ponytail.entry import run
run()
"""


def isolated_launcher(pip: Path, work: Path) -> Path | None:
    """A launcher like pip's for the same venv, but ``-IS``; None if ponytail is not a
    plain install there (an editable install needs site's .pth files)."""
    python = pip.parent / "python"
    found = subprocess.run(
        [str(python), "-I", "-c", "import ponytail, os, sys; print(os.path.dirname(os.path.dirname(ponytail.__file__)))"],
        capture_output=True, text=True,
    )
    site_packages = found.stdout.strip()
    if found.returncode != 0 or not site_packages.endswith("-packages"):
        return None
    path = work / "ponytail-isolated"
    path.write_text(ISOLATED_LAUNCHER.format(python=python, site_packages=site_packages))
    path.chmod(0o755)
    return path


def ponytail_has_cdi(command: list[str]) -> bool:
    return subprocess.run([*command, "cdi", "--help"], capture_output=True).returncode == 0


# -- the rounds ---------------------------------------------------------------------------


@dataclass
class Plan:
    """The configurations of each work: label -> a function that returns one sample."""

    runs: dict[str, dict[str, Callable[[], Sample]]]
    notes: list[str]


def configurations(h: Host, ponytails: dict[str, list[str]], cdi: dict[str, bool], phases: Callable[[], Sample] | None) -> Plan:
    runs: dict[str, dict[str, Callable[[], Sample]]] = {work: {} for work in WORKS}
    notes: list[str] = []
    if h.tools:
        runs["inject"]["NVIDIA"] = h.nvidia_inject
        runs["hook"]["NVIDIA"] = h.nvidia_hook
        runs["info"]["NVIDIA"] = h.nvidia_info
        spec = h.work / f"nvidia-spec-{h.bench.gpu_count}.json"
        argv = h.nvidia_generate_argv(spec)
        runs["cdi generate"]["NVIDIA"] = lambda: h.run("nvidia-ctk cdi generate", argv)
        h.run("nvidia-ctk cdi generate", argv)
        h.specs["NVIDIA"] = json.loads(spec.read_text())
        runs["cdi hooks"]["NVIDIA"] = lambda: h.cdi_hooks("NVIDIA")
        runs["nvidia spec hooks"]["NVIDIA"] = lambda: h.cdi_hooks("NVIDIA", "nvidia spec hooks")
    else:  # ponytail serving NVIDIA's spec, measured all the same: the spec nvidia-ctk 1.20.0 wrote
        h.specs["NVIDIA"] = captured_nvidia_spec(h.bench)
    for label, command in ponytails.items():
        if len(command) == 1:
            try:
                key = h.nvidia_spec_for(label, command)
            except subprocess.CalledProcessError:  # an older ponytail: no install-nvidia-hook
                notes.append(f"{label}: nvidia spec hooks not available in this build (no install-nvidia-hook)")
            else:
                runs["nvidia spec hooks"][label] = lambda k=key, lab=label: h.cdi_hooks(lab, "nvidia spec hooks", k)
        runs["inject"][label] = lambda c=command, lab=label: h.ponytail_inject(c, lab)
        runs["hook"][label] = lambda c=command, lab=label: h.ponytail_hook(c, lab)
        runs["info"][label] = lambda c=command: h.ponytail_info(c)
        if not cdi[label]:
            continue
        spec = h.work / "ponytail-specs" / f"ponytail-spec-{label}-{h.bench.gpu_count}.json"  # not beside NVIDIA's: one owner per kind
        spec.parent.mkdir(exist_ok=True)
        argv = h.ponytail_generate_argv(command, spec)
        runs["cdi generate"][label] = lambda a=argv: h.run("ponytail cdi generate", a)
        h.run("ponytail cdi generate", argv)
        h.specs[label] = json.loads(spec.read_text())
        runs["cdi hooks"][label] = lambda lab=label: h.cdi_hooks(lab)
    if phases is not None:
        runs["hook"]["pip, phases"] = phases
    return Plan(runs, notes)


@dataclass
class PhaseRecorder:
    """The pip console script's hook run through bench/phases.py: one sample and its phases."""

    h: Host
    python: str
    per_phase: dict[str, list[float]] = field(default_factory=dict)  # wall ms
    per_phase_cpu: dict[str, list[float]] = field(default_factory=dict)  # CPU ms
    missing: set[str] = field(default_factory=set)

    def __call__(self) -> Sample:
        with tempfile.NamedTemporaryFile(dir=self.h.work, suffix=".phases") as out:
            argv = [self.python, str(PHASES_SCRIPT), out.name, "-config", str(self.h.bench.config)]
            sample = self.h.in_container(
                "hook", "pip, phases", lambda b, s: self.h.run("phases", argv, state_for(b, s.proc.pid), cwd=b.path)
            )
            wall: dict[str, int] = {}
            cpu: dict[str, int] = {}
            for line in Path(out.name).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "missing":
                    self.missing.add(value)
                else:
                    wall_ns, cpu_ns = value.split()
                    wall[name], cpu[name] = int(wall_ns), int(cpu_ns)
        for values, total, into in ((wall, sample.seconds, self.per_phase), (cpu, sample.cpu_seconds, self.per_phase_cpu)):
            end = values.pop("end")
            measured = sum(values.values())
            values["exit"] = int(total * 1e9) - end
            values["bench overhead"] = end - measured  # phases.py's own import, between the interpreter and the run
            for name, ns in values.items():
                into.setdefault(name, []).append(ns / 1e6)
        return sample


def measure(hosts: list[Host], plans: dict[int, Plan], runs: int) -> dict[int, dict[str, dict[str, Series]]]:
    results = {n: {work: {label: Series(label) for label in plan.runs[work]} for work in WORKS} for n, plan in plans.items()}
    for rep in range(runs):
        for h in hosts:
            n = h.bench.gpu_count
            jobs = [(work, label, fn) for work in WORKS for label, fn in plans[n].runs[work].items()]
            shift = (rep * 3) % len(jobs)
            for work, label, fn in jobs[shift:] + jobs[:shift]:  # a different order each round
                results[n][work][label].samples.append(fn())
        print(f"bench: round {rep + 1}/{runs} done", file=sys.stderr)
    return results


def floor_series(python: str, runs: int) -> Series:
    series = Series("python -I -c pass")
    for _ in range(runs):
        series.samples.append(spawn_timed([python, "-I", "-c", "pass"])[0])
    return series


# -- report -------------------------------------------------------------------------------


def report(
    results: dict[int, dict[str, dict[str, Series]]], hosts: list[Host], phases: dict[int, PhaseRecorder],
    ponytails: dict[str, list[str]], cdi: dict[str, bool], tools_note: str, runs: int, floor: Series,
) -> list[str]:
    counts = sorted(results)
    labels = list(ponytails)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    out = [f"Measured {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} on {hb.machine()}; {runs} runs of each, interleaved; "
           f"load average at the end {load}.",
           f"{tools_note}. ponytail: {revision()}.", ""]
    out += ["Wall time, median ms (what a container start waits for):", ""]
    out += summary(results, labels, cdi, wall_median)
    out += ["", "CPU time (user + system of the process and the children it waited for), median ms: it varies much "
            "less than the wall time on a busy machine:", ""]
    out += summary(results, labels, cdi, cpu_median)
    out += ["", f"Floor: a bare `python -I -c pass` of the venv's interpreter, {floor.median():.1f} ms wall, "
            f"{cpu_median(floor):.1f} ms CPU (medians).", ""]
    rows = [(f"{n} GPUs, {work}: {label}", s) for n in counts for work in WORKS for label, s in results[n][work].items()]
    out += hb.table(rows)
    out += ["", "What each run did (first run):"]
    for h in hosts:
        out += [f"- {h.bench.gpu_count} GPUs, {key}: {value}" for key, value in h.did.items()]
    if phases:
        out += ["", "Where the ponytail hook's time goes (pip console script through bench/phases.py; exclusive ms, medians; "
                "CPU: this process's and its waited-for children's):", ""]
        names = [p for p in PHASE_ORDER if any(p in rec.per_phase for rec in phases.values())]
        out += ["| phase | " + " | ".join(f"{n} GPUs wall | {n} GPUs CPU" for n in phases) + " |", "|" + " --- |" * (1 + 2 * len(phases))]
        for name in names:
            cells = [f"{median(rec.per_phase.get(name, [0.0])):.2f} | {median(rec.per_phase_cpu.get(name, [0.0])):.2f}" for rec in phases.values()]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        totals = [f"{results[n]['hook']['pip, phases'].median():.2f} | {cpu_median(results[n]['hook']['pip, phases']):.2f}" for n in phases]
        out.append("| total (its own run, median) | " + " | ".join(totals) + " |")
        missing = set().union(*(rec.missing for rec in phases.values()))
        if missing:
            out.append(f"\nNot wrapped in this build (their time falls to the phase around them): {', '.join(sorted(missing))}")
    out += ["", "Targets (ponytail/NVIDIA, medians of this run):"] + targets(results, labels)
    return out


def wall_median(series: Series) -> float:
    return series.median()


def cpu_median(series: Series) -> float:
    return median([s.cpu_seconds * 1000 for s in series.samples])


def summary(
    results: dict[int, dict[str, dict[str, Series]]], labels: list[str], cdi: dict[str, bool], metric: Callable[[Series], float]
) -> list[str]:
    """One row per work and GPU count: NVIDIA, each ponytail and its ratio to NVIDIA, the target."""
    out = ["| work | GPUs | NVIDIA | " + " | ".join(f"{label} | {label}/NVIDIA" for label in labels) + " | target |"]
    out.append("|" + " --- |" * (4 + 2 * len(labels)))
    for work in WORKS:
        for n in sorted(results):
            series = results[n][work]
            nv = series.get("NVIDIA")
            cells = [work, str(n), f"{metric(nv):.1f}" if nv else "not installed"]
            for label in labels:
                if label not in series:
                    cells += [NOT_AVAILABLE if work.startswith("cdi") and not cdi[label] else "—", "—"]
                    continue
                value = metric(series[label])
                cells += [f"{value:.1f}", f"{value / metric(nv):.2f}×" if nv else "—"]
            ratio, only = TARGETS[work]
            cells.append(f"≤ {ratio}×" if only is None or n in only else "")
            out.append("| " + " | ".join(cells) + " |")
    return out


PHASE_ORDER = ("interpreter", "bench overhead", "imports", "config", "container", "request", "probe", "plan",
               "mounts", "ldconfig", "cgroup", "log", "other", "exit")


def median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def targets(results: dict[int, dict[str, dict[str, Series]]], labels: list[str]) -> list[str]:
    lines = []
    for work in WORKS:
        ratio, only = TARGETS[work]
        for n in sorted(results):
            if only is not None and n not in only:
                continue
            nv = results[n][work].get("NVIDIA")
            for label in labels:
                mine = results[n][work].get(label)
                if nv is None or mine is None:
                    continue
                r, c = mine.median() / nv.median(), cpu_median(mine) / cpu_median(nv)
                lines.append(f"  {'met   ' if r <= ratio else 'MISSED'} {work}, {n} GPUs, {label}: {r:.2f}× wall (≤ {ratio}×); {c:.2f}× CPU")
    return lines or ["  (nothing to compare: NVIDIA's tools are not installed here)"]


def revision() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"


# -- main ---------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each configuration (default 15)")
    parser.add_argument("--gpus", default="2,18", help="GPU counts of the fake hosts (default 2,18)")
    parser.add_argument("--tools", type=Path, help="where NVIDIA's toolkit is installed: its programs in DIR or DIR/bin "
                        "(default: $NVIDIA_TOOLKIT_DIR, else PATH)")
    parser.add_argument("--pip", metavar="PATH", help="an installed ponytail command instead of a fresh 'pip install .' venv")
    parser.add_argument("--binary", metavar="PATH", help="the binary to measure (default: dist/ponytail/ponytail if built)")
    parser.add_argument("--no-binary", action="store_true", help="measure no binary")
    parser.add_argument("--command", action="append", default=[], metavar="LABEL=PATH",
                        help="another ponytail command beside them, e.g. an older version's (repeatable)")
    parser.add_argument("--isolated-launcher", action="store_true",
                        help="also measure the pip venv's ponytail through a '#!python -IS' launcher (label 'pip -IS')")
    parser.add_argument("--no-phases", action="store_true", help="skip the per-phase runs of the hook")
    parser.add_argument("--works", default=",".join(WORKS), help=f"the works to measure (default {','.join(WORKS)})")
    parser.add_argument("--results", type=Path, default=BENCH / "RESULTS.md", help="where to write the report (default bench/RESULTS.md)")
    parser.add_argument("--no-results", action="store_true", help="print the report only")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench: run as root (it mounts and enters mount namespaces)", file=sys.stderr)
        return 2
    tools, tools_note = find_tools(args.tools)
    print(f"bench: {tools_note}", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="ponytail-nvbench-"))
    hosts: list[Host] = []
    try:
        hb.build_measure(work)
        pip = Path(args.pip).absolute() if args.pip else hb.pip_install(work)
        interpreter = pip.parent / "python"
        if interpreter.exists():
            version = subprocess.run([str(interpreter), "-c", "import platform; print(platform.python_version())"],
                                     capture_output=True, text=True, check=False).stdout.strip()
            tools_note += f"; pip: a venv of {interpreter.resolve()} (Python {version})"
        ponytails = {"pip": [str(pip)]}
        binary = None if args.no_binary else (Path(args.binary) if args.binary else REPO / "dist/ponytail/ponytail")
        if binary is not None and binary.is_file():
            ponytails["binary"] = [str(binary.resolve())]
        elif binary is not None:
            print(f"bench: no binary at {binary} (make binary): measuring without it", file=sys.stderr)
        if args.isolated_launcher:
            launcher = isolated_launcher(pip, work)
            if launcher is None:
                print("bench: ponytail is not a plain install in that venv: no -IS launcher", file=sys.stderr)
            else:
                ponytails["pip -IS"] = [str(launcher)]
        for item in args.command:
            label, _, path = item.partition("=")
            ponytails[label] = [str(Path(path).absolute())]
        cdi = {label: ponytail_has_cdi(command) for label, command in ponytails.items()}
        template = hb.make_rootfs(work / "image" / "rootfs", programs=())
        (template / "proc/driver/nvidia").mkdir(parents=True)  # a runtime mounts /proc before prestart hooks
        _write_bundle_config(template.parent / "runc-config.json")
        python = str(pip.parent / "python")
        plans: dict[int, Plan] = {}
        phases: dict[int, PhaseRecorder] = {}
        for n in (int(x) for x in args.gpus.split(",")):
            bench = build_host(work / f"host-{n}", n, work)
            nvidia_config = None
            if tools:
                install_fake_nvml(bench, work)
                mirror_into_driver_root(bench)
                nvidia_config = write_nvidia_config(bench, tools, work)
            h = Host(bench, FakeHostNamespace(bench), template, work / f"run-{n}", tools, nvidia_config)
            h.work.mkdir()
            hosts.append(h)
            recorder = None if args.no_phases else PhaseRecorder(h, python)
            if recorder:
                phases[n] = recorder
            plans[n] = configurations(h, ponytails, cdi, recorder)
            for skipped in set(WORKS) - set(args.works.split(",")):
                plans[n].runs[skipped].clear()
        floor = floor_series(python, args.runs)
        results = measure(hosts, plans, args.runs)
        lines = report(results, hosts, phases, ponytails, cdi, tools_note, args.runs, floor)
        print("\n".join(lines))
        if not args.no_results:
            kept = ""  # the sections other benchmarks keep in the file (bench/guardbench.py's), after this report
            if args.results.exists() and GUARD_SECTION in args.results.read_text():
                kept = "\n" + GUARD_SECTION + args.results.read_text().split(GUARD_SECTION, 1)[1]
            args.results.write_text(RESULTS_HEAD + "\n".join(lines) + "\n" + kept)
            print(f"bench: wrote {args.results}", file=sys.stderr)
    finally:
        for h in hosts:
            h.ns.stop()
        if os.environ.get("BENCH_KEEP"):
            print(f"bench: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


GUARD_SECTION = "## ponytail guard"
RESULTS_HEAD = """# ponytail and NVIDIA's container tools, side by side

Written by `make bench-nvidia` (bench/nvidiabench.py; how it measures is in its docstring). Ratios are
ponytail / NVIDIA, medians of one interleaved run on the same fake host; below 1 ponytail is faster.
On a real host NVIDIA's tools also initialise NVML (which opens the GPUs), which a fake NVML does not show:
these are the conservative figures.

"""


def _write_bundle_config(path: Path) -> None:
    """hookbench's runc config, with a GPU request both hooks read from ``process.env``."""
    hb._write_runc_config(path)
    spec = json.loads(path.read_text())
    spec["process"]["env"] = [*spec["process"].get("env", []), *GPU_ENV]
    path.write_text(json.dumps(spec))


if __name__ == "__main__":
    raise SystemExit(main())
