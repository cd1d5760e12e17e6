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
from collections import Counter

import torch
import tileinfer_backend_ref as _ref
from tileinfer.sampling import SamplingParams

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
# Attention launch settings: "blocks_per_sm": the split-KV target (splits are added until the
# grid has about this many blocks per SM), "stages": the K/V cp.async ring depth (KV_STAGES).
# The split count depends on the batch, the kv heads, the row tiles and max_context_len, not on
# the step's token count (steps of 1..8 tokens at decode have one row tile); a split covers
# whole 64-key tiles, so while a context fits in 64 * num_splits keys the split boundaries are
# the same in a 1-token step and in a verify step, and so is each row's result (greedy
# speculative decoding relies on this).
ATTN_CONFIG = {"blocks_per_sm": 2, "stages": 2}
# Tuning overrides for benchmarks (same keys as ATTN_CONFIG).
attention_overrides: dict = {}

fallback_counts: Counter = Counter()

# Tuning overrides for benchmarks: e.g. {"warps": 8, "stages": 6, "l2_256b": True} forces the
# GEMV variant (see gemv_config).
gemv_overrides: dict = {}

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


_sm_counts: dict[int, int] = {}


def _num_sms(device: int) -> int:
    n = _sm_counts.get(device)
    if n is None:
        n = _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


_smem_limits: dict[int, int] = {}


def _smem_limit(device: int) -> int:
    """The most shared memory one block may opt in to (227 KB on an H100/H200)."""
    n = _smem_limits.get(device)
    if n is None:
        props = torch.cuda.get_device_properties(device)
        n = _smem_limits[device] = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
    return n


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


def gemv_config(n_rows: int, k_dim: int, int8: bool, epilogue: str, device: int) -> dict:
    """The GEMV variant for an (n_rows, k_dim) weight: GEMV_TABLE's entry, else the heuristic;
    ``gemv_overrides`` (benchmarks) take precedence."""
    entry = GEMV_TABLE.get((n_rows, k_dim, bool(int8), epilogue))
    config = dict(entry) if entry is not None else gemv_heuristic(n_rows, k_dim, int8, epilogue, device)
    config.setdefault("l2_256b", False)
    config.update(gemv_overrides)
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


def attention_inputs(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm,
                     cos, sin, positions, slots, eps):
    n, heads, head_dim = q_out.shape
    kv_heads = k_cache.shape[2]
    norm = q_norm if q_norm is not None else k_norm
    ok = (qkv.dtype in _DTYPE_NAMES and q_out.dtype in _DTYPE_NAMES and _contig(qkv, q_out, q_norm, k_norm)
          and qkv.shape == (n, (heads + 2 * kv_heads) * head_dim) and _aligned(qkv, q_out)
          and (q_norm is None or k_norm is None or q_norm.dtype == k_norm.dtype)
          and (norm is None or norm.dtype in _DTYPE_NAMES)
          and _contig(cos, sin, positions, slots) and cos.dtype == sin.dtype == torch.float32
          and positions.dtype == torch.int32 and slots.dtype == torch.int64
          and _cache_ok(k_cache, v_cache, k_scale, v_scale, k_smooth, head_dim))
    if not ok:
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
    splits = min(MAX_SPLITS, _cdiv(max(1, max_context_len), ATTN_BLOCK_N))
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


def attention_config() -> dict:
    config = dict(ATTN_CONFIG)
    config.update(attention_overrides)
    return config


def attention(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
              block_table, max_query_len, max_context_len, scale, causal, workspace):
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
    row_tiles = _cdiv(max_query_len * group, ATTN_BLOCK_M)
    if n_tokens == 0 or batch == 0 or row_tiles == 0:
        return
    device = _dev(q)
    cfg = attention_config()
    num_splits = 1
    ws = workspace
    if (ws is not None and n_tokens <= ws.shape[0] and ws.shape[1] == heads
            and ws.shape[3] == head_dim + 2 and batch * kv_heads * row_tiles <= ws.shape[0] * heads * ws.shape[2]):
        base_blocks = batch * kv_heads * row_tiles
        target = cfg.get("splits") or _cdiv(cfg["blocks_per_sm"] * _num_sms(device), base_blocks)
        num_splits = max(1, min(target, ws.shape[2], _cdiv(max(1, max_context_len), ATTN_BLOCK_N)))
    int8 = k_cache.dtype == torch.int8
    smooth = k_smooth is not None
    stages = cfg["stages"]
    smem = attention_smem_bytes(head_dim, int8, smooth, stages)
    limit = _smem_limit(device) - 1024  # room for the static shared memory
    while stages > 1 and smem > limit:  # a shallower ring where the GPU has less shared memory
        stages -= 1
        smem = attention_smem_bytes(head_dim, int8, smooth, stages)
    defines = {"HEAD_DIM": head_dim, "KV_INT8": int(int8), "SMOOTH": int(smooth), "KV_STAGES": stages}
    kern = _kernel("attention.cu", "attention", "p" * 10 + "iiiif" + "ii" + "pi", device, defines)
    kern.launch((row_tiles * num_splits, kv_heads, batch), (128,),
                (out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
                 block_table, heads, kv_heads, k_cache.shape[1], block_table.shape[1],
                 float(scale) * math.log2(math.e), int(bool(causal)), num_splits,
                 ws if num_splits > 1 else None, ws.shape[2] if num_splits > 1 else 0), smem,
                pdl=_pdl(device))


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
    inv_t = 1.0 if params.greedy else params.inv_temperature
    k = _kernel("sampling.cu", "sample", "ppiififppp", _dev(logits), None, _SAMPLING_OPTIONS)
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
