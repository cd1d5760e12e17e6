"""Paged attention: attention.cu (prefill, and any step of more than ATTN_DECODE_MAX_TOKENS query
tokens per sequence) and attention_decode.cu (decode and verify steps: the four warps of a block
split each key tile; for 1-token steps it can also do attention_inputs' work).

q, out: (tokens, heads, head_dim) bf16 with head_dim a multiple of 64 up to 256; pages bf16 or
INT8 (``LayerKV``). Both kernels split the context over blocks where a step has few query rows
(flash-decoding); the workspace holds the splits' partial outputs. The decode kernel's split
count depends on the batch, the kv heads and the GPU only, and a row's split boundaries on its
own context only, so a row of a verify step equals the 1-token step at its position bit for bit,
also on a cache of another size (docs/cuda-kernels.md). Batch-invariant steps
(``step.batch_invariant``) run every row, prefill rows too, on attention_decode.cu with splits of
INVARIANT_SPLIT_KEYS keys from position 0, so a row's result depends on its query and its keys
only (docs/determinism.md).
"""

from __future__ import annotations

import math

import torch

from . import kv as _kv
from .common import (DTYPE_NAMES, aligned, cdiv, contig, dev, fallback, kernel, num_sms,
                     smem_limit, smem_per_multiprocessor)
from .tuning import attention_config, pdl

# Split-KV for steps of at most this many query rows; the workspace holds this many.
SPLIT_MAX_TOKENS = 32
MAX_SPLITS = 64  # workspace capacity; the split count used: attention_decode_splits / _launch
ATTN_BLOCK_N = 64  # keys per tile (both kernels)
ATTN_BLOCK_M = 64  # packed query rows per block of attention.cu
# Steps of at most this many query tokens per sequence run attention_decode.cu (16: a DFlash block).
ATTN_DECODE_MAX_TOKENS = 16
# attention_decode.cu's tuning defines and their defaults (passed only when the config differs,
# so the default build has one cache key).
_KERNEL_DEFAULTS = {"decode_combine_batch": ("COMBINE_BATCH", 8),
                    "decode_min_split_tiles": ("MIN_SPLIT_TILES", 1)}
_PDL_TRIGGERS = {"start": 0, "after_loop": 1}
# Batch-invariant steps (AttentionStep.batch_invariant): every row on attention_decode.cu with
# splits of this many keys from position 0, whatever the step holds (kernel's SPLIT_KEYS).
INVARIANT_SPLIT_KEYS = 256


def invariant_split_keys(cfg: dict) -> int:
    """The keys of a batch-invariant split: INVARIANT_SPLIT_KEYS, or the experiment switch's
    "invariant_split_keys" (a multiple of ATTN_BLOCK_N)."""
    keys = int(cfg.get("invariant_split_keys", INVARIANT_SPLIT_KEYS))
    if keys <= 0 or keys % ATTN_BLOCK_N:
        raise ValueError(f"invariant_split_keys: {keys} is not a multiple of {ATTN_BLOCK_N}")
    return keys


# No multiply-add contraction: each m-tile's unrolled copy of the per-row arithmetic rounds the
# same way (row invariance).
DECODE_OPTIONS = ("-fmad=false",)
# attention_decode.cu's fused-input arguments when there are none.
_NO_INPUTS = (None,) * 7 + (0.0,)


class _InvariantWorkspace:
    """The split workspace of batch-invariant steps, per device: every row of any step may
    split, so it is sized by the step's rows and longest context (the model's workspace holds
    SPLIT_MAX_TOKENS rows). Zeros when made (the kernel keeps its counters there and re-arms
    them); it grows outside graph captures (a step always runs eagerly before its capture) and
    a grown-out buffer is kept, since captured graphs may still use it."""

    def __init__(self):
        self._buffers: dict[tuple[int, int], list[torch.Tensor]] = {}

    def get(self, device: int, tokens: int, heads: int, splits: int, head_dim: int) -> torch.Tensor:
        buffers = self._buffers.setdefault((device, head_dim), [])  # the kernel's WS_ROW
        need = (tokens, heads, splits, head_dim + 2)
        if buffers and all(have >= want for have, want in zip(buffers[-1].shape, need)):
            return buffers[-1]
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the batch-invariant attention workspace must grow, but a CUDA "
                               "graph is being captured (run the step eagerly first)")
        grown = tuple(max(a, b) for a, b in zip(buffers[-1].shape, need)) if buffers else need
        buffers.append(torch.zeros(grown, dtype=torch.float32, device=f"cuda:{device}"))
        return buffers[-1]


INVARIANT_WORKSPACE = _InvariantWorkspace()


def attention_workspace(num_tokens, num_heads, head_dim, max_context_len, device):
    """Split-KV scratch, float32 (tokens, heads, splits, head_dim + 2), for steps of up to
    num_tokens query rows; None where no step would split (more than SPLIT_MAX_TOKENS rows, or
    the switch's "split_max_tokens", fill the GPU with row tiles, or a context of one tile).
    Every cache that can split gets the full MAX_SPLITS, so that the decode split count does not
    depend on the cache's size."""
    splits = MAX_SPLITS if max_context_len > ATTN_BLOCK_N else 1
    most_tokens = attention_config().get("split_max_tokens", SPLIT_MAX_TOKENS)
    if splits <= 1 or not 0 < num_tokens <= most_tokens:
        return None
    return torch.zeros((num_tokens, num_heads, splits, head_dim + 2), dtype=torch.float32,
                       device=device)


def attention_ok(out, q, kv, step) -> bool:
    head_dim = q.shape[-1]
    return (q.dim() == 3 and q.dtype == out.dtype == torch.bfloat16 and out.shape == q.shape
            and contig(q, out, step.cu_seqlens_q, step.context_lens, step.block_table)
            and head_dim % 64 == 0 and head_dim <= 256 and aligned(q, out)
            and kv.k_cache.dtype in (torch.bfloat16, torch.int8)
            and q.shape[1] % kv.k_cache.shape[2] == 0
            and step.cu_seqlens_q.dtype == step.context_lens.dtype == step.block_table.dtype
            == torch.int32
            and _kv.cache_ok(kv, head_dim))


def attention_smem_bytes(head_dim: int, int8: bool, smooth: bool, stages: int) -> int:
    """sizeof(SharedTiles) of attention.cu: the query tile(s) and the K/V ring."""
    q_bytes = (2 if smooth else 1) * ATTN_BLOCK_M * head_dim * 2
    if int8:  # bf16 K and V tiles + per stage: raw int8 K and V, float32 scales
        return q_bytes + 2 * ATTN_BLOCK_N * head_dim * 2 + stages * (2 * ATTN_BLOCK_N * head_dim
                                                                      + 2 * ATTN_BLOCK_N * 4)
    return q_bytes + stages * 2 * ATTN_BLOCK_N * head_dim * 2


def attention_decode_m_tiles(head_dim: int, group: int) -> int:
    """16-row m-tiles per warp of attention_decode.cu (M_TILES): two where a verify step's
    ATTN_DECODE_MAX_TOKENS x group rows need more than one and the accumulators fit in registers
    (head_dim <= 128). A function of the model only, so steps of any size run the same build
    (one m-tile for 1-token steps measured slower end to end: benchmarks/RESULTS.md, 2026-11-30,
    "A/B of these CUDA changes, end to end")."""
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
    budget = smem_per_multiprocessor(device) // max(1, blocks_per_sm) - 1024 - 128
    stages = max_stages
    while stages > 2 and smem(stages) > budget:
        stages -= 1
    while stages > 1 and smem(stages) > smem_limit(device) - 1024:
        stages -= 1
    return stages


def attention_decode_tiles(max_context_len: int, num_splits: int, min_split_tiles: int = 1) -> int:
    """An upper bound on the key tiles a block of attention_decode.cu loads when its rows see at
    most max_context_len keys: two runs of at most one split's tiles each (a row tile whose rows
    straddle two split sizes loads the union of both), and at least 2. A deeper ring would only
    hold empty stages."""
    split_tiles = max(min_split_tiles, cdiv(max(1, max_context_len), ATTN_BLOCK_N * num_splits))
    return max(2, 2 * split_tiles)


def attention_decode_splits(batch: int, kv_heads: int, workspace_splits: int, device: int,
                            cfg: dict | None = None) -> int:
    """Split count of attention_decode.cu: at most decode_blocks_per_sm blocks per SM over the
    (sequence, kv head) pairs (one wave; at least one split, at most the workspace's). Rounding
    up would start a second, mostly empty wave: llama3-8b at batch 32 (256 pairs, 264 block
    slots) ran faster with 1 split than with 2 (benchmarks/RESULTS.md, 2026-12-01, "Batch 32:
    where the step goes, and the decode split count"). Neither the row tiles nor the cache's
    longest context count (splits past a row's keys exit at once), so a row's split boundaries
    depend on its own context only."""
    cfg = cfg or attention_config()
    slots = cfg["decode_blocks_per_sm"] * num_sms(device)  # one wave of blocks
    target = cfg.get("splits") or slots // (batch * kv_heads)
    return max(1, min(target, workspace_splits))


def attention(out, q, kv, step, scale, causal, workspace):
    if not attention_ok(out, q, kv, step):
        return fallback("attention", "dtype or layout", out, q, kv, step, scale, causal, workspace)
    _launch(out, q, kv, step, scale, causal, workspace, attention_config())


def attention_window(out, q, kv, step, scale, window, workspace):
    """No windowed kernel yet: the ref backend's (its padded form on a GPU, which never reads a
    tensor on the host, so a CUDA graph captures it), counted in fallback_counts."""
    fallback("attention_window", "no windowed kernel", out, q, kv, step, scale, window, workspace)


def attention_with_inputs(out, q_out, kv, qkv, qk, step, scale, causal, workspace):
    """attention_inputs then attention: one attention_decode.cu kernel (FUSED_INPUTS) for steps
    of one query token per sequence, the two ops otherwise."""
    cfg = attention_config()
    norm = qk.q_norm if qk.q_norm is not None else qk.k_norm
    if (cfg["decode"] and cfg["decode_fused_inputs"] and step.max_query_len == 1
            and q_out.shape[0] == step.batch > 0 and qkv.dtype == torch.bfloat16
            and (norm is None or norm.dtype == torch.bfloat16)
            and _kv.inputs_ok(q_out, kv, qkv, qk, step) and attention_ok(out, q_out, kv, step)):
        inputs = (qkv, qk.q_norm, qk.k_norm, qk.cos, qk.sin, step.positions, step.slots,
                  float(qk.norm_eps))
        return _launch(out, q_out, kv, step, scale, causal, workspace, cfg, inputs)
    _kv.attention_inputs(q_out, kv, qkv, qk, step)
    attention(out, q_out, kv, step, scale, causal, workspace)


def _launch(out, q, kv, step, scale, causal, workspace, cfg, inputs=None):
    """One attention launch on checked inputs. inputs (qkv, q_norm, k_norm, cos, sin, positions,
    slots, eps): the decode kernel computes q and stores the new key and value itself."""
    n_tokens, heads, head_dim = q.shape
    kv_heads = kv.k_cache.shape[2]
    batch = step.context_lens.shape[0]
    group = heads // kv_heads
    max_query_len, max_context_len = step.max_query_len, step.max_context_len
    if n_tokens == 0 or batch == 0 or max_query_len * group <= 0:
        return
    device = dev(q)
    int8 = kv.k_cache.dtype == torch.int8
    smooth = kv.k_smooth is not None
    invariant = bool(getattr(step, "batch_invariant", False))
    split_keys = invariant_split_keys(cfg) if invariant else 0
    decode = invariant or (cfg["decode"] and max_query_len <= ATTN_DECODE_MAX_TOKENS)
    if decode:  # attention_decode.cu: row tiles of 16 x m_tiles rows
        m_tiles = cfg.get("decode_m_tiles") or attention_decode_m_tiles(head_dim, group)
        row_tiles = cdiv(max_query_len * group, 16 * m_tiles)
    else:
        row_tiles = cdiv(max_query_len * group, ATTN_BLOCK_M)
    num_splits = 1
    ws = workspace
    if invariant:
        num_splits = cdiv(max(1, max_context_len), split_keys)
        # rows for the splits' partials, and for the counters of every (sequence, kv head, row
        # tile) that the kernel keeps in the workspace rows' last slot
        tokens = max(n_tokens, cdiv(batch * kv_heads * row_tiles, heads * num_splits))
        ws = (INVARIANT_WORKSPACE.get(device, tokens, heads, num_splits, head_dim)
              if num_splits > 1 else None)
    elif (ws is not None and n_tokens <= ws.shape[0] and ws.shape[1] == heads
            and ws.shape[3] == head_dim + 2
            and batch * kv_heads * row_tiles <= ws.shape[0] * heads * ws.shape[2]):
        if decode:
            num_splits = attention_decode_splits(batch, kv_heads, ws.shape[2], device, cfg)
        else:
            base_blocks = batch * kv_heads * row_tiles
            target = cfg.get("splits") or cdiv(cfg["blocks_per_sm"] * num_sms(device), base_blocks)
            num_splits = max(1, min(target, ws.shape[2], cdiv(max(1, max_context_len), ATTN_BLOCK_N)))
    limit = smem_limit(device) - 1024  # room for the static shared memory
    if decode:
        split_tiles = (split_keys // ATTN_BLOCK_N if invariant
                       else cfg["decode_min_split_tiles"])
        stages = cfg["decode_stages"] or min(
            attention_decode_stages(head_dim, int8, smooth, m_tiles, cfg["decode_blocks_per_sm"],
                                    device),
            attention_decode_tiles(max_context_len, num_splits, split_tiles))
        smem_bytes = lambda s: attention_decode_smem_bytes(head_dim, int8, smooth, s, m_tiles)  # noqa: E731
    else:
        stages = cfg["stages"]
        smem_bytes = lambda s: attention_smem_bytes(head_dim, int8, smooth, s)  # noqa: E731
    while stages > 1 and smem_bytes(stages) > limit:  # GPUs with less shared memory
        stages -= 1
    defines = {"HEAD_DIM": head_dim, "KV_INT8": int(int8), "SMOOTH": int(smooth), "KV_STAGES": stages}
    common = (out, q, kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale, kv.k_smooth,
              step.cu_seqlens_q, step.context_lens, step.block_table, heads, kv_heads,
              kv.k_cache.shape[1], step.block_table.shape[1], float(scale) * math.log2(math.e),
              int(bool(causal)), num_splits)
    split_ws = (ws if num_splits > 1 else None, ws.shape[2] if num_splits > 1 else 0)
    if not decode:
        assert inputs is None, "fused attention inputs need the decode kernel"
        k = kernel("attention.cu", "attention", "p" * 10 + "iiiif" + "ii" + "pi", device, defines)
        k.launch((row_tiles * num_splits, kv_heads, batch), (128,), common + split_ws,
                 smem_bytes(stages), pdl=pdl(device))
        return
    # Blocks only for the splits a row of this cache can have keys in (a split holds at least
    # 64 * decode_min_split_tiles keys); the partition itself is num_splits'.
    grid_splits = min(num_splits, cdiv(max(1, max_context_len), ATTN_BLOCK_N * split_tiles))
    decode_defines = {**defines, "M_TILES": m_tiles}
    if invariant:
        decode_defines["SPLIT_KEYS"] = split_keys
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
            decode_defines["NORM_DTYPE"] = DTYPE_NAMES[norm.dtype]
    k = kernel("attention_decode.cu", "attention_decode",
               "p" * 10 + "iiiif" + "iii" + "pi" + "p" * 7 + "f", device, decode_defines,
               DECODE_OPTIONS)
    k.launch((row_tiles * grid_splits, kv_heads, batch), (128,),
             common + (grid_splits,) + split_ws + (inputs or _NO_INPUTS),
             smem_bytes(stages), pdl=pdl(device))
