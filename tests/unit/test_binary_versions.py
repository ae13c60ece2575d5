"""A node upgraded but not rebooted: the driver root's new nvidia-smi names the new driver's
version, which the kernel module is not; it is skipped like the new libraries beside it
(ponytail.host.driver_search). Programs are read only where such libraries were skipped."""

from __future__ import annotations

from pathlib import Path

from ponytail.host.driver_files import DriverFile, SkippedFile
from ponytail.host.driver_search import _binary_of_another_driver, _other_versions
from ponytail.host.features import versions_named

NEW, RUNNING = "535.309.01", "470.256.02"


def _program(path: Path, *versions: str, pad: int = 0) -> DriverFile:
    path.write_bytes(b"\x7fELF" + b"\0" * pad + b"".join(b"\0NVIDIA-SMI " + v.encode() + b"\0" for v in versions))
    return DriverFile("/usr/bin/nvidia-smi", str(path), "/usr/bin/nvidia-smi", None, "utility, in /usr/bin")


def test_the_versions_a_program_names_are_found_across_its_chunks(tmp_path: Path) -> None:
    program = _program(tmp_path / "smi", NEW, pad=(1 << 20) - 20)  # the version string straddles the 1 MiB reads
    assert versions_named(program.host_path, (RUNNING, NEW)) == {NEW}
    assert versions_named(str(tmp_path / "absent"), (NEW,)) == f"{tmp_path}/absent cannot be read to check its version: No such file or directory"


def test_a_program_of_the_skipped_libraries_version_is_skipped_too(tmp_path: Path) -> None:
    skipped = [
        SkippedFile(f"/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.{NEW}", f"driver version {NEW}, but the running driver is {RUNNING}"),
        SkippedFile("nvidia-debugdump", "utility: binary not found in the driver root's bin directories"),
    ]
    others = _other_versions(skipped)
    assert others == (NEW,)
    assert _binary_of_another_driver(_program(tmp_path / "new", NEW), others, RUNNING) == (
        f"driver version {NEW} (named in the program), but the running driver is {RUNNING}"
    )
    assert _binary_of_another_driver(_program(tmp_path / "both", NEW, RUNNING), others, RUNNING) == ""
    assert _binary_of_another_driver(_program(tmp_path / "none"), others, RUNNING) == ""  # names neither: kept
    assert _binary_of_another_driver(_program(tmp_path / "unread", NEW), (), RUNNING) == ""  # nothing skipped: never read
