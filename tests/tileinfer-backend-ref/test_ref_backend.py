"""The ref backend's two forms of attention (per sequence on the CPU, padded and sync-free on a
GPU) agree on every case of the conformance suite, so the conformance run of ref on a GPU checks
the padded form against the per-sequence reading."""

import pytest
import torch

from tileinfer.testing.conformance import ATTENTION_CASES, CACHE_KINDS, assert_close, fill_paged_step
from tileinfer_backend_ref import attention_padded, attention_per_sequence


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "block"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=str)
def test_padded_attention_equals_per_sequence(kind, causal, case):
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(len(q_lens) + heads)
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, "cpu", gen)
    # Unused pages holding NaN must not leak into the padded form's masked products.
    if cache.k.dtype.is_floating_point:
        used = torch.zeros(cache.k.shape[0], dtype=torch.bool)
        used[table.flatten().long()] = True
        used[table[:, -1].long()] = False  # the padding page
        cache.k[~used] = float("nan")
        cache.v[~used] = float("nan")
    a, b = torch.empty_like(q), torch.empty_like(q)
    args = (q, *cache.pools(), cu, ctx, table, max(q_lens), head_dim ** -0.5, causal)
    attention_per_sequence(a, *args)
    attention_padded(b, *args)
    assert_close(b, a)
