"""-debug's library search: the files skipped for another architecture are one line (a 32-bit
search meets every 64-bit library of the driver root's ld.so.cache: 27 of them for Debian's full
535 driver); every other skip keeps its own line, in its place."""

from __future__ import annotations

from ponytail.host.driver_files import SkippedFile
from ponytail.lite.records import replace
from ponytail.plan.render import render_plan

from support.hostdata import env_request, make_host, plan_for

WANTED_32 = "built for another architecture (ELF machine 62, 64-bit; wanted 32-bit)"
NV = "/usr/lib/x86_64-linux-gnu/nvidia/current"


def _skip_lines(skipped: tuple[SkippedFile, ...]) -> list[str]:
    host = make_host()
    plan = replace(plan_for(host=host), skipped=skipped)
    text = render_plan(plan, host, env_request({"NVIDIA_VISIBLE_DEVICES": "0"}), [])
    return [line for line in text.splitlines() if line.startswith("  skip ")]


def test_files_of_another_architecture_are_summarised_in_one_line() -> None:
    skipped = (
        SkippedFile("/usr/lib/libcuda.so.535.104.05", "driver version 535.104.05, but the running driver is 550.54.15"),
        *(SkippedFile(f"{NV}/lib{n}.so.535.309.01", WANTED_32) for n in ("cuda", "nvidia-ml", "GLX_nvidia")),
        SkippedFile("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", WANTED_32),
        SkippedFile("/usr/lib/libfoo.so.1.bak", "a renamed copy (only names ending in .so.<numbers> are libraries; a backup?)"),
    )
    assert _skip_lines(skipped) == [
        "  skip /usr/lib/libcuda.so.535.104.05: driver version 535.104.05, but the running driver is 550.54.15",
        f"  skip 4 files {WANTED_32}: in {NV} (3), /usr/lib/x86_64-linux-gnu (1)",
        "  skip /usr/lib/libfoo.so.1.bak: a renamed copy (only names ending in .so.<numbers> are libraries; a backup?)",
    ]


def test_one_file_of_another_architecture_keeps_its_own_line() -> None:
    assert _skip_lines((SkippedFile(f"{NV}/libcuda.so.535.309.01", WANTED_32),)) == [f"  skip {NV}/libcuda.so.535.309.01: {WANTED_32}"]
