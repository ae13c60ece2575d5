"""What each capability injects from Debian's full 535 driver, against NVIDIA's own lists.

NVIDIA_LISTS is written here from libnvidia-container's per-capability lists (src/nvc_info.c:
utility_bins, compute_bins, utility_libs, compute_libs, video_libs, graphics_libs,
graphics_libs_glvnd, ngx_libs; its GSP firmware lookup) and from the files NVIDIA's container
toolkit adds for graphics and display (OptiX's nvoptix.bin, the glvnd and Vulkan ICD files, Xorg's
driver and GLX server module). Every one of those the real driver root has must be injected with
its capability; and what ponytail injects beyond them is a short list, said here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support.commands import PONYTAIL
from support.realdriver import DriverRoot, RealDriverHost


def _caps(**lists: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return lists


NVIDIA_LISTS: dict[str, dict[str, tuple[str, ...]]] = {
    "utility": _caps(
        libraries=("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
        binaries=("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    ),
    "compute": _caps(
        libraries=(
            "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
            "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
            "libnvidia-pkcs11-openssl3", "libnvidia-nvvm", "libnvidia-tileiras",
        ),
        binaries=("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
    ),
    "video": _caps(libraries=("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid")),
    "graphics": _caps(
        libraries=(
            "libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc", "libnvidia-ifr",
            "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia",
            "libnvidia-glvkspirv", "libnvidia-cbl",
        ),
        files=(
            "/usr/share/nvidia/nvoptix.bin", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/vulkan/icd.d/nvidia_icd.json",
        ),
    ),
    "display": _caps(
        files=("/usr/lib/xorg/modules/drivers/nvidia_drv.so", "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"),
    ),
    "ngx": _caps(libraries=("libnvidia-ngx",)),
}
IMPLIES = {"video": ("compute",)}
# what ponytail injects beyond NVIDIA's lists, on purpose: the EGL Wayland platform library (commented
# out in nvc_info.c; NVIDIA's toolkit mounts it for graphics), the OpenCL ICD file, the Vulkan
# implicit layer and EGL platform files, the xorg.conf.d snippets
EXTRA_LIBRARIES = {"graphics": ("libnvidia-egl-wayland",)}
EXTRA_FILES = (
    "/etc/OpenCL/vendors/nvidia.icd", "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/egl/egl_external_platform.d/", "/usr/share/X11/xorg.conf.d/", "/lib/firmware/nvidia/",
)


def injected(host: RealDriverHost, capability: str, image: Path) -> list[tuple[str, str]]:
    """(target, kind) of each file -debug plans to mount for ``capability``."""
    result = subprocess.run([*PONYTAIL, "-config", str(host.write_config()), "-debug", "-capabilities", capability, "-root", str(image)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    found = []
    for line in result.stdout.splitlines():
        words = line.split()
        if line.startswith("  mount ") and len(words) > 4 and words[2] == "->" and words[4].rstrip(",") in ("(library", "(binary", "(file"):
            found.append((words[3], words[4].strip("(,")))
    return found


def real_libraries(root: DriverRoot) -> dict[str, str]:
    """stem -> file name of every library of the driver's version in the root (libcuda.so.535.309.01)."""
    found = {}
    for directory, _, names in os.walk(root.path / "usr/lib"):
        for name in names:
            stem, so, version = name.partition(".so.")
            if so and version == root.version and not os.path.islink(os.path.join(directory, name)):
                found[stem] = name
    return found


@pytest.mark.parametrize("capability", list(NVIDIA_LISTS))
def test_every_file_nvidia_lists_is_injected_and_nothing_unlisted(
    capability: str, wide: DriverRoot, wide_host: RealDriverHost, image: Path
) -> None:
    caps = (capability, *IMPLIES.get(capability, ()))
    targets = injected(wide_host, capability, image)
    names = {os.path.basename(t) for t, kind in targets if kind == "library"}
    libraries = real_libraries(wide)
    nvidia = [stem for cap in caps for stem in NVIDIA_LISTS[cap].get("libraries", ())]
    assert [libraries[stem] for stem in nvidia if stem in libraries and libraries[stem] not in names] == []
    binaries = [b for cap in caps for b in NVIDIA_LISTS[cap].get("binaries", ()) if (wide.path / "usr/bin" / b).exists() or (wide.path / "usr/sbin" / b).exists()]
    assert [b for b in binaries if (f"/usr/bin/{b}", "binary") not in targets] == []
    files = [f for cap in caps for f in NVIDIA_LISTS[cap].get("files", ()) if os.path.lexists(f"{wide.path}{f}")]
    assert [f for f in files if f not in {t for t, _ in targets}] == []
    # nothing beyond NVIDIA's lists but the few said above
    allowed = {*nvidia, *(s for cap in caps for s in EXTRA_LIBRARIES.get(cap, ()))}
    assert sorted(n for n in names if n.partition(".so")[0] not in allowed and not n.endswith(".so")) == []
    others = [t for t, kind in targets if kind == "file" and t not in files and not t.startswith(EXTRA_FILES)]
    assert others == []
    assert any(t.startswith(f"/lib/firmware/nvidia/{wide.version}/gsp_") for t, _ in targets)  # GSP firmware, with any capability


def test_the_gaps_debian_showed_are_closed(wide_host: RealDriverHost, image: Path) -> None:
    """Debian's GLX server module has no version suffix; OptiX reads nvoptix.bin."""
    assert ("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so", "library") in injected(wide_host, "display", image)
    assert ("/usr/share/nvidia/nvoptix.bin", "file") in injected(wide_host, "graphics", image)
