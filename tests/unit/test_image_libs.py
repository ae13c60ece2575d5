"""Which of the driver's dependencies an image lacks (ponytail.container.image_libs), on images
made in pytest's tmp: a trimmed glibc image, a merged-/usr one, a musl one, a link that tries to
lead out of the rootfs."""

from __future__ import annotations

from pathlib import Path

from ponytail.container.image_libs import lacking_dependencies, missing_in_image

LIBS = "usr/lib/x86_64-linux-gnu"
DEPS = ("libdl.so.2", "libpthread.so.0", "librt.so.1")


def _image(root: Path, names: tuple[str, ...], libdir: str = LIBS) -> Path:
    (root / libdir).mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / libdir / name).write_bytes(b"\x7fELF")
    return root


def test_a_glibc_image_without_the_split_out_libraries_lacks_them(tmp_path: Path) -> None:
    image = _image(tmp_path / "trimmed", ("libc.so.6", "libm.so.6"))
    assert missing_in_image(str(image), ("libm.so.6", *DEPS)) == DEPS
    full = _image(tmp_path / "full", ("libc.so.6", "libm.so.6", *DEPS))
    assert missing_in_image(str(full), DEPS) == ()


def test_a_merged_usr_image_is_read_through_its_links_inside_the_root(tmp_path: Path) -> None:
    image = _image(tmp_path / "merged", ("libc.so.6", "libdl.so.2"), libdir="usr/lib/x86_64-linux-gnu")
    (image / "lib").symlink_to("usr/lib")
    (image / "usr/lib/x86_64-linux-gnu/libpthread.so.0").symlink_to("/lib/x86_64-linux-gnu/libdl.so.2")  # absolute: inside the root
    (image / "usr/lib/x86_64-linux-gnu/librt.so.1").symlink_to("/../../../../usr/lib/x86_64-linux-gnu/libnothere.so")
    assert missing_in_image(str(image), DEPS) == ("librt.so.1",)  # the host's files never count


def test_an_image_without_glibc_is_not_judged(tmp_path: Path) -> None:
    musl = _image(tmp_path / "musl", ("ld-musl-x86_64.so.1",), libdir="lib")
    assert missing_in_image(str(musl), DEPS) == ()
    assert missing_in_image(str(tmp_path / "absent"), DEPS) == ()


def test_each_injected_file_is_named_with_what_it_lacks(tmp_path: Path) -> None:
    image = _image(tmp_path / "trimmed", ("libc.so.6", "libm.so.6"))
    files = [
        ("libcuda.so.1", ("libm.so.6", "libc.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")),  # as the real one
        ("libnvidia-ml.so.1", ("libc.so.6",)),
        ("/usr/bin/nvidia-smi", ("libnvidia-ml.so.1", "libdl.so.2")),  # libnvidia-ml.so.1 comes with the injection
    ]
    assert lacking_dependencies(str(image), files, {"libnvidia-ml.so.1"}) == [
        ("libcuda.so.1", DEPS), ("/usr/bin/nvidia-smi", ("libdl.so.2",)),
    ]
    assert lacking_dependencies(str(_image(tmp_path / "full", ("libc.so.6", "libm.so.6", *DEPS))), files, {"libnvidia-ml.so.1"}) == []
