"""The check-then-use race (CVE-2024-0132's class): while the hook runs, a hostile process keeps
swapping directories of the image for symlinks that point at the host, atomically
(renameat2 RENAME_EXCHANGE), as fast as it can. Whatever moment each run sees, nothing may
land outside the rootfs: ponytail resolves every path once, holding descriptors, and acts on
what it resolved. A run may succeed or fail (one line, exit 1); the host never changes."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.fakehost import FakeHost, compile_program, gpus
from support.hostile import Stage

RUNS = 40
LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[Stage]:
    s = Stage(tmp_path, FakeHost(tmp_path / "host", gpu_list=gpus(2)), container_id="racing")
    yield s
    s.close()


def swap_pairs(stage: Stage) -> list[str]:
    """Each directory the hook walks through, beside a symlink out of the rootfs to swap it with."""
    pairs = []
    for path, target in (
        (LIB, f"{stage.victim}/lib"),
        ("/dev", stage.escaping("/dev", f"{stage.victim}/dev")),
        ("/etc/ld.so.conf.d", f"{stage.victim}/etc/ld.so.conf.d"),
        ("/usr/bin", str(stage.victim)),
    ):
        real = stage.in_root(path)
        real.mkdir(parents=True, exist_ok=True)
        twin = real.with_name(real.name + ".twin")
        os.symlink(target, twin)
        pairs += [str(real), str(twin)]
    return pairs


@pytest.mark.slow
def test_swapping_directories_for_symlinks_during_many_runs_never_reaches_the_host(stage: Stage) -> None:
    swapper = subprocess.Popen([str(compile_program("swapper.c")), *swap_pairs(stage)], stdout=subprocess.PIPE, text=True)
    outcomes: dict[int, int] = {}
    try:
        for _ in range(RUNS):
            result = stage.inject()
            err = result.stderr.decode()
            assert result.returncode in (0, 1) and "Traceback" not in err and "internal error" not in err, err
            # one line for a failed start, none for a good one; a warning that the image lacks a library the
            # injected ones need (its /lib swapped for a link out of the rootfs, read inside it) is fair
            lines = [line for line in err.splitlines() if not line.startswith("ponytail: warning: ")]
            assert len(lines) == (result.returncode != 0), err
            outcomes[result.returncode] = outcomes.get(result.returncode, 0) + 1
    finally:
        swapper.send_signal(signal.SIGTERM)
        swaps = int(swapper.communicate(timeout=10)[0] or 0)
    assert swaps > 10 * RUNS, f"the swapper hardly ran ({swaps} swaps)"
    stage.assert_host_untouched()
    print(f"{RUNS} runs against {swaps} swaps: {outcomes.get(0, 0)} injected, {outcomes.get(1, 0)} refused")
