"""Logit bias, penalties and min_p for the rows of a batched step, each with its request's
parameters (``tileinfer.backend.logit_processing`` defines them; ``sample_host`` with the
request's prompt and output so far gives the same token).

Only the rows whose parameters ask for them are processed, into a copy of the step's logits;
the other rows are copied as they are, and a step without such rows costs nothing. A request
with a penalty keeps ``TokenCounts`` on the device (``Request.token_counts``, made at its first
sampled token): its output's token counts and the tokens seen (prompt and output), updated on the
device right after each of its tokens is sampled (``count_rows``), so that a step launched from
the previous step's ids before the host reads them (the engine's pipelining) sees that token.
``counted`` says how many output tokens they hold; when a row's token index k differs from it (a
sampled token that was never committed, e.g. a failed step), they are rebuilt from the host's
tokens.

A request's ``min_new_tokens`` holds its stop ids back (their logits -inf) in the rows that
sample its first min_new_tokens tokens (``hold_stops``); the raw logits, which the logprobs and
the finite check read, keep them.
"""

from __future__ import annotations

import torch

from ...backend.logit_processing import (bias_index, count_tokens, process_logits, row_values,
                                         token_state)


class TokenCounts:
    """counts (1, vocab) float32 and seen (1, vocab) bool of one request, on the device."""

    def __init__(self, vocab: int, device):
        self.vocab, self.device = vocab, device
        self.counts = torch.zeros(1, vocab, dtype=torch.float32, device=device)
        self.seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)
        self.counted = -1  # output tokens held; -1: not set up yet

    def sync(self, req, k: int):
        """Hold the first k output tokens of req (rebuilt from the host's when they do not)."""
        if self.counted == k:
            return
        if k > len(req.output):  # the host does not know them all: a broken invariant
            raise RuntimeError(f"request {req.request_id}: token counts of {self.counted} "
                               f"tokens, {len(req.output)} known, token {k} to sample")
        counts, seen = token_state(req.prompt, req.output[:k], self.vocab, self.device)
        self.counts.copy_(counts)
        self.seen.copy_(seen)
        self.counted = k


def process_rows(logits: torch.Tensor, reqs, counters: list[int]) -> torch.Tensor:
    """The logits (m, vocab) float32 to sample from for rows of reqs (row j: reqs[j]'s token
    counters[j]): ``logits`` itself when no row asks for processing, else a new tensor."""
    params = [req.sampling for req in reqs]
    rows = [j for j, p in enumerate(params) if p.processes_logits]
    if not rows:
        return logits
    dev, vocab = logits.device, logits.shape[1]
    chosen = [params[j] for j in rows]
    counts = seen = None
    if any(p.penalized for p in chosen):
        # Rows without a penalty take zero counts and neutral values: unchanged, bit for bit.
        zeros = torch.zeros(1, vocab, dtype=torch.float32, device=dev)
        unseen = torch.zeros(1, vocab, dtype=torch.bool, device=dev)
        parts = []
        for j in rows:
            if params[j].penalized:
                state = reqs[j].token_counts
                if state is None:
                    state = reqs[j].token_counts = TokenCounts(vocab, dev)
                state.sync(reqs[j], counters[j])
                parts.append((state.counts, state.seen))
            else:
                parts.append((zeros, unseen))
        counts = torch.cat([c for c, _ in parts])
        seen = torch.cat([s for _, s in parts])
    index = torch.tensor(rows, dtype=torch.int64).to(dev, non_blocking=True)
    x = process_logits(logits.index_select(0, index), row_values(chosen, dev), counts, seen,
                       bias_index(chosen, dev), min_p=any(p.min_p > 0 and not p.greedy
                                                          for p in chosen))
    return logits.clone().index_copy_(0, index, x)


def count_rows(ids: torch.Tensor, reqs, counters: list[int]):
    """After sampling ids (m,) on the device: each penalized row's token joins its counts."""
    for j, req in enumerate(reqs):
        if req.sampling.penalized:
            state = req.token_counts
            count_tokens(state.counts, state.seen, ids[j:j + 1])
            state.counted = counters[j] + 1


def hold_stops(logits: torch.Tensor, reqs, counters: list[int]) -> torch.Tensor:
    """The logits (m, vocab) with each request's stop ids at -inf in the rows that sample one
    of its first min_new_tokens tokens (row j: reqs[j]'s token counters[j]); ``logits`` itself
    when no row holds them, else a new tensor."""
    pairs = [(j, i) for j, req in enumerate(reqs) if counters[j] < req.min_new_tokens
             for i in sorted(req.stop_ids)]
    if not pairs:
        return logits
    index = torch.tensor(pairs, dtype=torch.int64).to(logits.device, non_blocking=True)
    out = logits.clone()
    out[index[:, 0], index[:, 1]] = float("-inf")
    return out
