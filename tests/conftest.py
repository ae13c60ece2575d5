from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))  # the helpers: tests/support (import them as support.<module>)

from support.commands import BINARY, PONYTAIL, REPO  # noqa: E402  (the commands under test)
from support.engines import DaemonDidNotStart  # noqa: E402
from support.fakehost import FakeHost, gpus, make_rootfs  # noqa: E402
from support.guard import guard_against_bare_python  # noqa: E402
from support.harness import Sleeper  # noqa: E402

PYTHON_GUARD = guard_against_bare_python()  # for the whole run: a bare python3 from PATH fails loudly

# Hypothesis: the default profile keeps a run quick; `ci` (HYPOTHESIS_PROFILE=ci or --hypothesis-profile=ci,
# what make test and .ci/run use) tries ten times as many examples. No database: runs leave no .hypothesis/
# behind and do not depend on one another; no deadline: a loaded 2-core machine is no finding.
settings.register_profile("default", max_examples=100, deadline=None, database=None)
settings.register_profile("ci", max_examples=1000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

TESTS = Path(__file__).resolve().parent
KIND_MARKERS = {"unit": "unit", "engines": "engine", "realdriver": "real_driver", "deb": "deb"}  # folder under tests/ -> marker (integration and security: root)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers by folder: tests/unit gets `unit`, tests/engines `engine`, and every test that is not a unit test
    `root` (it builds fake hosts with mknod, mounts, or starts containers). A unit test that needs root carries
    `root` itself; without root such tests are skipped with that reason, rather than failing."""
    not_root = os.geteuid() != 0
    # the real-driver tier builds Debian roots (minutes, Debian's archive): only when asked for by its marker
    real_driver = "real_driver" in (config.getoption("markexpr", "") or "")
    # so does the current-engines tier (a Debian sid root): make test-engines runs it, after make test
    current_engines = "current_engines" in (config.getoption("markexpr", "") or "")
    for item in items:
        kind = item.path.resolve().relative_to(TESTS).parts[0]
        if kind in KIND_MARKERS:
            item.add_marker(KIND_MARKERS[kind])
        if item.get_closest_marker("unit") is None:
            item.add_marker("root")
        if item.get_closest_marker("real_driver") is not None and not real_driver:
            item.add_marker(pytest.mark.skip(reason="the real-driver tier: run it with make test-real-driver (pytest -m real_driver)"))
        if item.get_closest_marker("current_engines") is not None and not current_engines:
            item.add_marker(pytest.mark.skip(reason="the current-engines tier: run it with make test-engines (pytest -m current_engines)"))
        if not_root and item.get_closest_marker("root") is not None:
            item.add_marker(pytest.mark.skip(reason="needs root (marked root): run the suite as root"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    """A daemon that a fixture started and that died or did not come up fails the test that needed
    it, with the end of the daemon's log, rather than being shown as an error of the fixture."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "setup" and call.excinfo is not None and call.excinfo.errisinstance(DaemonDidNotStart):
        report.when = "call"


@pytest.fixture(scope="session")
def binary() -> Path:
    """The self-contained executable of ``make binary``, built or brought up to date once per run."""
    subprocess.run(["make", "-s", "-C", str(REPO), "binary"], check=True, stdout=subprocess.DEVNULL)
    return BINARY


@pytest.fixture(params=["installed", "binary"])
def ponytail_command(request: pytest.FixtureRequest) -> list[str]:
    """The ponytail command both ways it ships: the pip-installed command and the binary."""
    if request.param == "binary":
        return [str(request.getfixturevalue("binary"))]
    return PONYTAIL


def _host_shape(request: pytest.FixtureRequest) -> dict:
    """The FakeHost keyword arguments of the test module's ``HOST_SHAPE``; by default 3 GPUs
    whose minors are out of PCI order (index 0 is /dev/nvidia2)."""
    return dict(getattr(request.module, "HOST_SHAPE", None) or {"gpu_list": gpus(3, minors=[2, 0, 1])})


@pytest.fixture
def host(tmp_path: Path, request: pytest.FixtureRequest) -> FakeHost:
    """A fake NVIDIA host of its own for each test (which may change it), shaped by the
    module's ``HOST_SHAPE``."""
    return FakeHost(tmp_path / "host", **_host_shape(request))


@pytest.fixture(scope="module")
def shared_host(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> FakeHost:
    """One fake NVIDIA host for all the tests of a module, which only read it (building a host
    compiles and runs ldconfig); shaped by the module's ``HOST_SHAPE``."""
    return FakeHost(tmp_path_factory.mktemp("host"), **_host_shape(request))


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    return make_rootfs(tmp_path / "rootfs", programs=("cudacheck.c",))


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    s = Sleeper()
    yield s
    s.stop()
