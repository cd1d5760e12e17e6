"""elementwise.cu: the embedding lookup (an op), and SwiGLU's silu(gate) * up and xIELU, which the
prefill paths of linear_swiglu / linear_xielu run after their GEMM (the decode GEMVs fuse them),
and an INT8 weight's conversion to bf16 (int8_cublas.py). The file's rope kernel is not
launched: attention_inputs (kv.cu) applies RoPE itself."""

from __future__ import annotations

import torch

from .common import (DTYPE_NAMES, aligned, cdiv, contig, dev, fallback, kernel, one_byte, vec,
                     weight_defines)


def embed(out, table, ids):
    if not (contig(out, table, ids) and out.dtype == table.dtype and ids.dtype == torch.int32
            and table.element_size() % 2 == 0):
        return fallback("embed", "layout", out, table, ids)
    n, hidden = out.shape
    if n == 0:
        return
    # rows copied as 16-bit words; 16 bytes at a time where the row and pointers allow
    words = hidden * table.element_size() // 2
    defines = {"VEC16": None} if (words % 8 == 0 and aligned(out, table)) else {}
    k = kernel("elementwise.cu", "embed", "pppii", dev(out), defines)
    chunks = words // 8 if defines else words
    k.launch((n,), (min(256, max(32, cdiv(chunks, 32) * 32)),),
             (out, table, ids, table.shape[0], words))


def silu_mul_ok(out, gate_up) -> bool:
    return contig(out, gate_up) and out.dtype == gate_up.dtype and out.dtype in DTYPE_NAMES


def silu_mul(out, gate_up):
    """out (n, inter) = silu(gate) * up of gate_up (n, 2 * inter), gate columns first; the
    caller checked silu_mul_ok."""
    n, inter = out.shape
    v = vec(out.dtype, inter, out, gate_up)
    k = kernel("elementwise.cu", "silu_mul", "ppii", dev(out),
               {"DTYPE": DTYPE_NAMES[out.dtype], "VEC": v})
    k.launch((cdiv(n * inter // v, 256),), (256,), (out, gate_up, n, inter))


def xielu_ok(out, x) -> bool:
    return (contig(out, x) and out.dtype == x.dtype and out.shape == x.shape
            and out.dtype in DTYPE_NAMES)


def xielu(out, x, xielu_scalars):
    """out = xielu(x) elementwise (out may be x); the caller checked xielu_ok."""
    s = xielu_scalars
    count = x.numel()
    v = vec(x.dtype, count, out, x)
    k = kernel("elementwise.cu", "xielu", "ppqffff", dev(out),
               {"DTYPE": DTYPE_NAMES[x.dtype], "VEC": v})
    k.launch((cdiv(count // v, 256),), (256,), (out, x, count, s.alpha_p, s.alpha_n, s.beta, s.eps))


def weight8_to_bf16_ok(out, x) -> bool:
    return (contig(out, x) and one_byte(x) and out.dtype == torch.bfloat16
            and out.shape == x.shape and x.numel() % 16 == 0 and aligned(out, x))


def weight8_to_bf16(out, x):
    """out (bf16) = x, exactly, for a one-byte weight x (int8, or e4m3 bits: common.one_byte);
    the caller checked weight8_to_bf16_ok."""
    chunks = x.numel() // 16
    k = kernel("elementwise.cu", "weight8_to_bf16", "ppq", dev(out), weight_defines(x))
    k.launch((cdiv(chunks, 256),), (256,), (out, x, chunks))
