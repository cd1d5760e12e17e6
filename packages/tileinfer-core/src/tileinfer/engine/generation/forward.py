"""Eager forward steps with buffers made for the step: the simplest way to run a model."""

from __future__ import annotations

import torch

from ...model.decoder import Model
from ..kv.cache import PagedKVCache, Sequence, check_cache
from ..kv.step import as_token_ids, prepare_step


def forward_batch(model: Model, cache: PagedKVCache, seqs: list[Sequence], token_lists,
                  all_logits: bool = False) -> torch.Tensor:
    """One eager step over several sequences: logits (m, vocab) float32, rows in sequence order
    (each sequence's last token, or every token with all_logits). Appends the ids to each
    sequence. On error no sequence changes (pages reserved for the step are given back)."""
    check_cache(model, cache)
    token_lists = [as_token_ids(ids) for ids in token_lists]
    lengths = [len(seq) for seq in seqs]
    meta = prepare_step(cache, seqs, token_lists, all_logits=all_logits, max_len=model.max_len)
    try:
        buffers = model.new_buffers(meta.num_tokens, meta.num_logits)
        logits = model.forward_step(meta, buffers, cache)
    except BaseException:
        for seq, n in zip(seqs, lengths):
            cache.truncate(seq, n)
        raise
    for seq, ids in zip(seqs, token_lists):
        seq.tokens.extend(ids)
    return logits


def forward(model: Model, cache: PagedKVCache, seq: Sequence, ids,
            all_logits: bool = False) -> torch.Tensor:
    """Run the token ids at the positions after those cached in seq; store their keys and
    values in cache and append them to seq. Returns float32 logits: (1, vocab) for the last
    token, or (len(ids), vocab) with all_logits. Runs eagerly with buffers made for this step.

    A step that would take seq past the model's max_len (ContextLengthError) or need more pages
    than are free (OutOfPagesError) raises before anything changes.
    """
    return forward_batch(model, cache, [seq], [ids], all_logits=all_logits)
