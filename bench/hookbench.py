#!/usr/bin/env python3
"""How much a container start pays for ponytail: a benchmark script (run as root).

    python3 bench/hookbench.py [--runs N] [--gpus 1,8,64] [--binary LABEL=PATH ...] [--no-runc]

Builds fake NVIDIA hosts (tests/support/fakehost.py) with 1, 8 and 64 GPUs and the full
compute+utility driver file set (eleven gcc-built libraries of the running driver,
each beside a stale one of an older driver, nvidia-smi, and a driver-root
ld.so.cache as large as a real host's), then runs the hook in hook mode: each run
gets a fresh copy of a busybox rootfs and a fresh process in its own mount
namespace standing in for the container, the OCI state on stdin. Every
configuration is measured side by side in one run, interleaved, so the noise of a
busy machine falls on all of them alike:

- ``pip``: ponytail's console script from a venv made with ``pip install .``;
- each ``--binary`` (default: ``make binary``'s dist/ponytail);
- ``floor``: a bare ``python -I -c pass`` of the same interpreter;
- ``shell``: bench/shell_hook.sh, the same job by hand (one nsenter, ``mount --bind``
  and a read-only remount per file, one ``ldconfig -r``);
- ``ldconfig``: the host's ``ldconfig -r`` alone, on a rootfs that already holds
  the driver's libraries (the fixed cost every hook pays).

Every hook run is checked: exit 0 and every file mounted in the container's
namespace. Then ``runc run`` of a small container with and without the hook, and
the scan of this machine's live /sys/bus/pci with pyudev and with plain sysfs
reads. Prints medians, quartiles and peak RSS (the largest ru_maxrss of the
process and the children it waited for), and checks the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.fakehost import LIB_DIR, FakeGpu, FakeHost, make_rootfs  # noqa: E402

SHELL_HOOK = REPO / "bench" / "shell_hook.sh"
STALE_VERSION = "535.104.05"
# The compute+utility libraries and binaries (ponytail.capabilities, as NVIDIA defines them),
# libraries by file stem with their SONAMEs ("{v}": the driver version). libcuda and
# libnvidia-ml come from FakeHost itself.
LIBRARIES = {
    "libcuda": "libcuda.so.1",
    "libnvidia-ml": "libnvidia-ml.so.1",
    "libnvidia-cfg": "libnvidia-cfg.so.1",
    "libnvidia-nscq": "libnvidia-nscq.so.{v}",
    "libcudadebugger": "libcudadebugger.so.1",
    "libnvidia-opencl": "libnvidia-opencl.so.1",
    "libnvidia-gpucomp": "libnvidia-gpucomp.so.{v}",
    "libnvidia-ptxjitcompiler": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-fatbinaryloader": "libnvidia-fatbinaryloader.so.{v}",
    "libnvidia-allocator": "libnvidia-allocator.so.1",
    "libnvidia-compiler": "libnvidia-compiler.so.{v}",
    "libnvidia-pkcs11": "libnvidia-pkcs11.so.{v}",
    "libnvidia-pkcs11-openssl3": "libnvidia-pkcs11-openssl3.so.{v}",
    "libnvidia-nvvm": "libnvidia-nvvm.so.4",
}
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
FILLER_LIBRARIES = 550  # other libraries in the driver root's ld.so.cache (this Debian 12 host has ~550)
CONTROL_NODES = 3  # nvidiactl, nvidia-uvm, nvidia-uvm-tools
HOOK_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
MiB = 1024


# -- the fake hosts -----------------------------------------------------------------


@dataclass
class BenchHost:
    gpu_count: int
    host: FakeHost
    config: Path
    expected_mounts: int


def build_host(base: Path, gpu_count: int, work: Path) -> BenchHost:
    """A FakeHost with ``gpu_count`` GPUs and the whole compute+utility file set."""
    gpu_list = [FakeGpu(f"0000:{0x10 + 3 * i:02x}:00.0", i, f"GPU-{i:08x}-1111-2222-3333-444444444444") for i in range(gpu_count)]
    host = FakeHost(base, gpu_list=gpu_list)
    libdir = host.driver / LIB_DIR.lstrip("/")
    for stem, soname in LIBRARIES.items():
        if stem in ("libcuda", "libnvidia-ml"):
            continue
        for version in (host.driver_version, STALE_VERSION):
            built = _compile_library(work, soname.format(v=version), f"{stem}.so.{version}")
            shutil.copy(built, libdir / f"{stem}.so.{version}")
        link = libdir / soname.format(v=host.driver_version)
        if not link.exists():
            link.symlink_to(f"{stem}.so.{host.driver_version}")
    _add_filler_libraries(work, libdir)
    bindir = host.driver / "usr/bin"
    for name in BINARIES[1:]:
        shutil.copy(bindir / "nvidia-smi", bindir / name)
    subprocess.run(["ldconfig", "-r", str(host.driver)], check=True)
    config = host.write_config()  # the default capabilities (utility, compute) name every file above
    # the probe cache where a real host keeps it (/run/ponytail), and a config older versions read too
    config.write_text(config.read_text().replace(f'[cache]\ndir = "{host.base}/cache"\n', ""))
    expected = gpu_count + CONTROL_NODES + len(LIBRARIES) + len(BINARIES)
    return BenchHost(gpu_count, host, config, expected)


def _compile_library(work: Path, soname: str, filename: str) -> Path:
    out = work / "libs" / filename
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        source = b"int ponytail_bench_symbol(void) { return 0; }\n"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}", "-x", "c", "-", "-o", str(out)],
            input=source, check=True,
        )
    return out


def _add_filler_libraries(work: Path, libdir: Path) -> None:
    """Other libraries a real driver root holds, each with its own SONAME (patched into
    one gcc-built library), so its ld.so.cache and library directory are a real size."""
    template = _compile_library(work, "libfiller00000.so.1", "libfiller00000.so.1").read_bytes()
    for i in range(FILLER_LIBRARIES):
        name = f"libfiller{i:05d}.so.1"
        (libdir / name).write_bytes(template.replace(b"libfiller00000.so.1", name.encode()))


# -- one measured run ---------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    max_rss_kib: int
    cpu_seconds: float = 0.0  # user + system, of the command and the children it waited for


@dataclass
class Series:
    label: str
    samples: list[Sample] = field(default_factory=list)

    def ms(self, cpu: bool = False) -> list[float]:
        """Wall time, or with ``cpu`` CPU time, of each sample in ms, sorted."""
        return sorted((s.cpu_seconds if cpu else s.seconds) * 1000 for s in self.samples)

    def median(self, cpu: bool = False) -> float:
        return statistics.median(self.ms(cpu))

    def quartiles(self, cpu: bool = False) -> tuple[float, float]:
        values = self.ms(cpu)
        if len(values) < 4:
            return values[0], values[-1]
        q = statistics.quantiles(values, n=4)
        return q[0], q[2]

    def peak_rss_mib(self) -> float:
        return max(s.max_rss_kib for s in self.samples) / MiB


MEASURE: Path | None = None  # bench/measure.c, built into the work directory


def build_measure(work: Path) -> None:
    global MEASURE
    MEASURE = work / "measure"
    subprocess.run(["gcc", "-O2", "-o", str(MEASURE), str(REPO / "bench/measure.c")], check=True)


def spawn_timed(
    argv: list[str], stdin: bytes = b"", cwd: str | None = None, env: dict[str, str] | None = None, launcher: tuple[str, ...] = ()
) -> tuple[Sample, int, str]:
    """Run ``argv`` under bench/measure.c: wall time, peak RSS of it and its
    waited-for children, exit status, stderr. ``launcher`` runs the measuring
    launcher itself (e.g. ``nsenter -t PID -m``: the command then runs in that mount
    namespace, and entering it is not timed)."""
    assert MEASURE is not None
    with tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile() as result:
        inp.write(stdin)
        inp.seek(0)
        run = subprocess.run(
            [*launcher, str(MEASURE), "--cpu", result.name, *argv], stdin=inp, stdout=subprocess.DEVNULL, stderr=err,
            env=HOOK_ENV if env is None else env, cwd=cwd,
        )
        err.seek(0)
        message = err.read().decode(errors="replace")
        if run.returncode != 0:
            raise SystemExit(f"bench: measure failed: {message.strip()}")
        ns, rss, code, cpu_ns = (int(x) for x in Path(result.name).read_text().split())
        return Sample(ns / 1e9, rss, cpu_ns / 1e9), code, message


class StandIn:
    """A process in a fresh private mount namespace: the container at prestart, with its
    own tmpfs on the rootfs's /dev as runc mounts one before the prestart hooks run."""

    def __init__(self, rootfs: Path, launcher: tuple[str, ...] = ()) -> None:
        """``launcher``: where the namespace is copied from (e.g. ``nsenter -t PID -m``)."""
        script = 'mount -t tmpfs -o mode=755 tmpfs "$1/dev" && exec sleep 600'
        argv = [*launcher, "unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", str(rootfs)]
        self.proc = subprocess.Popen(argv)
        for _ in range(1000):
            try:
                with open(f"/proc/{self.proc.pid}/comm") as f:
                    if f.read().strip() == "sleep":  # exec'd: its /dev is mounted
                        return
            except FileNotFoundError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.002)
        raise RuntimeError("the stand-in container did not start in its own mount namespace with its /dev")

    def mounts_under(self, path: Path) -> int:
        """Mounts below ``path`` in the container's namespace, its own /dev tmpfs left out."""
        prefix = str(path) + "/"
        with open(f"/proc/{self.proc.pid}/mountinfo") as f:
            points = [line.split()[4] for line in f]
        return sum(1 for point in points if point.startswith(prefix) and point != f"{path}/dev")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass
class Bundle:
    path: Path
    rootfs: Path


def fresh_bundle(work: Path, template: Path, hooks: dict | None = None) -> Bundle:
    """A bundle with a fresh copy of the rootfs template, as each container start has."""
    path = work / "bundle"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir()
    rootfs = path / "rootfs"
    shutil.copytree(template, rootfs, symlinks=True)
    spec = json.loads((template.parent / "runc-config.json").read_text())
    if hooks:
        spec["hooks"] = hooks
    (path / "config.json").write_text(json.dumps(spec))
    return Bundle(path, rootfs)


def state_for(bundle: Bundle, pid: int) -> bytes:
    return json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": pid, "bundle": str(bundle.path)}).encode()


def hook_sample(argv: list[str], bench: BenchHost, work: Path, template: Path, check: bool = True) -> Sample:
    bundle = fresh_bundle(work, template)
    container = StandIn(bundle.rootfs)
    try:
        sample, code, err = spawn_timed(argv, state_for(bundle, container.proc.pid))
        mounted = container.mounts_under(bundle.rootfs)
    finally:
        container.stop()
    if code != 0:
        raise SystemExit(f"{' '.join(argv[:2])}: exit {code}: {err.strip()}")
    if check and mounted != bench.expected_mounts:
        raise SystemExit(f"{' '.join(argv[:2])}: {mounted} mounts in the container, expected {bench.expected_mounts}")
    return sample


def ldconfig_sample(bench: BenchHost, work: Path, template: Path) -> Sample:
    """The host's ldconfig -r on a rootfs that already holds the driver's libraries."""
    bundle = fresh_bundle(work, template)
    src = bench.host.driver / LIB_DIR.lstrip("/")
    dst = bundle.rootfs / LIB_DIR.lstrip("/")
    for stem in LIBRARIES:
        shutil.copy(src / f"{stem}.so.{bench.host.driver_version}", dst)
    (bundle.rootfs / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (bundle.rootfs / "etc/ld.so.conf.d/00-ponytail.conf").write_text(LIB_DIR + "\n")
    sample, code, err = spawn_timed([ldconfig_path(), "-r", str(bundle.rootfs), LIB_DIR])
    if code != 0:
        raise SystemExit(f"ldconfig: exit {code}: {err.strip()}")
    return sample


def ldconfig_path() -> str:
    return next(p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p))


# -- the configurations -------------------------------------------------------------


def user_python() -> str:
    """The interpreter a node's users install ponytail with: the distribution's python3 (Debian's
    is built with PGO and LTO and starts faster than a self-built one), else this one."""
    for candidate in ("/usr/bin/python3", sys.executable):
        if os.access(candidate, os.X_OK) and subprocess.run(
            [candidate, "-c", "import venv, ensurepip"], capture_output=True, check=False
        ).returncode == 0:
            return candidate
    return sys.executable


def pip_install(work: Path) -> Path:
    """ponytail as a user installs it: ``pip install .`` into a fresh venv of ``user_python()``."""
    venv = work / "venv"
    subprocess.run([user_python(), "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(REPO)],
        check=True, stdout=subprocess.DEVNULL,
    )
    return venv / "bin/ponytail"


def default_binary() -> Path:
    for candidate in (REPO / "dist/ponytail/ponytail", REPO / "dist/ponytail"):
        if candidate.is_file():
            return candidate
    print("bench: no binary in dist/: running make binary", file=sys.stderr)
    subprocess.run(["make", "-C", str(REPO), "binary"], check=True)
    return default_binary()


def hook_configurations(pip: Path, commands: dict[str, Path], bench: BenchHost) -> dict[str, list[str]]:
    config = str(bench.config)
    runs = {"pip": [str(pip), "-config", config]}
    for label, path in commands.items():
        runs[label] = [str(path), "-config", config]
    host = bench.host
    runs["shell"] = ["/bin/sh", str(SHELL_HOOK), str(host.proc), str(host.dev), str(host.driver), LIB_DIR, " ".join(BINARIES), *LIBRARIES]
    return runs


def measure_hooks(
    benches: list[BenchHost], pip: Path, commands: dict[str, Path], runs: int, work: Path, template: Path
) -> dict[int, dict[str, Series]]:
    python = str(pip.parent / "python")
    results: dict[int, dict[str, Series]] = {}
    for bench in benches:
        labels = ["floor", *hook_configurations(pip, commands, bench), "ldconfig"]
        results[bench.gpu_count] = {label: Series(label) for label in labels}
    for rep in range(runs):
        for bench in benches:
            configs = hook_configurations(pip, commands, bench)
            labels = list(results[bench.gpu_count])
            shift = rep % len(labels)
            for label in labels[shift:] + labels[:shift]:  # a different order each round
                if label == "floor":
                    sample = spawn_timed([python, "-I", "-c", "pass"])[0]
                elif label == "ldconfig":
                    sample = ldconfig_sample(bench, work, template)
                else:
                    sample = hook_sample(configs[label], bench, work, template)
                results[bench.gpu_count][label].samples.append(sample)
        print(f"bench: round {rep + 1}/{runs} done", file=sys.stderr)
    return results


def measure_runc(bench: BenchHost, pip: Path, commands: dict[str, Path], runs: int, work: Path, template: Path) -> dict[str, Series]:
    """``runc run`` of a container that runs /bin/true, without and with the hook."""
    variants: dict[str, dict | None] = {"runc, no hook": None}
    for label, path in {"pip": pip, **commands}.items():
        variants[f"runc + {label} hook"] = {
            "prestart": [{"path": str(path), "args": ["ponytail", "-config", str(bench.config)]}]
        }
    results = {label: Series(label) for label in variants}
    log = bench.host.log
    for rep in range(runs):
        labels = list(variants)
        shift = rep % len(labels)
        for label in labels[shift:] + labels[:shift]:
            bundle = fresh_bundle(work, template, variants[label])
            before = log.read_text().count("injected into") if log.exists() else 0
            name = f"ponytail-bench-{os.getpid()}-{rep}"
            sample, code, err = spawn_timed(["/usr/sbin/runc", "run", "--bundle", str(bundle.path), name], cwd=str(bundle.path))
            if code != 0:
                subprocess.run(["runc", "delete", "-f", name], capture_output=True)
                raise SystemExit(f"{label}: runc run exit {code}: {err.strip()}")
            after = log.read_text().count("injected into") if log.exists() else 0
            if variants[label] is not None and after != before + 1:
                raise SystemExit(f"{label}: the hook did not log an injection")
            results[label].samples.append(sample)
    return results


def measure_pci_scan(pip: Path, bench: BenchHost, runs: int, work: Path) -> dict[str, Series]:
    """This machine's live /sys/bus/pci scanned as ponytail does it: with pyudev (what
    a live /sys gets today) or with plain sysfs reads (what a relocated sys root gets).
    First the scan alone in a fresh interpreter, import included; then a whole
    ``ponytail -debug`` whose config names the live /sys (pyudev) or a bind mount of it
    (sysfs reads), both run the same way in a private mount namespace."""
    python = str(pip.parent / "python")
    code = (
        "import time; t = time.perf_counter(); from ponytail.host import pci; "
        "n = len(pci.{}); print((time.perf_counter() - t) * 1000, n)"
    )
    scans = {"pyudev": "pci_functions_pyudev()", "sysfs": "pci_functions_sysfs('/sys')"}
    bind = work / "live-sys"
    bind.mkdir(exist_ok=True)
    configs = {}
    for label, sys_root in (("pyudev", "/sys"), ("sysfs", str(bind))):
        configs[label] = work / f"debug-{label}.toml"
        configs[label].write_text(bench.config.read_text().replace(f'sys_root = "{bench.host.sys}"', f'sys_root = "{sys_root}"'))
    results: dict[str, Series] = {}
    for rep in range(runs):
        for label in (["pyudev", "sysfs"] if rep % 2 == 0 else ["sysfs", "pyudev"]):
            out = subprocess.run([python, "-I", "-c", code.format(scans[label])], capture_output=True, text=True, check=True)
            ms, count = out.stdout.split()
            results.setdefault(f"scan: {label} ({count} PCI functions)", Series("")).samples.append(Sample(float(ms) / 1000, 0))
            script = f'mount --bind /sys {bind} && exec {pip} -debug -config {configs[label]}'
            sample, status, err = spawn_timed(["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script])
            if status != 0:
                raise SystemExit(f"ponytail -debug ({label}): exit {status}: {err.strip()}")
            results.setdefault(f"ponytail -debug: {label}", Series("")).samples.append(sample)
    return results


# -- report -------------------------------------------------------------------------


def machine() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}"


def table(rows: list[tuple[str, Series]], with_rss: bool = True) -> list[str]:
    """Wall time and CPU time (which varies much less than the wall time on a busy machine)."""
    head = "| configuration | median ms | quartiles ms | min–max ms | CPU median ms | CPU quartiles ms |" + (" peak RSS MiB |" if with_rss else "")
    lines = [head, "|" + " --- |" * (7 if with_rss else 6)]
    for name, s in rows:
        q1, q3 = s.quartiles()
        c1, c3 = s.quartiles(cpu=True)
        ms = s.ms()
        line = f"| {name} | {s.median():.1f} | {q1:.1f}–{q3:.1f} | {ms[0]:.1f}–{ms[-1]:.1f} | {s.median(cpu=True):.1f} | {c1:.1f}–{c3:.1f} |"
        if with_rss:
            line += f" {s.peak_rss_mib():.1f} |"
        lines.append(line)
    return lines


def report(hooks: dict[int, dict[str, Series]], runc: dict[str, Series], pci: dict[str, Series], runs: int, binaries: list[str]) -> list[str]:
    out = [f"Measured on: {machine()}; {runs} runs of each, interleaved.", ""]
    rows = [(f"{n} GPU{'s' if n > 1 else ''}: {label}", s) for n, series in hooks.items() for label, s in series.items()]
    out += table(rows)
    if runc:
        out += [""] + table(list(runc.items()), with_rss=False)
        bare = runc["runc, no hook"].median()
        for label, s in runc.items():
            if label != "runc, no hook":
                out.append(f"container-start overhead, {label}: {s.median() - bare:+.1f} ms (median with - median without)")
    if pci:
        out += ["", "This machine's live /sys/bus/pci: the scan alone (import + enumerate, in-process), then whole runs:"]
        out += table(list(pci.items()), with_rss=False)
    out += ["", "targets:"] + targets(hooks, binaries)
    return out


def targets(hooks: dict[int, dict[str, Series]], binaries: list[str]) -> list[str]:
    lines = []

    def check(ok: bool, text: str) -> None:
        lines.append(f"  {'met   ' if ok else 'MISSED'} {text}")

    if 8 in hooks:
        h = hooks[8]
        pip, floor, shell = h["pip"].median(), h["floor"].median(), h["shell"].median()
        check(pip <= 4 * floor, f"8 GPUs: pip {pip:.1f} ms <= 4 x floor {floor:.1f} ms ({pip / floor:.2f}x)")
        check(pip <= 0.35 * shell, f"8 GPUs: pip {pip:.1f} ms <= 0.35 x shell {shell:.1f} ms ({pip / shell:.2f}x)")
        for label in binaries:
            b = h[label].median()
            check(b <= 1.5 * pip, f"8 GPUs: {label} {b:.1f} ms <= 1.5 x pip {pip:.1f} ms ({b / pip:.2f}x)")
        if 64 in hooks:
            for label in ["pip", *binaries]:
                a, b = h[label].median(), hooks[64][label].median()
                check(b <= 1.5 * a, f"{label}: 64 GPUs {b:.1f} ms <= 1.5 x 8 GPUs {a:.1f} ms ({b / a:.2f}x)")
    for n, series in hooks.items():
        for label in ["pip", *binaries]:
            rss = series[label].peak_rss_mib()
            check(rss <= 40, f"{n} GPUs: {label} peak RSS {rss:.1f} MiB <= 40 MiB")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each configuration (default 15)")
    parser.add_argument("--gpus", default="1,8,64", help="GPU counts of the fake hosts (default 1,8,64)")
    parser.add_argument("--binary", action="append", default=[], metavar="LABEL=PATH", help="a binary to measure (repeatable; default: dist/)")
    parser.add_argument("--no-binary", action="store_true", help="measure no binary")
    parser.add_argument(
        "--command", action="append", default=[], metavar="LABEL=PATH",
        help="another ponytail command to measure beside them, e.g. an older version's (repeatable)",
    )
    parser.add_argument("--pip", metavar="PATH", help="an installed ponytail command instead of a fresh 'pip install .' venv")
    parser.add_argument("--no-runc", action="store_true", help="skip the runc runs")
    parser.add_argument("--no-pci", action="store_true", help="skip the live /sys/bus/pci scan")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench: run as root (it mounts and enters mount namespaces)", file=sys.stderr)
        return 2
    binaries = {}
    for item in [] if args.no_binary else args.binary or [f"binary={default_binary()}"]:
        label, _, path = item.partition("=")
        binaries[label] = Path(path).resolve()
    others = {label: Path(path).resolve() for label, _, path in (item.partition("=") for item in args.command)}
    work = Path(tempfile.mkdtemp(prefix="ponytail-bench-"))
    try:
        build_measure(work)
        pip = Path(args.pip).resolve() if args.pip else pip_install(work)
        counts = [int(n) for n in args.gpus.split(",")]
        benches = [build_host(work / f"host-{n}", n, work) for n in counts]
        template = make_rootfs(work / "image" / "rootfs", programs=())
        _write_runc_config(template.parent / "runc-config.json")
        hooks = measure_hooks(benches, pip, {**binaries, **others}, args.runs, work, template)
        runc_bench = next((b for b in benches if b.gpu_count == 8), benches[0])
        runc = {} if args.no_runc else measure_runc(runc_bench, pip, {**binaries, **others}, args.runs, work, template)
        pci = {} if args.no_pci else measure_pci_scan(pip, runc_bench, args.runs, work)
        print("\n".join(report(hooks, runc, pci, args.runs, list(binaries))))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _write_runc_config(path: Path) -> None:
    """``runc spec``'s config, made to run /bin/true from a writable rootfs without a terminal."""
    subprocess.run(["runc", "spec"], cwd=path.parent, check=True)
    spec = json.loads((path.parent / "config.json").read_text())
    (path.parent / "config.json").unlink()
    spec["root"] = {"path": "rootfs", "readonly": False}
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/bin/true"]
    path.write_text(json.dumps(spec))


if __name__ == "__main__":
    raise SystemExit(main())
