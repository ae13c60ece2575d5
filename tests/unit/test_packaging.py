"""The Debian package's description (debian/) agrees with the project's: its version, and a Debian
package of at least the version pyproject.toml asks for behind every dependency."""

from __future__ import annotations

import re
from pathlib import Path

import ponytail

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
# pyproject's distribution -> Debian 12's package; nvidia-ml-py (MIG UUIDs only) is suggested, not depended on
DEBIAN_NAMES = {"click": "python3-click", "pyudev": "python3-pyudev", "pyyaml": "python3-yaml", "tomlkit": "python3-tomlkit"}


def test_the_package_version_is_the_project_version() -> None:
    changelog = (REPO / "debian/changelog").read_text()
    assert re.match(r"ponytail \(([^)]+)\)", changelog).group(1) == ponytail.__version__  # type: ignore[union-attr]
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] == ponytail.__version__


def test_every_dependency_is_a_debian_package_of_the_version_asked() -> None:
    control = (REPO / "debian/control").read_text()
    package = control.split("\nPackage: ponytail\n", 1)[1]
    depends = re.search(r"^Depends:(.*?)^\S", package, re.M | re.S).group(1)  # type: ignore[union-attr]
    suggests = re.search(r"^Suggests:(.*)$", package, re.M).group(1)  # type: ignore[union-attr]
    for requirement in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, minimum = re.match(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement).groups()  # type: ignore[union-attr]
        if "python_version < '3.11'" in requirement:
            continue  # tomli: Debian 12's python3 is 3.11, which has tomllib
        if name == "nvidia-ml-py":
            assert f"python3-pynvml (>= {minimum})" in suggests
            continue
        assert f"{DEBIAN_NAMES[name.lower()]} (>= {minimum})" in depends, name
