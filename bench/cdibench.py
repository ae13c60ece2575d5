#!/usr/bin/env python3
"""What a CDI container start pays for ponytail (run as root):

    .venv/bin/python bench/cdibench.py [--runs 21] [--podman-runs 11] [--gpus 8] [--command LABEL=PATH ...]
        [--generate-runs 21] [--generate-only]

On a fake host (bench/hookbench.py's: the full compute+utility file set, a driver-root
ld.so.cache of a real host's size), ``ponytail cdi generate`` writes the spec, then, side by
side and interleaved:

- ``ponytail cdi-hook`` alone, as runc runs it at createContainer: in a fresh private mount
  namespace, on a fresh copy of a busybox rootfs into which the spec's libraries are already
  placed (the engine's bind mounts), with a /proc/driver/nvidia to mask, the OCI state on
  stdin; every run checked (exit 0, the SONAME links and the linker cache made). Beside it
  the interpreter floor (``python -I -c pass``) and ``ldconfig -r`` alone;
- podman 4.3 (runc) starting ``/bin/true`` with ``--device nvidia.com/gpu=0`` (the spec in
  a private /run/cdi), the same plain, and the same with ponytail's prestart hook
  (hooks.d) instead of CDI: the difference of medians is what CDI costs a container start.

``ponytail cdi generate`` itself is measured too (``--generate-runs``; ``--generate-only``: it
alone), interleaved over the commands, as a node's unit runs it on every driver change: the spec
written again in place, in YAML and in JSON, beside NVIDIA's device plugin's and GPU Operator's
specs (captured from nvidia-ctk 1.20.0, ../shared/nvidia) of other kinds, so that its owner check
reads three specs; and in JSON alone, its owner check reading only its own spec. Wall and CPU time (user + system) of each run; CPU time varies less on a busy
machine.

NVIDIA's chain (``--nvidia-cdi-hook PATH``, built from NVIDIA's public sources: CONTRIBUTING.md, "Benchmarks")
runs beside it on the same work: its five createContainer hooks (create-symlinks with the same
links, enable-cuda-compat, update-ldcache, disable-device-node-modification,
update-application-profile), each its own process, their times summed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import hookbench  # noqa: E402
from hookbench import LIB_DIR, Sample, Series, build_host, build_measure, ldconfig_path, make_rootfs  # noqa: E402

REPO = BENCH.parent
CAPTURED = Path(os.environ.get("PONYTAIL_NVIDIA_CAPTURED", str(REPO.parent / "shared/nvidia"))) / "specs-1.20.0"
NEIGHBOURS = ("2gpu-device-plugin-names.yaml", "2gpu-management.yaml")  # other kinds than ponytail's nvidia.com/gpu
GENERATE_CASES = (("yaml", True), ("json", True), ("json", False))  # (format, beside NVIDIA's specs)
NVIDIA_CHAIN_MS = 37.5  # measured once: the 5 nvidia-cdi-hook processes of NVIDIA's spec, on the development machine
NVIDIA = "NVIDIA: 5 nvidia-cdi-hook processes"


def timed_in_namespace(argv: list[str], stdin: bytes, rootfs: Path | None = None) -> tuple[Sample, int, str]:
    """``argv`` under bench/measure.c, itself in a fresh private mount namespace (the container's,
    with the rootfs bind-mounted on itself as runc has it at createContainer)."""
    return chain_in_namespace([argv], stdin, rootfs)


def chain_in_namespace(chain: list[list[str]], stdin: bytes, rootfs: Path | None = None) -> tuple[Sample, int, str]:
    """Each command of ``chain`` in turn, as a runtime runs a spec's hooks, each under bench/measure.c with
    the state on its stdin, in one fresh private mount namespace; their wall times summed, the largest RSS."""
    assert hookbench.MEASURE is not None
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryFile() as err:
        state = Path(scratch) / "state"
        state.write_bytes(stdin)
        script = f'mount --bind "{rootfs}" "{rootfs}" && ' if rootfs else ""
        script += " && ".join(f'"$0" {scratch}/r{i} "${{@:{1 + sum(len(c) + 1 for c in chain[:i])}:{len(c)}}}" < {state}' for i, c in enumerate(chain))
        argv = [arg for command in chain for arg in (*command, "--")]
        subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script, str(hookbench.MEASURE), *argv],
                       stdout=subprocess.DEVNULL, stderr=err, env=hookbench.HOOK_ENV, check=True)
        err.seek(0)
        total, peak, worst = 0, 0, 0
        for i in range(len(chain)):
            ns, rss, code = (int(x) for x in (Path(scratch) / f"r{i}").read_text().split())
            total, peak, worst = total + ns, max(peak, rss), worst or code
        return Sample(total / 1e9, peak), worst, err.read().decode(errors="replace")


def fresh_container(work: Path, template: Path, host_libdir: Path, version: str, gpu_minor: int) -> tuple[Path, bytes]:
    """A bundle as the engine leaves it at createContainer: rootfs with the driver's files and
    nodes in place, config.json listing the created nodes; (rootfs, OCI state)."""
    bundle = work / "bundle"
    if bundle.exists():
        shutil.rmtree(bundle)
    rootfs = bundle / "rootfs"
    shutil.copytree(template, rootfs, symlinks=True)
    for stem in hookbench.LIBRARIES:
        shutil.copy(host_libdir / f"{stem}.so.{version}", rootfs / LIB_DIR.lstrip("/"))
    (rootfs / "proc/driver/nvidia").mkdir(parents=True)
    shutil.copy(host_libdir.parents[3] / "proc/driver/nvidia/params", rootfs / "proc/driver/nvidia/params")
    devices = [{"path": f"/dev/nvidia{gpu_minor}", "type": "c", "major": 195, "minor": gpu_minor}]
    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["true"], "env": []}, "linux": {"devices": devices}}
    (bundle / "config.json").write_text(json.dumps(config))
    state = {"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": 0, "bundle": str(bundle)}
    return rootfs, json.dumps(state).encode()


def hook_run(chain: list[list[str]], work: Path, template: Path, host_libdir: Path, version: str) -> Sample:
    rootfs, state = fresh_container(work, template, host_libdir, version, 0)
    sample, code, err = chain_in_namespace(chain, state, rootfs)
    if code != 0 or not (rootfs / LIB_DIR.lstrip("/") / "libcuda.so.1").is_symlink() or not (rootfs / "etc/ld.so.cache").exists():
        raise SystemExit(f"{chain[0][0]}: exit {code}: {err.strip()}")
    return sample


def nvidia_chain(hook: str, args: list[str]) -> list[list[str]]:
    """The five hooks NVIDIA's spec runs at createContainer for the same work (nvidia-ctk 1.20)."""
    links = [f"{args[i + 2]}::{args[i + 1]}" for i, a in enumerate(args) if a == "--link"]
    folders = [args[i + 1] for i, a in enumerate(args) if a == "--directory"]
    version = args[args.index("--driver-version") + 1]
    return [
        [hook, "create-symlinks", *(x for link in links for x in ("--link", link))],
        [hook, "enable-cuda-compat", f"--host-driver-version={version}"],
        [hook, "update-ldcache", *(x for f in folders for x in ("--folder", f)), "--ldconfig-path", ldconfig_path()],
        [hook, "disable-device-node-modification"],
        [hook, "update-application-profile"],
    ]


def podman_run(base: list[str], spec: Path, template: Path, work: Path, extra: list[str]) -> float:
    rootfs = work / "podman-rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    shutil.copytree(template, rootfs, symlinks=True)
    command = base + ["run", "--rm", "--network=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
                      *extra, "--rootfs", str(rootfs), "/bin/true"]
    script = f'mount -t tmpfs tmpfs /run && mkdir /run/cdi && cp {spec} /run/cdi/ && exec "$@"'
    start = time.monotonic()
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *command],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"podman {' '.join(extra)}: exit {result.returncode}: {result.stderr.strip()[-400:]}")
    return elapsed


def generate_series(commands: dict[str, str], config: Path, work: Path, gpus: int, runs: int) -> list[Series]:
    """``cdi generate`` of each command, in each form, interleaved: the spec written again in place
    beside NVIDIA's specs of other kinds."""
    series = {}
    for form, beside in GENERATE_CASES:
        for label, command in commands.items():
            directory = work / f"generate-{label}-{form}-{beside}"
            directory.mkdir()
            for name in NEIGHBOURS if beside else ():
                if (CAPTURED / name).is_file():
                    (directory / name).write_text((CAPTURED / name).read_text().replace("@FAKEHOST@", str(work)))
            argv = [command, "cdi", "generate", "--format", form, "--output", str(directory / f"nvidia.{form}"), "-config", str(config),
                    "--hook-path", command]
            where = "beside NVIDIA's specs" if beside else "alone"
            series[(form, beside, label)] = (Series(f"{gpus} GPUs, cdi generate {form}, {where}: {label}"), argv)
            _generate_once(argv)  # the first writes the spec and warms the probe cache
    for _ in range(runs):
        for one, argv in series.values():
            one.samples.append(_generate_once(argv))
    return [one for one, _ in series.values()]


def _generate_once(argv: list[str]) -> Sample:
    sample, code, err = hookbench.spawn_timed(argv)
    if code != 0:
        raise SystemExit(f"{' '.join(argv[:3])}: exit {code}: {err.strip()}")
    return sample


def generate_table(series: list[Series], commands: dict[str, str]) -> None:
    print("| configuration | median ms | quartiles ms | min–max ms | CPU median ms |\n| --- | --- | --- | --- | --- |")
    for one in series:
        cpu = statistics.median(s.cpu_seconds * 1000 for s in one.samples)
        print(row(one, False) + f" {cpu:.1f} |")
    first = next(iter(commands))
    for one in series:
        if not one.label.endswith(f": {first}"):
            base = next(s for s in series if s.label == one.label.rsplit(": ", 1)[0] + f": {first}")
            cpu = [statistics.median(s.cpu_seconds for s in x.samples) for x in (one, base)]
            print(f"{one.label} / {first}: {one.median() / base.median():.2f}x wall, {cpu[0] / cpu[1]:.2f}x CPU (medians)")


def row(series: Series, rss: bool) -> str:
    q1, q3 = series.quartiles()
    ms = series.ms()
    text = f"| {series.label} | {series.median():.1f} | {q1:.1f}–{q3:.1f} | {ms[0]:.1f}–{ms[-1]:.1f} |"
    return text + (f" {series.peak_rss_mib():.1f} |" if rss else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--podman-runs", type=int, default=11)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--nvidia-cdi-hook", metavar="PATH", default="/tmp/nvidia-tools/bin/nvidia-cdi-hook",  # noqa: S108 - where CONTRIBUTING.md builds it
                        help="NVIDIA's nvidia-cdi-hook (built from NVIDIA's public sources: CONTRIBUTING.md, Benchmarks), measured beside ponytail's")
    parser.add_argument("--command", action="append", default=[], metavar="LABEL=PATH", help="a ponytail command to measure (default: .venv's, and dist/'s binary if built)")
    parser.add_argument("--generate-runs", type=int, default=21, help="runs of each command's 'cdi generate', in each form (0: none)")
    parser.add_argument("--generate-only", action="store_true", help="measure 'cdi generate' alone, not the hooks nor podman")
    options = parser.parse_args()
    commands = dict(c.split("=", 1) for c in options.command) or {"pip": str(REPO / ".venv/bin/ponytail")}
    if not options.command and (REPO / "dist/ponytail/ponytail").is_file():
        commands["binary"] = str(REPO / "dist/ponytail/ponytail")
    work = Path(tempfile.mkdtemp(prefix="ponytail-cdibench-"))
    state = Path(tempfile.mkdtemp(prefix="ponytail-cdibench-podman-"))
    try:
        build_measure(work)
        bench = build_host(work / "host", options.gpus, work)
        template = make_rootfs(work / "template", programs=())
        spec = work / "nvidia.yaml"
        first = next(iter(commands.values()))
        generated = generate_series(commands, bench.config, work, options.gpus, options.generate_runs) if options.generate_runs else []
        if options.generate_only:
            print(f"cdi generate, {options.gpus} GPUs, {options.generate_runs} runs each, interleaved:")
            generate_table(generated, commands)
            return 0
        subprocess.run([first, "cdi", "generate", "-config", str(bench.config), "--capabilities", "utility,compute",
                        "--hook-path", first, "--output", str(spec)], check=True)
        import yaml

        hook = yaml.safe_load(spec.read_text())["containerEdits"]["hooks"][0]
        args = hook["args"][1:]
        libdir = bench.host.driver / LIB_DIR.lstrip("/")
        version = bench.host.driver_version
        chains = {f"cdi-hook: {label}": [[path, *args]] for label, path in commands.items()}
        if Path(options.nvidia_cdi_hook).is_file():
            nvidia = work / "nvidia-cdi-hook"
            shutil.copy(options.nvidia_cdi_hook, nvidia)
            chains[NVIDIA] = nvidia_chain(str(nvidia), args)
        hooks = {label: Series(label) for label in chains}
        floor, ldconfig = Series("floor: python -I -c pass"), Series("ldconfig -r alone")
        for _ in range(options.runs):
            for label, chain in chains.items():
                hooks[label].samples.append(hook_run(chain, work, template, libdir, version))
            floor.samples.append(timed_in_namespace([sys.executable, "-I", "-c", "pass"], b"")[0])
            rootfs, _ = fresh_container(work, template, libdir, version, 0)
            ldconfig.samples.append(timed_in_namespace([ldconfig_path(), "-r", str(rootfs), LIB_DIR], b"")[0])

        hooks_dir = work / "hooks.d"
        subprocess.run([first, "install-hook", "--dir", str(hooks_dir), "--config", str(bench.config), "--path", first], check=True, stdout=subprocess.DEVNULL)
        base = ["podman", "--root", str(state / "root"), "--runroot", str(state / "run"), "--tmpdir", str(state / "tmp"),
                "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--runtime", "runc", "--hooks-dir", str(hooks_dir)]
        podman = {
            "plain": (Series("podman run, no GPU"), []),
            "cdi": (Series("podman run --device nvidia.com/gpu=0 (CDI + cdi-hook)"), ["--device", "nvidia.com/gpu=0"]),
            "prestart": (Series("podman run, ponytail prestart hook (hooks.d)"), ["--annotation", "com.example.gpu=true", "-e", "NVIDIA_VISIBLE_DEVICES=0"]),
        }
        if options.podman_runs:
            podman_run(base, spec, template, work, [])  # warm podman's storage
        for _ in range(options.podman_runs):
            for series, extra in podman.values():
                series.samples.append(Sample(podman_run(base, spec, template, work, extra), 0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["rm", "-rf", str(state)], check=False)

    print(f"createContainer hooks, {options.gpus} GPUs, compute+utility ({len(hookbench.LIBRARIES)} libraries), {options.runs} runs each:")
    print("| configuration | median ms | quartiles ms | min–max ms | peak RSS MiB |\n| --- | --- | --- | --- | --- |")
    for series in [*hooks.values(), floor, ldconfig]:
        print(row(series, True))
    if options.podman_runs:
        print(f"\npodman 4.3 + runc, /bin/true, {options.podman_runs} runs each:")
        print("| configuration | median ms | quartiles ms | min–max ms |\n| --- | --- | --- | --- |")
        for series, _ in podman.values():
            print(row(series, False))
        plain = podman["plain"][0].median()
        print(f"\nCDI start overhead: +{podman['cdi'][0].median() - plain:.1f} ms; prestart hook: +{podman['prestart'][0].median() - plain:.1f} ms (medians minus plain)")
    print(f"/ floor: {', '.join(f'{label} {s.median() / floor.median():.2f}x' for label, s in hooks.items())}")
    if generated:
        print(f"\ncdi generate, {options.gpus} GPUs, {options.generate_runs} runs each, interleaved:")
        generate_table(generated, commands)
    chain = hooks[NVIDIA].median() if NVIDIA in hooks else NVIDIA_CHAIN_MS
    where = "measured above, side by side" if NVIDIA in hooks else "the anchor's figure, not measured here"
    for label, series in hooks.items():
        if label != NVIDIA:
            ratio = series.median() / chain
            print(f"{label} {series.median():.1f} ms = {ratio:.2f}x NVIDIA's 5-hook chain ({chain:.1f} ms, {where}); target <= 0.5x: {'met' if ratio <= 0.5 else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
