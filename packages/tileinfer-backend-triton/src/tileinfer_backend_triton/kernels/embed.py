"""Embedding lookup: ``out[i] = table[ids[i]]``, an exact row copy (no cast)."""

from __future__ import annotations

import triton
import triton.language as tl

from .common import INTERPRET_MODE, next_pow2, pdl_args, pdl_launch_dependents, pdl_wait


@triton.jit
def _embed_kernel(out_ptr, table_ptr, ids_ptr, H, s_out, s_table, BLOCK: tl.constexpr,
                  PDL: tl.constexpr):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(ids_ptr + i).to(tl.int64)
    vals = tl.load(table_ptr + row * s_table + cols, mask=cols < H)
    tl.store(out_ptr + i.to(tl.int64) * s_out + cols, vals, mask=cols < H)


def launch_embed(out, table, ids):
    n, hidden = out.shape
    if n == 0:
        return
    block = min(next_pow2(hidden), 8192 if INTERPRET_MODE else 2048)
    grid = (n, triton.cdiv(hidden, block))
    _embed_kernel[grid](out, table, ids, hidden, out.stride(0), table.stride(0), BLOCK=block,
                        num_warps=4, **pdl_args())
