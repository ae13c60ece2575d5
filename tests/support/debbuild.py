"""The Debian package of HEAD (and the same as an older version), built by ``make deb``'s script from a clean clone."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.commands import REPO

OLD_VERSION = "0.0.9"  # an older package to upgrade from


def changelog_version() -> str:
    return (REPO / "debian/changelog").read_text().split("(", 1)[1].split(")", 1)[0]


def build_debs(base: Path) -> dict[str, Path]:
    """{"new": the package of HEAD, OLD_VERSION: the same as that version}, lintian-clean."""
    clone = base / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    out = base / "out"
    built = {}
    for version in ("", OLD_VERSION):
        args = [str(clone / "scripts/build-deb.sh"), "--out", str(out), *(["--version", version] if version else [])]
        result = subprocess.run(args, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout + result.stderr
        # lintian prints nothing but its refusal to like root: no error, no warning, no info tag
        assert not [line for line in result.stdout.splitlines() if line[:2] in ("E:", "W:", "I:")], result.stdout
        built[version or "new"] = Path(result.stdout.strip().splitlines()[-1].split()[1])
    assert built["new"].name == f"ponytail_{changelog_version()}_all.deb"
    return built


def nvidia_package(out: Path) -> Path:
    """A stand-in of NVIDIA's nvidia-container-toolkit-base: its hook programs at their paths in /usr/bin."""
    tree = out / "nvidia-pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text("Package: nvidia-container-toolkit-base\nVersion: 1.20.0-1\nArchitecture: all\n"
                                         "Maintainer: test <test@example.invalid>\nDescription: stand-in of NVIDIA's package\n")
    (tree / "usr/bin").mkdir(parents=True)
    for name in ("nvidia-container-runtime-hook", "nvidia-cdi-hook", "nvidia-ctk"):
        (tree / "usr/bin" / name).write_text(f"#!/bin/sh\n# NVIDIA's {name} (stand-in)\n")
        (tree / "usr/bin" / name).chmod(0o755)
    deb = out / "nvidia-container-toolkit-base_1.20.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(tree), str(deb)], check=True, capture_output=True)
    return deb
