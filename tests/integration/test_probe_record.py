"""The probe's search result is one record (ponytail.host.driver_files.FoundFiles): what the search
returns, what the probe cache stores (as the same plain tuples as before) and what it serves back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from support.fakehost import LIB_DIR, FakeHost


def test_the_cache_serves_back_the_record_the_search_returned(host: FakeHost, tmp_path: Path) -> None:
    from ponytail.host.driver_files import DriverFile, FoundFiles, SearchReport, SkippedFile
    from ponytail.host.probecache import cached_search

    library = f"{LIB_DIR}/libcuda.so.550.54.15"
    found = FoundFiles(
        libraries=(DriverFile(f"{LIB_DIR}/libcuda.so.1", f"{host.driver}{library}", library, "libcuda.so.1", "compute", 64),),
        reports=(SearchReport("libcuda", (library,)),),
        skipped=(SkippedFile(f"{LIB_DIR}/libnvidia-gone.so.1", "not found"),),
    )
    cache_dir, key = tmp_path / "cache", ("550.54.15", "a test")
    for _ in range(200):  # until the driver root's last change is more than a clock tick ago
        assert cached_search(str(cache_dir), str(host.driver), key, (LIB_DIR,), lambda: found) == found
        if list(cache_dir.glob("probe-*.cache")):
            break
        time.sleep(0.005)

    def not_again() -> FoundFiles:
        raise AssertionError("searched again: the cache was not believed")

    served = cached_search(str(cache_dir), str(host.driver), key, (LIB_DIR,), not_again)
    assert isinstance(served, FoundFiles) and served == found
    assert served.libraries[0].soname == "libcuda.so.1" and served.binaries == served.files == ()


@pytest.mark.parametrize("part", ["libraries", "reports", "skipped", "binaries", "files"])
def test_a_search_result_is_named_by_its_parts(part: str) -> None:
    from ponytail.host.driver_files import FoundFiles

    assert getattr(FoundFiles(), part) == ()
