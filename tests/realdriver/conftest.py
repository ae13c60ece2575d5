"""The real-driver tier's fixtures: Debian's driver roots (built once, cached outside the
checkout; skipped where Debian's archive cannot be reached) and one fake host per root and
module, which the tests only read (the not-rebooted host and the mixed-brand one are their own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.realdriver import DriverRoot, RealDriverHost, driver_root, mixed_gpus, real_host, snapshot


def _untouched(name: str) -> Iterator[DriverRoot]:
    """The cached root ``name``, which must be exactly as it was when the tier ends."""
    root = driver_root(name)
    before = snapshot(root.path)
    yield root
    assert snapshot(root.path) == before, f"the tier changed the cached root {root.path}"


@pytest.fixture(scope="session")
def root535() -> Iterator[DriverRoot]:
    yield from _untouched("driver-535")


@pytest.fixture(scope="session")
def root470() -> Iterator[DriverRoot]:
    yield from _untouched("driver-470")


@pytest.fixture(scope="session")
def wide() -> Iterator[DriverRoot]:
    yield from _untouched("driver-535-wide")


@pytest.fixture(scope="module")
def host535(root535: DriverRoot, tmp_path_factory: pytest.TempPathFactory) -> RealDriverHost:
    return real_host(tmp_path_factory.mktemp("host535"), root535)


@pytest.fixture(scope="module")
def host470(root470: DriverRoot, tmp_path_factory: pytest.TempPathFactory) -> RealDriverHost:
    """The 470 driver on a Tesla and a GeForce card."""
    return real_host(tmp_path_factory.mktemp("host470"), root470, gpu_list=mixed_gpus())


@pytest.fixture(scope="module")
def wide_host(wide: DriverRoot, tmp_path_factory: pytest.TempPathFactory) -> RealDriverHost:
    return real_host(tmp_path_factory.mktemp("wide"), wide)


@pytest.fixture(params=["driver-535", "driver-470"])
def either(request: pytest.FixtureRequest, host535: RealDriverHost, host470: RealDriverHost) -> tuple[DriverRoot, RealDriverHost]:
    """Each real driver with its host."""
    roots = {"driver-535": request.getfixturevalue("root535"), "driver-470": request.getfixturevalue("root470")}
    return roots[request.param], {"driver-535": host535, "driver-470": host470}[request.param]


@pytest.fixture
def image(tmp_path: Path) -> Path:
    from support.realdriver import real_rootfs

    return real_rootfs(tmp_path / "rootfs")
