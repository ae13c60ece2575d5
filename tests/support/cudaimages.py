"""NVIDIA_REQUIRE_CUDA as real nvidia/cuda images set it, copied from their Dockerfiles
(gitlab.com/nvidia/container-images/cuda, dist/<version>/ubuntu2204/base, x86_64): every
supported branch listed once per brand, ``cuda>=`` the image's version first."""

from __future__ import annotations

_BRANDS = ("tesla", "unknown", "nvidia", "nvidiartx", "geforce", "geforcertx", "quadro", "quadrortx", "titan", "titanrtx")


def _rows(branch: int) -> str:
    return " ".join(f"brand={brand},driver>={branch},driver<{branch + 1}" for brand in _BRANDS)


# nvidia/cuda:11.8.0-base-ubuntu22.04
CUDA_11_8 = "cuda>=11.8 " + _rows(470)
# nvidia/cuda:12.2.2-base-ubuntu22.04
CUDA_12_2 = "cuda>=12.2 " + _rows(470) + " " + _rows(525)
# nvidia/cuda:12.2.2-base-ubuntu22.04 on arm64 (sbsa): no brand rows
CUDA_12_2_SBSA = "cuda>=12.2"
