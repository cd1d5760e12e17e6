"""Tensor maps (Hopper's TMA descriptors) for the kernels that copy boxes of a bf16 matrix
[rows, K] (tma.cuh): boxes of `box_rows` rows x 64 k with the 128-byte swizzle
(gemm_wgmma_layout.cuh's layout), zeros past its edges. A map holds only the address, shape,
row stride and box. A weight's is made once per weight and box and kept in device memory (128
bytes each); a CUDA graph replays the launch with the same map, made at its warm-up (making one
copies it to the device, which a capture cannot). A step's activations get one per launch
(``token_map``), passed by value as a kernel argument (``__grid_constant__``), which a graph
keeps with the launch."""

from __future__ import annotations

import functools

import torch

from .. import compiler

BOX_K = 64  # a box's k: 128 bytes of bf16, the swizzle's row
_maps: dict[tuple, torch.Tensor] = {}


def weight_map(w: torch.Tensor, box_rows: int) -> torch.Tensor:
    """The tensor map of contiguous bf16 `w` for boxes of box_rows x BOX_K, as 16 int64 words
    on w's device."""
    if not w.is_contiguous() or w.dtype != torch.bfloat16:
        raise ValueError(f"a tensor map needs a contiguous bf16 matrix, not {w.dtype} with "
                         f"strides {w.stride()}")
    key = (w.data_ptr(), tuple(w.shape), box_rows, w.device)
    if key not in _maps:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("a weight's tensor map is made outside a CUDA graph capture: "
                               "run the step once before capturing it")
        _maps[key] = _encode(w, box_rows)
    return _maps[key]


def token_map(x: torch.Tensor, box_rows: int) -> tuple[int, ...]:
    """The tensor map of bf16 `x` [n, K] (rows `x.stride(0)` elements apart, 16-byte aligned, as
    linear.gemv_ok takes them) for boxes of box_rows x BOX_K, as 16 unsigned 64-bit words (a
    kernel argument of kind "m")."""
    if (x.dtype != torch.bfloat16 or x.stride(1) != 1 or x.stride(0) % 8
            or x.data_ptr() % 16):
        raise ValueError(f"a tensor map needs a bf16 matrix of 16-byte aligned rows, not "
                         f"{x.dtype} with strides {x.stride()}")
    return _words(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0) * 2, box_rows)


def _encode(w: torch.Tensor, box_rows: int) -> torch.Tensor:
    words = _words(w.data_ptr(), w.shape[0], w.shape[1], w.shape[1] * w.element_size(),
                   box_rows)
    signed = [v - (1 << 64) if v >= 1 << 63 else v for v in words]
    return torch.tensor(signed, dtype=torch.int64).to(w.device)


@functools.lru_cache(maxsize=1024)  # a step's activations come from the same buffers each time
def _words(address: int, rows: int, k: int, row_bytes: int, box_rows: int) -> tuple[int, ...]:
    driver = compiler._driver()
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    tmap = compiler._check(driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, address,
        [u64(k), u64(rows)], [u64(row_bytes)], [u32(BOX_K), u32(box_rows)],
        [u32(1), u32(1)], driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled")
    return tuple(int(v) for v in tmap.opaque)  # 16 unsigned 64-bit words
