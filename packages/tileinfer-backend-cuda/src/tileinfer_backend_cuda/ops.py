"""The CUDA backend's ops: thin wrappers that check layouts, pick a kernel variant and a grid, and
launch on PyTorch's current stream (see ``compiler.py``).

Every op writes into the tensors it is given, allocates nothing and never reads device memory on
the host, so a whole step can be captured in a CUDA graph. Inputs the kernels do not handle
(other dtypes, non-contiguous layouts, odd head sizes) go to the ref backend's implementation,
which is correct but may allocate; ``fallback_counts`` records each such call by reason.
"""

from __future__ import annotations

import math
import os
import threading
from collections import Counter

import torch
import tileinfer_backend_ref as _ref
from tileinfer.backend.sampling import SamplingParams

from . import compiler

# Kernel argument kinds: p pointer, i int32, q int64, f float32 (compiler._CTYPES).
_DTYPE_NAMES = {torch.bfloat16: "bf16_t", torch.float16: "f16_t", torch.float32: "float"}

# Decode GEMV for at most this many token rows (the n = 8 side of one mma).
GEMV_MAX_TOKENS = 8
# Split-KV attention for steps of at most this many query rows; its workspace holds this many.
SPLIT_MAX_TOKENS = 32
MAX_SPLITS = 64  # workspace capacity; the split count actually used: attention_config
ATTN_BLOCK_N = 64  # keys per tile of attention.cu
ATTN_BLOCK_M = 64  # packed query rows per block of attention.cu
# Steps of at most this many query tokens per sequence (decode, speculative verify: 16 is a
# DFlash block of the "-b16" drafters) run attention_decode.cu, whose four warps split each key
# tile; longer steps (prefill) run attention.cu.
ATTN_DECODE_MAX_TOKENS = 16
# Attention launch settings. attention.cu: "blocks_per_sm": the split-KV target (splits are
# added until the grid has about this many blocks per SM), "stages": the K/V cp.async ring depth
# (KV_STAGES). attention_decode.cu: "decode": use it (False: decode steps run attention.cu, for
# comparisons), "decode_blocks_per_sm": its split-KV target, "decode_stages": its ring depth
# (0: the deepest ring with which decode_blocks_per_sm blocks fit on an SM,
# attention_decode_stages), "decode_pdl_trigger": where its blocks let the next kernel launch
# ("start" or "after_loop", attention_decode.cu's PDL_TRIGGER); overrides may also force
# "decode_m_tiles" (1 or 2: the same bits per row, attention_decode_m_tiles);
# "decode_fused_inputs": attention_with_inputs runs one kernel for 1-token steps (False: the two
# ops' kernels, for comparisons); "decode_combine_batch": the splits whose partials the combine
# requests at once (COMBINE_BATCH: 8, 16 or 32); "decode_min_split_tiles": the fewest 64-key
# tiles a split takes (MIN_SPLIT_TILES: shorter contexts take fewer splits; 2 or 4 made the
# llama3-8b step at context 144 slower on the H200). The decode split count depends on the
# batch, the kv heads and the GPU, never on the step's token count or the cache's size, and each
# row's split boundaries on its own context only (see attention_decode.cu), so a row of a verify
# step equals the 1-token step at its position bit for bit, also on another cache (greedy
# speculative decoding relies on this). Two ring stages by default: the fastest per op on the
# H200 at 8k and 32k context (bf16 and INT8 pages), the same as the automatic depth end to end.
ATTN_CONFIG = {"blocks_per_sm": 2, "stages": 2,
               "decode": True, "decode_blocks_per_sm": 2, "decode_stages": 2,
               "decode_pdl_trigger": "after_loop", "decode_fused_inputs": True,
               "decode_combine_batch": 8, "decode_min_split_tiles": 1}
# attention_decode.cu's defaults, passed only when the config differs (one cache key)
_KERNEL_DEFAULTS = {"decode_combine_batch": ("COMBINE_BATCH", 8),
                    "decode_min_split_tiles": ("MIN_SPLIT_TILES", 1)}
_PDL_TRIGGERS = {"start": 0, "after_loop": 1}
# Tuning overrides for benchmarks (same keys as ATTN_CONFIG).
attention_overrides: dict = {}

fallback_counts: Counter = Counter()

# Tuning overrides for benchmarks: e.g. {"warps": 8, "stages": 6, "l2_256b": True} forces the
# GEMV variant, {"kernel": "rows", "rows": 4, "unroll": 2, "warps": 2, "split_k": 1} the row-streaming
# kernel's (see gemv_config).
gemv_overrides: dict = {}

# The decode GEMV's kernel family: "rows" (gemv_rows.cu: each warp streams a few whole rows along K
# with 16-byte register loads, split-K where the output is narrow) or "mma" (gemv.cu: tensor-core
# fragments fed through a cp.async ring). TILEINFER_CUDA_GEMV=mma selects the old one, e.g. to
# compare them. Where the rows kernel cannot run (INT8 weights with K % 16 != 0), "mma" is used.
GEMV_KERNEL = os.environ.get("TILEINFER_CUDA_GEMV", "rows")

# Programmatic dependent launch on the decode path (on by default; TILEINFER_CUDA_PDL=0 turns it
# off; a layer's kernel chain measured 7-13% faster with it on an H200): the GEMV, the norms, attention_inputs / store_kv and attention are launched with
# programmatic stream serialization, so each one's launch overlaps the previous kernel's end. The
# GEMV streams the first steps of its weight before it waits (griddepcontrol.wait) for the
# previous kernel; the others wait at their start. See gemv.cu and common.cuh.
PDL = os.environ.get("TILEINFER_CUDA_PDL", "1") == "1"


def _pdl(device: int) -> bool:
    """Launch with PDL: ops.PDL is set and the GPU has griddepcontrol (sm_90 and newer)."""
    return PDL and int(compiler.device_arch(device)[3:].rstrip("af")) >= 90


def _fallback(op: str, why: str):
    fallback_counts[f"{op}: {why}"] += 1


def _dev(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _aligned(*tensors, nbytes=16) -> bool:
    return all(t is None or t.data_ptr() % nbytes == 0 for t in tensors)


def _contig(*tensors) -> bool:
    return all(t is None or t.is_contiguous() for t in tensors)


def _kernel(file, name, signature, device, defines=None, extra_options=()):
    return compiler.load_module(file, device, defines, extra_options).kernel(name, signature)


_device_properties: dict[tuple[int, str], int] = {}


def _device_property(device: int, name: str, default: int | None = None) -> int:
    """``torch.cuda.get_device_properties(device).<name>`` (default where torch lacks it), read
    once per device."""
    key = (device, name)
    value = _device_properties.get(key)
    if value is None:
        props = torch.cuda.get_device_properties(device)
        value = _device_properties[key] = (getattr(props, name) if default is None
                                           else getattr(props, name, default))
    return value


def _num_sms(device: int) -> int:
    return _device_property(device, "multi_processor_count")


def _smem_limit(device: int) -> int:
    """The most shared memory one block may opt in to (227 KB on an H100/H200)."""
    return _device_property(device, "shared_memory_per_block_optin", 227 * 1024)


def _smem_per_multiprocessor(device: int) -> int:
    """Shared memory of one SM, for all its blocks (228 KB on an H100/H200)."""
    return _device_property(device, "shared_memory_per_multiprocessor", 228 * 1024)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _vec(dtype, *counts_and_tensors) -> int:
    """Elements per 16-byte access when every count divides and every tensor is aligned, else 1."""
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    for item in counts_and_tensors:
        if isinstance(item, int):
            if item % vec:
                return 1
        elif item is not None and item.data_ptr() % 16:
            return 1
    return vec


# --- embedding, activations, norms ---------------------------------------------------------------


def embed(out, table, ids):
    if not (_contig(out, table, ids) and out.dtype == table.dtype and ids.dtype == torch.int32
            and table.element_size() % 2 == 0):
        _fallback("embed", "layout")
        return _ref.embed(out, table, ids)
    n, hidden = out.shape
    if n == 0:
        return
    words = hidden * table.element_size() // 2
    defines = {"VEC16": None} if (words % 8 == 0 and _aligned(out, table)) else {}
    k = _kernel("elementwise.cu", "embed", "pppii", _dev(out), defines)
    chunks = words // 8 if defines else words
    k.launch((n,), (min(256, max(32, _cdiv(chunks, 32) * 32)),), (out, table, ids, table.shape[0], words))


def silu_mul(out, gate_up):
    if not (_contig(out, gate_up) and out.dtype == gate_up.dtype and out.dtype in _DTYPE_NAMES):
        _fallback("silu_mul", "layout")
        return _ref.silu_mul(out, gate_up)
    n, inter = out.shape
    vec = _vec(out.dtype, inter, out, gate_up)
    k = _kernel("elementwise.cu", "silu_mul", "ppii", _dev(out),
                {"DTYPE": _DTYPE_NAMES[out.dtype], "VEC": vec})
    total = n * inter // vec
    k.launch((_cdiv(total, 256),), (256,), (out, gate_up, n, inter))


def xielu(out, x, alpha_p, alpha_n, beta, eps):
    if not (_contig(out, x) and out.dtype == x.dtype and out.shape == x.shape
            and out.dtype in _DTYPE_NAMES):
        _fallback("xielu", "layout")
        return _ref.xielu(out, x, alpha_p, alpha_n, beta, eps)
    count = x.numel()
    vec = _vec(x.dtype, count, out, x)
    k = _kernel("elementwise.cu", "xielu", "ppqffff", _dev(out),
                {"DTYPE": _DTYPE_NAMES[x.dtype], "VEC": vec})
    k.launch((_cdiv(count // vec, 256),), (256,), (out, x, count, alpha_p, alpha_n, beta, eps))


def rope(out, x, cos, sin, positions):
    ok = (x.dim() == 3 and out.shape == x.shape and out.dtype == x.dtype and x.dtype in _DTYPE_NAMES
          and x.stride(-1) == 1 and out.stride(-1) == 1 and _contig(cos, sin, positions)
          and cos.dtype == sin.dtype == torch.float32 and positions.dtype == torch.int32)
    if not ok:
        _fallback("rope", "layout")
        return _ref.rope(out, x, cos, sin, positions)
    n, heads, head_dim = x.shape
    half = head_dim // 2
    total = n * heads * half
    k = _kernel("elementwise.cu", "rope", "ppppp" + "iii" + "qqqq", _dev(out),
                {"DTYPE": _DTYPE_NAMES[x.dtype]})
    k.launch((_cdiv(total, 256),), (256,), (out, x, cos, sin, positions, n, heads, half,
                                            x.stride(0), x.stride(1), out.stride(0), out.stride(1)))


def _norm_launch(op, out, x, delta, weight, eps):
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    if rows == 0:
        return
    # One access moves VEC elements of x and of the weight: 16 bytes of the wider of the two.
    vec = 16 // max(x.element_size(), weight.element_size())
    if dim % vec or not _aligned(out, x, delta, weight):
        vec = 1
    defines = {"DTYPE": _DTYPE_NAMES[x.dtype], "WEIGHT_DTYPE": _DTYPE_NAMES[weight.dtype], "VEC": vec}
    device = _dev(out)
    if dim <= 1024:  # a warp per row
        name, sig = f"{op}_warp", "pppqif" if op == "rmsnorm" else "ppppqif"
        k = _kernel("norm.cu", name, sig, device, defines)
        args = (out, x, weight, rows, dim, eps) if op == "rmsnorm" else (x, out, delta, weight, rows, dim, eps)
        k.launch((_cdiv(rows, 8),), (256,), args, pdl=_pdl(device))
    else:  # a block per row
        name, sig = f"{op}_block", "pppif" if op == "rmsnorm" else "ppppif"
        k = _kernel("norm.cu", name, sig, device, defines)
        threads = min(512, _cdiv(_cdiv(dim, vec), 32) * 32)
        args = (out, x, weight, dim, eps) if op == "rmsnorm" else (x, out, delta, weight, dim, eps)
        k.launch((rows,), (threads,), args, pdl=_pdl(device))


def rmsnorm(out, x, weight, eps):
    if not (_contig(out, x, weight) and out.dtype == x.dtype and out.shape == x.shape
            and x.dtype in _DTYPE_NAMES and weight.dtype in _DTYPE_NAMES):
        _fallback("rmsnorm", "layout")
        return _ref.rmsnorm(out, x, weight, eps)
    _norm_launch("rmsnorm", out, x, None, weight, eps)


def add_rmsnorm(residual, out, delta, weight, eps):
    if not (_contig(residual, out, delta, weight) and residual.dtype == out.dtype == delta.dtype
            and residual.shape == out.shape == delta.shape and residual.dtype in _DTYPE_NAMES
            and weight.dtype in _DTYPE_NAMES):
        _fallback("add_rmsnorm", "layout")
        return _ref.add_rmsnorm(residual, out, delta, weight, eps)
    _norm_launch("add_rmsnorm", out, residual, delta, weight, eps)


# --- linear layers -------------------------------------------------------------------------------

_EPILOGUES = {"none": 0, "swiglu": 1, "xielu": 2}


def _gemv_ok(out, x, weight, weight_scale) -> bool:
    n, k_dim = x.shape
    return (x.dtype == torch.bfloat16 and weight.dtype in (torch.bfloat16, torch.int8)
            and out.dtype in (torch.bfloat16, torch.float32) and x.stride(1) == 1
            and x.stride(0) % 8 == 0 and k_dim % 8 == 0 and _contig(weight, out, weight_scale)
            and _aligned(x, weight)
            and ((weight.dtype == torch.bfloat16 and weight_scale is None)
                 or (weight.dtype == torch.int8 and weight_scale is not None
                     and weight_scale.dtype == torch.float32)))


def gemv_heuristic(n_rows: int, k_dim: int, int8: bool, epilogue: str, device: int) -> dict:
    """The default GEMV variant for an (n_rows, k_dim) weight: warps splitting K, ring stages.

    Aim: about 16 warps per SM over the grid (enough 1 KB steps in flight), a ring of at most
    ~100 KB per block (two blocks per SM), and no more stages than a warp has steps.
    """
    lane_k = (16 if k_dim % 16 == 0 else 8) if int8 else 8
    steps = _cdiv(k_dim, 4 * lane_k)
    tiles = _cdiv(n_rows, 16)
    target_warps = 16 * _num_sms(device)
    warps = 4
    while warps < 16 and tiles * warps < target_warps and steps >= 2 * warps * 2:
        warps *= 2
    parts = 2 * (2 if epilogue == "swiglu" else 1) + lane_k // 8
    stages = 8
    while stages > 2 and warps * stages * parts * 512 > 100 * 1024:
        stages -= 2
    stages = max(2, min(stages, _cdiv(steps, warps) + 1))
    if stages % 2:
        stages += 1
    return {"warps": warps, "stages": stages, "l2_256b": False}


# Per-shape GEMV launch configurations: (output rows, K, int8 weights, epilogue) ->
# {"warps": ..., "stages": ..., "l2_256b": ...}; for SwiGLU the output rows are the
# intermediate size (half the fused gate/up weight). A shape missing here gets the heuristic
# (gemv_heuristic). ``python -m tileinfer_backend_cuda.bench`` sweeps the configurations at the
# llama3-8b and llama3.2-1b shapes and prints its winners as entries of this table
# ("gemv_table" in its JSON). The configuration never depends on the number of token rows
# (1..8), so a row's result is the same in a 1-token step and in a speculative verify step.
# The winners of that sweep on an H200 (2026-11-30; benchmarks/RESULTS.md).
GEMV_TABLE: dict[tuple[int, int, bool, str], dict] = {
    (6144, 4096, False, 'none'): {'warps': 4, 'stages': 4, 'l2_256b': True},
    (4096, 4096, False, 'none'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (14336, 4096, False, 'swiglu'): {'warps': 16, 'stages': 4, 'l2_256b': True},
    (4096, 14336, False, 'none'): {'warps': 16, 'stages': 4, 'l2_256b': True},
    (128256, 4096, False, 'none'): {'warps': 4, 'stages': 4, 'l2_256b': True},
    (6144, 4096, True, 'none'): {'warps': 8, 'stages': 2, 'l2_256b': False},
    (4096, 4096, True, 'none'): {'warps': 16, 'stages': 2, 'l2_256b': False},
    (14336, 4096, True, 'swiglu'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (4096, 14336, True, 'none'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (128256, 4096, True, 'none'): {'warps': 4, 'stages': 4, 'l2_256b': True},
    (3072, 2048, False, 'none'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (2048, 2048, False, 'none'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (8192, 2048, False, 'swiglu'): {'warps': 4, 'stages': 4, 'l2_256b': True},
    (2048, 8192, False, 'none'): {'warps': 16, 'stages': 4, 'l2_256b': True},
    (128256, 2048, False, 'none'): {'warps': 16, 'stages': 4, 'l2_256b': True},
    (3072, 2048, True, 'none'): {'warps': 16, 'stages': 2, 'l2_256b': False},
    (2048, 2048, True, 'none'): {'warps': 16, 'stages': 2, 'l2_256b': False},
    (8192, 2048, True, 'swiglu'): {'warps': 2, 'stages': 3, 'l2_256b': False},
    (2048, 8192, True, 'none'): {'warps': 16, 'stages': 3, 'l2_256b': False},
    (128256, 2048, True, 'none'): {'warps': 4, 'stages': 4, 'l2_256b': True},
}


# Per-shape launch configurations of the row-streaming kernel (gemv_rows.cu), same keys as
# GEMV_TABLE -> {"rows": ..., "unroll": ..., "warps": ..., "split_k": ...}; a shape missing here
# gets gemv_rows_heuristic. bench.py prints a sweep's winners as "GEMV_ROWS_TABLE = {...}".
GEMV_ROWS_TABLE: dict[tuple[int, int, bool, str], dict] = {
    # H200 sweep of benchmarks/ops.py --only cuda-sweep (2026-11-30, session 4): the rows
    # kernel's best per llama3-8b / llama3.2-1b decode shape, timed as the per-op table times
    # them (8B bf16: qkv 12.27 us = 98% of copy, o 8.70 = 92%, gate_up 51.78, down 26.75,
    # lm_head 227.08; int8: qkv 8.57, o 5.98, gate_up 29.37, down 15.78, lm_head 117.42).
    (6144, 4096, False, 'none'): {'rows': 2, 'unroll': 4, 'warps': 4, 'split_k': 1},
    (4096, 4096, False, 'none'): {'rows': 2, 'unroll': 4, 'warps': 4, 'split_k': 1},
    (14336, 4096, False, 'swiglu'): {'rows': 1, 'unroll': 4, 'warps': 4, 'split_k': 1},
    (4096, 14336, False, 'none'): {'rows': 2, 'unroll': 2, 'warps': 4, 'split_k': 1},
    (128256, 4096, False, 'none'): {'rows': 2, 'unroll': 4, 'warps': 4, 'split_k': 1},
    (6144, 4096, True, 'none'): {'rows': 2, 'unroll': 2, 'warps': 4, 'split_k': 1},
    (4096, 4096, True, 'none'): {'rows': 4, 'unroll': 1, 'warps': 4, 'split_k': 1},
    (14336, 4096, True, 'swiglu'): {'rows': 2, 'unroll': 1, 'warps': 4, 'split_k': 1},
    (4096, 14336, True, 'none'): {'rows': 4, 'unroll': 1, 'warps': 4, 'split_k': 1},
    (128256, 4096, True, 'none'): {'rows': 4, 'unroll': 2, 'warps': 2, 'split_k': 1},
    (3072, 2048, False, 'none'): {'rows': 2, 'unroll': 2, 'warps': 2, 'split_k': 1},
    (2048, 2048, False, 'none'): {'rows': 2, 'unroll': 4, 'warps': 2, 'split_k': 1},
    (8192, 2048, False, 'swiglu'): {'rows': 2, 'unroll': 1, 'warps': 4, 'split_k': 1},
    (2048, 8192, False, 'none'): {'rows': 8, 'unroll': 1, 'warps': 8, 'split_k': 1},
    (128256, 2048, False, 'none'): {'rows': 2, 'unroll': 2, 'warps': 2, 'split_k': 1},
    (3072, 2048, True, 'none'): {'rows': 2, 'unroll': 4, 'warps': 1, 'split_k': 1},
    (2048, 2048, True, 'none'): {'rows': 4, 'unroll': 2, 'warps': 4, 'split_k': 1},
    (8192, 2048, True, 'swiglu'): {'rows': 4, 'unroll': 1, 'warps': 1, 'split_k': 1},
    (2048, 8192, True, 'none'): {'rows': 4, 'unroll': 1, 'warps': 8, 'split_k': 1},
    (128256, 2048, True, 'none'): {'rows': 4, 'unroll': 1, 'warps': 2, 'split_k': 1},
}

_MMA_KEYS = frozenset({"stages", "l2_256b"})
_ROWS_KEYS = frozenset({"rows", "unroll", "split_k"})


def _override_family() -> str | None:
    """The kernel family gemv_overrides ask for: "kernel", else told by their keys, else None."""
    if gemv_overrides.get("kernel"):
        return gemv_overrides["kernel"]
    if _ROWS_KEYS & gemv_overrides.keys():
        return "rows"
    if _MMA_KEYS & gemv_overrides.keys():
        return "mma"
    return None


def _rows_lane_k(int8: bool) -> int:
    """k of one lane's 16-byte weight chunk in gemv_rows.cu (LANE_K); a warp step is 32 of them."""
    return 16 if int8 else 8


def gemv_rows_heuristic(n_rows: int, k_dim: int, int8: bool, epilogue: str, device: int) -> dict:
    """The default row-streaming configuration for an (n_rows, k_dim) weight.

    A warp streams `rows` output rows (gate and up rows for SwiGLU) with `unroll` steps of 512
    bytes a row per round: 8 weight chunks of 16 bytes per lane and round, two rounds in flight,
    which keeps a 1-token build near 96 registers (about 20 resident warps per SM).
    The parallelism along K (warps of a block, then grid splits) doubles while the grid's warps
    still fit in one wave of ~20 resident warps per SM (a partial last wave leaves the SMs with
    too few loads in flight) and every warp keeps at least two rounds of work.
    """
    mats = 2 if epilogue == "swiglu" else 1
    rows, unroll = (2, 2) if mats == 2 else (4, 2)
    steps = _cdiv(k_dim, 32 * _rows_lane_k(int8))  # warp steps along a row
    tiles = _cdiv(n_rows, rows)
    resident = 20 * _num_sms(device)
    par = 1
    while par < 16 and tiles * par * 2 <= resident and steps // (par * 2) >= 2 * unroll:
        par *= 2
    warps = min(par, 4)
    return {"rows": rows, "unroll": unroll, "warps": warps, "split_k": par // warps}


def gemv_config(n_rows: int, k_dim: int, int8: bool, epilogue: str, device: int,
                kernel: str | None = None) -> dict:
    """The GEMV variant for an (n_rows, k_dim) weight, with its family under "kernel".

    The family: ``kernel``, else the one ``gemv_overrides`` ask for, else GEMV_KERNEL. "mma":
    GEMV_TABLE's entry, else gemv_heuristic; "rows": GEMV_ROWS_TABLE's entry, else
    gemv_rows_heuristic. ``gemv_overrides`` (benchmarks) take precedence when they are of the
    same family. Never a function of the token count (row invariance)."""
    asked = _override_family()
    kernel = kernel or asked or GEMV_KERNEL
    key = (n_rows, k_dim, bool(int8), epilogue)
    if kernel == "rows":
        entry = GEMV_ROWS_TABLE.get(key)
        config = (dict(entry) if entry is not None
                  else gemv_rows_heuristic(n_rows, k_dim, int8, epilogue, device))
        config.setdefault("split_k", 1)
    elif kernel == "mma":
        entry = GEMV_TABLE.get(key)
        config = (dict(entry) if entry is not None
                  else gemv_heuristic(n_rows, k_dim, int8, epilogue, device))
        config.setdefault("l2_256b", False)
    else:
        raise ValueError(f"unknown GEMV kernel family {kernel!r} (TILEINFER_CUDA_GEMV): 'rows' or 'mma'")
    if asked in (None, kernel):
        config.update(gemv_overrides)
    config["kernel"] = kernel
    return config


def gemv_ring_bytes(config: dict, k_dim: int, int8: bool, epilogue: str) -> int:
    """Dynamic shared memory of a GEMV variant (gemv.cu: WARPS x STAGES x PARTS x 32 x 16 B)."""
    lane_k = (16 if k_dim % 16 == 0 else 8) if int8 else 8
    parts = 2 * (2 if epilogue == "swiglu" else 1) + lane_k // 8
    return config["warps"] * config["stages"] * parts * 32 * 16


def _gemv(out, x, weight, weight_scale, epilogue="none", xielu_params=(0.0, 0.0, 0.0, 0.0)):
    n, k_dim = x.shape
    int8 = weight.dtype == torch.int8
    o_rows = weight.shape[0] // 2 if epilogue == "swiglu" else weight.shape[0]
    device = _dev(out)
    cfg = gemv_config(o_rows, k_dim, int8, epilogue, device)
    if cfg["kernel"] == "rows":
        if k_dim % _rows_lane_k(int8) == 0:  # rows start 16-byte aligned
            return _gemv_rows(out, x, weight, weight_scale, epilogue, xielu_params, cfg, o_rows)
        cfg = gemv_config(o_rows, k_dim, int8, epilogue, device, kernel="mma")
    int8_load = 16 if k_dim % 16 == 0 else 8
    defines = {
        "W_INT8": int(int8), "INT8_LOAD": int8_load, "EPILOGUE": _EPILOGUES[epilogue],
        "OUT_DTYPE": _DTYPE_NAMES[out.dtype], "ROUND_BF16": int(not int8),
        "WARPS": cfg["warps"], "STAGES": cfg["stages"],
    }
    if cfg.get("l2_256b"):
        defines["STREAM_L2_256B"] = None  # cp.async with a 256-byte L2 prefetch hint
    pdl = _pdl(device)
    if pdl:
        defines["PDL"] = 1
    k = _kernel("gemv.cu", "gemv", "ppppiiiqffff", device, defines)
    smem = gemv_ring_bytes(cfg, k_dim, int8, epilogue)
    k.launch((_cdiv(o_rows, 16),), (cfg["warps"] * 32,),
             (out, x, weight, weight_scale, n, k_dim, o_rows, x.stride(0), *xielu_params), smem,
             pdl=pdl)


class _DeviceScratch:
    """Scratch buffers allocated once per device by ``reserve`` (attention_workspace calls it, so
    a model runner has them before it captures graphs) or on first use outside a capture; never
    grown. ``make(device)`` returns the buffers; counters among them must start at zero."""

    def __init__(self, make):
        self._make = make
        self._by_device: dict[int, tuple[torch.Tensor, ...]] = {}
        self._lock = threading.Lock()

    def reserve(self, device):
        """The device's buffers, allocated on the first call (not inside a graph capture: None)."""
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        buffers = self._by_device.get(index)
        if buffers is None and not torch.cuda.is_current_stream_capturing():
            with self._lock:
                buffers = self._by_device.get(index)
                if buffers is None:
                    dev = torch.device("cuda", index)
                    buffers = self._make(dev)
                    torch.cuda.synchronize(dev)  # the counters are zero before any stream uses them
                    self._by_device[index] = buffers
        return buffers

    def get(self, device: int):
        """The buffers, or None where they are missing and cannot be allocated now (a capture)."""
        return self._by_device.get(device) or self.reserve(device)


class _GemvScratch(_DeviceScratch):
    """Per-device split-K scratch of gemv_rows.cu: float32 partial sums [split][mat][token][O] and
    one arrival counter per row tile (zero between launches: the last block of a tile re-arms
    it). A launch that needs more than it holds runs without split-K (decided from the shape
    alone, so never differently for 1 and 8 tokens)."""

    PARTIALS = 1 << 21  # floats (8 MiB)
    COUNTERS = 1 << 15

    def __init__(self):
        super().__init__(lambda dev: (torch.empty(self.PARTIALS, dtype=torch.float32, device=dev),
                                      torch.zeros(self.COUNTERS, dtype=torch.int32, device=dev)))

    @classmethod
    def fits(cls, splits: int, mats: int, n_rows: int) -> bool:
        """Room for a launch: partials of every split, mat and token slot; a counter per row tile
        (n_rows bounds the tiles for every rows value)."""
        return splits * mats * GEMV_MAX_TOKENS * n_rows <= cls.PARTIALS and n_rows <= cls.COUNTERS


class _ArgmaxScratch(_DeviceScratch):
    """sampling.cu's argmax_split: each chunk's maximum and its index, [row][chunk], and one
    arrival counter per row (zero between launches)."""

    ROWS = 64
    CHUNKS = 256  # of ARGMAX_CHUNK logits: vocabularies up to 1M
    ARGMAX_CHUNK = 4096

    def __init__(self):
        n = self.ROWS * self.CHUNKS
        super().__init__(lambda dev: (torch.empty(n, dtype=torch.float32, device=dev),
                                      torch.empty(n, dtype=torch.int32, device=dev),
                                      torch.zeros(self.ROWS, dtype=torch.int32, device=dev)))


GEMV_SCRATCH = _GemvScratch()
ARGMAX_SCRATCH = _ArgmaxScratch()

# The rows kernel compiled for 1 token slot at n = 1 (fewer registers than 8 slots). Its sums are
# the 8-slot build's bit for bit (the same fmaf sequence per token and row); False launches the
# 8-slot build at n = 1 too.
GEMV_ROWS_ONE_TOKEN_BUILD = os.environ.get("TILEINFER_CUDA_GEMV_ONE_TOKEN_BUILD", "1") == "1"


def gemv_rows_tile(cfg: dict, tokens: int, int8: bool, epilogue: str) -> tuple[int, int]:
    """(rows, unroll) of a launch: the configuration's, reduced for builds of several token slots
    (their accumulators and x chunks take the registers): at most 4 weight chunks a round (bf16)
    or 2 (INT8). Neither changes the order of any sum, so the rows stay bit-identical to the
    1-token build's."""
    rows, unroll = cfg["rows"], cfg["unroll"]
    if tokens > 1:
        mats = 2 if epilogue == "swiglu" else 1
        budget = 2 if int8 else 4
        while mats * rows * unroll > budget and unroll > 1:
            unroll = (unroll + 1) // 2
        while mats * rows * unroll > budget and rows > 1:
            rows //= 2
    return rows, unroll


def gemv_rows_split(cfg: dict, k_dim: int, int8: bool) -> tuple[int, int]:
    """(splits, k_split): the grid's split of K, whole warp steps per split; from the weight's
    shape and the configuration only (never from the token count)."""
    step_k = 32 * _rows_lane_k(int8)
    splits = max(1, min(int(cfg.get("split_k", 1)), _cdiv(k_dim, step_k)))
    k_split = _cdiv(_cdiv(k_dim, splits), step_k) * step_k
    return _cdiv(k_dim, k_split), k_split


def gemv_rows_defines(cfg: dict, int8: bool, epilogue: str, out_dtype: str, tokens: int,
                      pdl: bool) -> dict:
    """The defines of a gemv_rows.cu build (bench.py precompiles with the same function)."""
    rows, unroll = gemv_rows_tile(cfg, tokens, int8, epilogue)
    defines = {"W_INT8": int(int8), "EPILOGUE": _EPILOGUES[epilogue], "OUT_DTYPE": out_dtype,
               "ROUND_BF16": int(not int8), "ROWS": rows, "UNROLL": unroll,
               "WARPS": cfg["warps"], "TOKENS": tokens}
    if pdl:
        defines["PDL"] = 1
    return defines


def gemv_rows_tokens(n: int) -> int:
    """The token slots of the build that runs an n-token step."""
    return 1 if n == 1 and GEMV_ROWS_ONE_TOKEN_BUILD else GEMV_MAX_TOKENS


def _gemv_rows(out, x, weight, weight_scale, epilogue, xielu_params, cfg, o_rows):
    n, k_dim = x.shape
    int8 = weight.dtype == torch.int8
    device = _dev(out)
    splits, k_split = gemv_rows_split(cfg, k_dim, int8)
    scratch = counters = None
    if splits > 1:
        mats = 2 if epilogue == "swiglu" else 1
        buffers = GEMV_SCRATCH.get(device) if _GemvScratch.fits(splits, mats, o_rows) else None
        if buffers is None:
            _fallback("gemv", "no split-K (scratch too small, or first reserved inside a graph capture)")
            splits, k_split = 1, k_dim
        else:
            scratch, counters = buffers
    tokens = gemv_rows_tokens(n)
    pdl = _pdl(device)
    defines = gemv_rows_defines(cfg, int8, epilogue, _DTYPE_NAMES[out.dtype], tokens, pdl)
    k = _kernel("gemv_rows.cu", "gemv_rows", "ppppiiiqffff" + "ipp", device, defines)
    k.launch((_cdiv(o_rows, defines["ROWS"]), splits), (cfg["warps"] * 32,),
             (out, x, weight, weight_scale, n, k_dim, o_rows, x.stride(0), *xielu_params, k_split,
              scratch, counters), pdl=pdl)


def _gemm(out, x, weight, weight_scale):
    m, k_dim = x.shape
    n_cols = weight.shape[0]
    int8 = weight.dtype == torch.int8
    defines = {"W_INT8": int(int8), "OUT_DTYPE": _DTYPE_NAMES[out.dtype],
               "ROUND_BF16": int(not int8)}
    k = _kernel("gemm.cu", "gemm", "ppppiiiq", _dev(out), defines)
    k.launch((_cdiv(n_cols, 128), _cdiv(m, 128)), (256,),
             (out, x, weight, weight_scale, m, n_cols, k_dim, x.stride(0)))


def _linear_into(out, x, weight, weight_scale):
    """out = x @ W.T with the kernel that fits; False when none does."""
    if x.dim() != 2 or out.dim() != 2 or x.shape[0] != out.shape[0] or out.shape[1] != weight.shape[0]:
        return False
    n = x.shape[0]
    if n == 0:
        return True
    if _gemv_ok(out, x, weight, weight_scale):
        if n <= GEMV_MAX_TOKENS:
            _gemv(out, x, weight, weight_scale)
        elif weight.dtype == torch.bfloat16 and out.dtype == torch.bfloat16:
            torch.matmul(x, weight.t(), out=out)  # prefill: cuBLAS
        else:
            _gemm(out, x, weight, weight_scale)
        return True
    if (weight_scale is None and x.dtype == weight.dtype == out.dtype
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16) and out.is_contiguous()):
        torch.matmul(x, weight.t(), out=out)  # float32 / float16 models: cuBLAS
        return True
    return False


def linear(out, x, weight, weight_scale):
    if not _linear_into(out, x, weight, weight_scale):
        _fallback("linear", f"{x.dtype} x {weight.dtype} -> {out.dtype} layout")
        _ref.linear(out, x, weight, weight_scale)


def linear_swiglu(out, x, weight, weight_scale, gate_up):
    n = x.shape[0]
    if n == 0:
        return
    if (x.dim() == 2 and n <= GEMV_MAX_TOKENS and out.dtype == torch.bfloat16
            and _gemv_ok(out, x, weight, weight_scale)):
        return _gemv(out, x, weight, weight_scale, "swiglu")
    if gate_up.dtype == x.dtype and gate_up.is_contiguous() and _linear_into(gate_up, x, weight, weight_scale):
        return silu_mul(out, gate_up)
    _fallback("linear_swiglu", "layout")
    _ref.linear_swiglu(out, x, weight, weight_scale, gate_up)


def linear_xielu(out, x, weight, weight_scale, alpha_p, alpha_n, beta, eps):
    n = x.shape[0]
    if n == 0:
        return
    if (x.dim() == 2 and n <= GEMV_MAX_TOKENS and out.dtype == torch.bfloat16
            and _gemv_ok(out, x, weight, weight_scale)):
        return _gemv(out, x, weight, weight_scale, "xielu", (alpha_p, alpha_n, beta, eps))
    if out.dtype == x.dtype and _linear_into(out, x, weight, weight_scale):
        return xielu(out, out, alpha_p, alpha_n, beta, eps)
    _fallback("linear_xielu", "layout")
    _ref.linear_xielu(out, x, weight, weight_scale, alpha_p, alpha_n, beta, eps)


# --- KV cache ------------------------------------------------------------------------------------


def _cache_defines(k_cache, act_dtype, head_dim):
    int8 = k_cache.dtype == torch.int8
    defines = {"DTYPE": _DTYPE_NAMES[act_dtype], "HEAD_DIM": head_dim, "CACHE_INT8": int(int8)}
    if not int8:
        defines["CACHE_DTYPE"] = _DTYPE_NAMES[k_cache.dtype]
    return defines


def _cache_ok(k_cache, v_cache, k_scale, v_scale, k_smooth, head_dim) -> bool:
    int8 = k_cache.dtype == torch.int8
    return (k_cache.dtype == v_cache.dtype and (int8 or k_cache.dtype in _DTYPE_NAMES)
            and k_cache.shape == v_cache.shape and k_cache.shape[-1] == head_dim
            and _contig(k_cache, v_cache, k_scale, v_scale, k_smooth)
            and (not int8 or (k_scale is not None and v_scale is not None
                              and k_scale.dtype == v_scale.dtype == torch.float32))
            and (k_smooth is None or k_smooth.dtype == torch.float32)
            and _aligned(k_cache, v_cache) and head_dim % 2 == 0 and head_dim <= 256)


def store_kv(k_cache, v_cache, k_scale, v_scale, k_smooth, k, v, slots):
    head_dim = k.shape[-1]
    ok = (k.dim() == 3 and k.shape == v.shape and k.dtype == v.dtype and k.dtype in _DTYPE_NAMES
          and k.stride() == v.stride() and k.stride(-1) == 1 and k.stride(0) % 8 == 0
          and k.stride(1) % 8 == 0 and _aligned(k, v) and slots.dtype == torch.int64
          and slots.is_contiguous()
          and _cache_ok(k_cache, v_cache, k_scale, v_scale, k_smooth, head_dim))
    if not ok:
        _fallback("store_kv", "layout")
        return _ref.store_kv(k_cache, v_cache, k_scale, v_scale, k_smooth, k, v, slots)
    n, kv_heads = k.shape[0], k.shape[1]
    if n == 0:
        return
    kern = _kernel("kv.cu", "store_kv", "pppppppp" + "iii" + "qq", _dev(k),
                   _cache_defines(k_cache, k.dtype, head_dim))
    warps = n * 2 * kv_heads
    kern.launch((_cdiv(warps, 4),), (128,),
                (k_cache, v_cache, k_scale, v_scale, k_smooth, k, v, slots, n, kv_heads,
                 k_cache.shape[1], k.stride(0), k.stride(1)), pdl=_pdl(_dev(k)))


def _inputs_ok(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm, cos,
               sin, positions, slots) -> bool:
    """What kv.cu's attention_inputs takes (else the ref op runs)."""
    n, heads, head_dim = q_out.shape
    kv_heads = k_cache.shape[2]
    norm = q_norm if q_norm is not None else k_norm
    return (qkv.dtype in _DTYPE_NAMES and q_out.dtype in _DTYPE_NAMES and _contig(qkv, q_out, q_norm, k_norm)
            and qkv.shape == (n, (heads + 2 * kv_heads) * head_dim) and _aligned(qkv, q_out)
            and (q_norm is None or k_norm is None or q_norm.dtype == k_norm.dtype)
            and (norm is None or norm.dtype in _DTYPE_NAMES)
            and _contig(cos, sin, positions, slots) and cos.dtype == sin.dtype == torch.float32
            and positions.dtype == torch.int32 and slots.dtype == torch.int64
            and _cache_ok(k_cache, v_cache, k_scale, v_scale, k_smooth, head_dim))


def attention_inputs(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm,
                     cos, sin, positions, slots, eps):
    n, heads, head_dim = q_out.shape
    kv_heads = k_cache.shape[2]
    norm = q_norm if q_norm is not None else k_norm
    if not _inputs_ok(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm,
                      cos, sin, positions, slots):
        _fallback("attention_inputs", "layout")
        return _ref.attention_inputs(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv,
                                     q_norm, k_norm, cos, sin, positions, slots, eps)
    if n == 0:
        return
    defines = _cache_defines(k_cache, qkv.dtype, head_dim)
    defines["QOUT_DTYPE"] = _DTYPE_NAMES[q_out.dtype]
    if norm is not None:
        defines["NORM_DTYPE"] = _DTYPE_NAMES[norm.dtype]
    kern = _kernel("kv.cu", "attention_inputs", "p" * 13 + "iiiif", _dev(qkv), defines)
    warps = n * (heads + 2 * kv_heads)
    kern.launch((_cdiv(warps, 4),), (128,),
                (q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm, cos,
                 sin, positions, slots, n, heads, kv_heads, k_cache.shape[1], eps),
                pdl=_pdl(_dev(qkv)))


# --- attention -----------------------------------------------------------------------------------


def attention_workspace(num_tokens, num_heads, head_dim, max_context_len, device):
    """Split-KV scratch (see attention.cu) for steps of up to num_tokens query rows.

    Only steps of at most SPLIT_MAX_TOKENS rows split the context (larger ones have enough row
    tiles to fill the GPU), so a workspace for larger steps would never be used: None.
    """
    GEMV_SCRATCH.reserve(device)  # the decode GEMV's split-K scratch, before any graph capture
    ARGMAX_SCRATCH.reserve(device)  # and the split greedy sampler's
    # Every cache that can split at all gets the full MAX_SPLITS, so that the decode kernel's
    # split count (and with it each row's split boundaries) does not depend on the cache size.
    splits = MAX_SPLITS if max_context_len > ATTN_BLOCK_N else 1
    if splits <= 1 or not 0 < num_tokens <= SPLIT_MAX_TOKENS:
        return None
    return torch.zeros((num_tokens, num_heads, splits, head_dim + 2), dtype=torch.float32,
                       device=device)


def _attention_ok(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q,
                  context_lens, block_table) -> bool:
    head_dim = q.shape[-1]
    return (q.dim() == 3 and q.dtype == out.dtype == torch.bfloat16 and out.shape == q.shape
            and _contig(q, out, cu_seqlens_q, context_lens, block_table)
            and head_dim % 64 == 0 and head_dim <= 256 and _aligned(q, out)
            and k_cache.dtype in (torch.bfloat16, torch.int8)
            and q.shape[1] % k_cache.shape[2] == 0
            and cu_seqlens_q.dtype == context_lens.dtype == block_table.dtype == torch.int32
            and _cache_ok(k_cache, v_cache, k_scale, v_scale, k_smooth, head_dim))


def attention_smem_bytes(head_dim: int, int8: bool, smooth: bool, stages: int) -> int:
    """sizeof(SharedTiles) of attention.cu: the query tile(s) and the K/V ring."""
    q_bytes = (2 if smooth else 1) * ATTN_BLOCK_M * head_dim * 2
    if int8:  # bf16 K and V tiles + per stage: raw int8 K and V, float32 scales
        return q_bytes + 2 * ATTN_BLOCK_N * head_dim * 2 + stages * (2 * ATTN_BLOCK_N * head_dim
                                                                      + 2 * ATTN_BLOCK_N * 4)
    return q_bytes + stages * 2 * ATTN_BLOCK_N * head_dim * 2


# attention_decode.cu without multiply-add contraction: each m-tile's unrolled copy of the
# per-row arithmetic rounds the same way (row invariance, see the kernel's header).
_ATTN_DECODE_OPTIONS = ("-fmad=false",)


def attention_decode_m_tiles(head_dim: int, group: int) -> int:
    """16-row m-tiles per warp of attention_decode.cu (M_TILES): two where a verify step's
    ATTN_DECODE_MAX_TOKENS x group rows need more than one and the accumulators fit in registers
    (head_dim <= 128). A function of the model only, so steps of any size run the same variant.
    (A row's bits would not depend on M_TILES, but the one-m-tile variant for 1-token steps, with
    128 instead of ~220 registers, made the llama3-8b INT8 decode step slower on the H200:
    2.666 against 2.492 ms, though the op alone was as fast or faster.)"""
    return 2 if head_dim <= 128 and ATTN_DECODE_MAX_TOKENS * group > 16 else 1


def attention_decode_smem_bytes(head_dim: int, int8: bool, smooth: bool, stages: int,
                                m_tiles: int) -> int:
    """sizeof(SharedTiles) of attention_decode.cu: the query tile(s), the warps' (m, l), and the
    K/V ring, whose memory then holds the warps' float32 O (4 x rows x head_dim) for the merge."""
    rows = 16 * m_tiles
    stats = 2 * 4 * rows * 4
    if int8:  # the query as int8 hi and lo parts and a scale per row; per stage and warp: 16 keys
        # of int8 K and V and their scales
        q_bytes = 2 * rows * head_dim + 4 * rows
        ring = stages * 4 * (2 * 16 * head_dim + 2 * 16 * 4)
    else:
        q_bytes = (2 if smooth else 1) * rows * head_dim * 2
        ring = stages * 2 * ATTN_BLOCK_N * head_dim * 2
    return q_bytes + stats + max(ring, 4 * rows * head_dim * 4)


def attention_decode_stages(head_dim: int, int8: bool, smooth: bool, m_tiles: int,
                            blocks_per_sm: int, device: int, max_stages: int = 6) -> int:
    """The deepest K/V ring (at most max_stages) with which blocks_per_sm blocks of
    attention_decode.cu fit on one SM; at least two stages where one block fits."""
    def smem(stages):
        return attention_decode_smem_bytes(head_dim, int8, smooth, stages, m_tiles)

    # per block: 1 KB reserved by the system and the kernel's few static bytes
    budget = _smem_per_multiprocessor(device) // max(1, blocks_per_sm) - 1024 - 128
    stages = max_stages
    while stages > 2 and smem(stages) > budget:
        stages -= 1
    while stages > 1 and smem(stages) > _smem_limit(device) - 1024:
        stages -= 1
    return stages


def attention_decode_tiles(max_context_len: int, num_splits: int, min_split_tiles: int = 1) -> int:
    """An upper bound on the key tiles a block of attention_decode.cu loads for a cache whose rows
    see at most max_context_len keys: two runs of at most one split's tiles each (a row tile whose
    rows straddle two split sizes loads the union of both), and at least 2. A deeper ring would
    only hold empty stages, in about 100 KB of shared memory a block at the auto depth (a
    llama3.2-1b decode step measured 896 us with it, 843 us capped)."""
    split_tiles = max(min_split_tiles, _cdiv(max(1, max_context_len), ATTN_BLOCK_N * num_splits))
    return max(2, 2 * split_tiles)


def attention_decode_splits(batch: int, kv_heads: int, workspace_splits: int, device: int) -> int:
    """Split count of attention_decode.cu: about decode_blocks_per_sm blocks per SM over the
    (sequence, kv head) pairs, at most the workspace's splits. The row tiles do not count, so a
    verify step splits like a 1-token step, and neither does the cache's longest context (the
    splits past a row's keys are empty and exit at once): a row's split boundaries depend on
    its own context only, so the same model on two caches of different sizes (a draft model
    that is the target itself) computes every row bit for bit alike."""
    cfg = attention_config()
    target = cfg.get("splits") or _cdiv(cfg["decode_blocks_per_sm"] * _num_sms(device), batch * kv_heads)
    return max(1, min(target, workspace_splits))


def attention_config() -> dict:
    config = dict(ATTN_CONFIG)
    config.update(attention_overrides)
    return config


def attention_with_inputs(out, q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm,
                          k_norm, cos, sin, positions, slots, eps, cu_seqlens_q, context_lens,
                          block_table, max_query_len, max_context_len, scale, causal, workspace):
    """attention_inputs then attention; one kernel (attention_decode.cu's FUSED_INPUTS) for steps
    of one query token per sequence, where both ops would run their kernels."""
    n = q_out.shape[0]
    norm = q_norm if q_norm is not None else k_norm
    cfg = attention_config()
    fused = (cfg["decode"] and cfg["decode_fused_inputs"] and max_query_len == 1
             and n == context_lens.shape[0] > 0 and qkv.dtype == torch.bfloat16
             and (norm is None or norm.dtype == torch.bfloat16)
             and _inputs_ok(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm,
                            k_norm, cos, sin, positions, slots)
             and _attention_ok(out, q_out, k_cache, v_cache, k_scale, v_scale, k_smooth,
                               cu_seqlens_q, context_lens, block_table))
    if not fused:
        attention_inputs(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm,
                         cos, sin, positions, slots, eps)
        attention(out, q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q,
                  context_lens, block_table, max_query_len, max_context_len, scale, causal,
                  workspace)
        return
    _attention(out, q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q,
               context_lens, block_table, max_query_len, max_context_len, scale, causal, workspace,
               inputs=(qkv, q_norm, k_norm, cos, sin, positions, slots, float(eps)))


def attention(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
              block_table, max_query_len, max_context_len, scale, causal, workspace):
    _attention(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
               block_table, max_query_len, max_context_len, scale, causal, workspace)


# attention_decode.cu's arguments of the fused attention inputs when there are none.
_NO_INPUTS = (None,) * 7 + (0.0,)


def _attention(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
               block_table, max_query_len, max_context_len, scale, causal, workspace, inputs=None):
    """The attention op's launch; `inputs` (attention_with_inputs: qkv, q_norm, k_norm, cos, sin,
    positions, slots, eps) makes the decode kernel compute q and store the new key and value
    itself (the caller checked that the step qualifies)."""
    if not _attention_ok(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q,
                         context_lens, block_table):
        _fallback("attention", "dtype or layout")
        return _ref.attention(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q,
                              context_lens, block_table, max_query_len, max_context_len, scale,
                              causal, workspace)
    n_tokens, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    batch = context_lens.shape[0]
    group = heads // kv_heads
    if n_tokens == 0 or batch == 0 or max_query_len * group <= 0:
        return
    device = _dev(q)
    cfg = attention_config()
    int8 = k_cache.dtype == torch.int8
    smooth = k_smooth is not None
    decode = cfg["decode"] and max_query_len <= ATTN_DECODE_MAX_TOKENS
    if decode:  # attention_decode.cu: row tiles of 16 x m_tiles rows
        m_tiles = cfg.get("decode_m_tiles") or attention_decode_m_tiles(head_dim, group)
        row_tiles = _cdiv(max_query_len * group, 16 * m_tiles)
    else:
        row_tiles = _cdiv(max_query_len * group, ATTN_BLOCK_M)
    num_splits = 1
    ws = workspace
    if (ws is not None and n_tokens <= ws.shape[0] and ws.shape[1] == heads
            and ws.shape[3] == head_dim + 2 and batch * kv_heads * row_tiles <= ws.shape[0] * heads * ws.shape[2]):
        if decode:
            num_splits = attention_decode_splits(batch, kv_heads, ws.shape[2], device)
        else:
            base_blocks = batch * kv_heads * row_tiles
            target = cfg.get("splits") or _cdiv(cfg["blocks_per_sm"] * _num_sms(device), base_blocks)
            num_splits = max(1, min(target, ws.shape[2], _cdiv(max(1, max_context_len), ATTN_BLOCK_N)))
    limit = _smem_limit(device) - 1024  # room for the static shared memory
    if decode:
        stages = cfg["decode_stages"] or min(
            attention_decode_stages(head_dim, int8, smooth, m_tiles, cfg["decode_blocks_per_sm"], device),
            attention_decode_tiles(max_context_len, num_splits, cfg["decode_min_split_tiles"]))
        smem_bytes = lambda s: attention_decode_smem_bytes(head_dim, int8, smooth, s, m_tiles)  # noqa: E731
    else:
        stages = cfg["stages"]
        smem_bytes = lambda s: attention_smem_bytes(head_dim, int8, smooth, s)  # noqa: E731
    while stages > 1 and smem_bytes(stages) > limit:  # a shallower ring where the GPU has less shared memory
        stages -= 1
    defines = {"HEAD_DIM": head_dim, "KV_INT8": int(int8), "SMOOTH": int(smooth), "KV_STAGES": stages}
    common = (out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
              block_table, heads, kv_heads, k_cache.shape[1], block_table.shape[1],
              float(scale) * math.log2(math.e), int(bool(causal)), num_splits)
    split_ws = (ws if num_splits > 1 else None, ws.shape[2] if num_splits > 1 else 0)
    if decode:
        # Blocks only for the splits a row of this cache can have keys in (each split holds
        # >= 64 * decode_min_split_tiles keys); the partition itself is num_splits'
        # (attention_decode.cu's header).
        grid_splits = min(num_splits, _cdiv(max(1, max_context_len),
                                            ATTN_BLOCK_N * cfg["decode_min_split_tiles"]))
        decode_defines = {**defines, "M_TILES": m_tiles}
        trigger = _PDL_TRIGGERS[cfg["decode_pdl_trigger"]]
        if trigger:
            decode_defines["PDL_TRIGGER"] = trigger
        for key, (define, default) in _KERNEL_DEFAULTS.items():
            if cfg[key] != default:
                decode_defines[define] = int(cfg[key])
        if inputs is not None:
            decode_defines["FUSED_INPUTS"] = 1
            norm = inputs[1] if inputs[1] is not None else inputs[2]
            if norm is not None:
                decode_defines["NORM_DTYPE"] = _DTYPE_NAMES[norm.dtype]
        kern = _kernel("attention_decode.cu", "attention_decode",
                       "p" * 10 + "iiiif" + "iii" + "pi" + "p" * 7 + "f",
                       device, decode_defines, _ATTN_DECODE_OPTIONS)
        kern.launch((row_tiles * grid_splits, kv_heads, batch), (128,),
                    common + (grid_splits,) + split_ws + (inputs or _NO_INPUTS),
                    smem_bytes(stages), pdl=_pdl(device))
    else:
        assert inputs is None, "fused attention inputs need the decode kernel"
        kern = _kernel("attention.cu", "attention", "p" * 10 + "iiiif" + "ii" + "pi", device, defines)
        kern.launch((row_tiles * num_splits, kv_heads, batch), (128,), common + split_ws,
                    smem_bytes(stages), pdl=_pdl(device))


# --- sampling ------------------------------------------------------------------------------------

_SAMPLING_OPTIONS = ("-fmad=false",)


def _sampling_ok(logits, *others) -> bool:
    return (logits.dim() == 2 and logits.dtype == torch.float32 and _contig(logits, *others))


def sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
    params = SamplingParams(temperature, top_k, top_p)  # validates, as the host does
    if not (_sampling_ok(logits, out, seed, counter, probs_out) and out.dtype == torch.int32
            and (probs_out is None or probs_out.dtype == torch.float32)):
        _fallback("sample_tokens", "layout")
        return _ref.sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, probs_out)
    n, vocab = logits.shape
    if n == 0:
        return
    device = _dev(logits)
    chunks = _cdiv(vocab, _ArgmaxScratch.ARGMAX_CHUNK)
    scratch = ARGMAX_SCRATCH.get(device)
    if (params.greedy and probs_out is None and scratch is not None and n <= _ArgmaxScratch.ROWS
            and chunks <= _ArgmaxScratch.CHUNKS):  # the decode step's case: split the row
        part_v, part_i, counters = scratch
        k = _kernel("sampling.cu", "argmax_split", "ppiippp", device, None, _SAMPLING_OPTIONS)
        k.launch((chunks, n), (256,), (out, logits, vocab, _ArgmaxScratch.ARGMAX_CHUNK, part_v,
                                       part_i, counters), pdl=_pdl(device))
        return
    inv_t = 1.0 if params.greedy else params.inv_temperature
    k = _kernel("sampling.cu", "sample", "ppiififppp", device, None, _SAMPLING_OPTIONS)
    k.launch((n,), (1024,), (out, logits, vocab, int(params.greedy), inv_t, int(top_k),
                             float(top_p), seed, counter, probs_out))


def accept_tokens(out, logits, draft_ids, draft_probs, temperature, top_k, top_p, seed, counter):
    params = SamplingParams(temperature, top_k, top_p)
    if not (_sampling_ok(logits, out, draft_ids, draft_probs, seed, counter)
            and out.dtype == draft_ids.dtype == torch.int32
            and (draft_probs is None or draft_probs.dtype == torch.float32)):
        _fallback("accept_tokens", "layout")
        return _ref.accept_tokens(out, logits, draft_ids, draft_probs, temperature, top_k, top_p,
                                  seed, counter)
    n, vocab = logits.shape
    if n == 0:
        return
    inv_t = 1.0 if params.greedy else params.inv_temperature
    k = _kernel("sampling.cu", "accept", "ppppiififpp", _dev(logits), None, _SAMPLING_OPTIONS)
    k.launch((n,), (1024,), (out, logits, draft_ids, draft_probs, vocab, int(params.greedy), inv_t,
                             int(top_k), float(top_p), seed, counter))
