"""Logit bias, penalties and min_p: the exact definition of what a logits row goes through
before the sampling op (``sample_tokens`` / ``sample_per_row``), in plain torch, so that it runs
on every device and inside a CUDA graph (no host reads, no data-dependent shapes).

For a row sampled with ``SamplingParams`` p, with the output so far (the tokens sampled before
this one) and the prompt (every token before the output: for a continued sequence, all it holds),
in float32 and in vLLM's order:

1. logit_bias: ``x[i] = x[i] + b`` for each pair (i, b) (only those tokens);
2. repetition_penalty r, over the tokens of the prompt or the output: ``x[i] / r`` where
   ``x[i] > 0``, ``x[i] * r`` otherwise (a true division, as transformers' and vLLM's);
3. frequency_penalty f: ``x[i] - f * count(i)``, count(i) its occurrences in the output;
4. presence_penalty q: ``x[i] - q * (count(i) > 0)``;
5. min_p m (temperature > 0): with ``s = x * float32(1 / temperature)``, tokens whose
   ``exp(s - max s) < m`` (probability below m times the largest) get ``x[i] = -inf``.

Then the sampling op's own definition (``tileinfer.backend.sampling``: temperature, top_k,
top_p, Gumbel-max) on the result. Each step with its neutral value (no bias, r = 1, f = 0, q = 0,
m = 0) leaves every logit bit for bit as it was, so rows that use none of them can share a batch
with rows that do, and a row that uses one step is not changed by the others.

The per-row values travel as one float32 tensor (``row_values``) on the logits' device: the
arithmetic is then tensor by tensor on every path (a Python scalar divisor makes some CUDA
kernels multiply by its reciprocal, which rounds differently).
"""

from __future__ import annotations

import math

import torch

# Columns of row_values.
PRESENCE, FREQUENCY, REPETITION, MIN_P, INV_TEMPERATURE = range(5)


def row_values(params, device) -> torch.Tensor:
    """(n, 5) float32 on ``device``: each row's presence, frequency and repetition penalties,
    min_p (0 for a greedy row) and float32(1 / temperature) (0 for a greedy row)."""
    rows = [[p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
             0.0 if p.greedy else p.min_p, 0.0 if p.greedy else p.inv_temperature]
            for p in params]
    return torch.tensor(rows, dtype=torch.float32).to(device)


def bias_index(params, device):
    """(rows (b,) int64, ids (b,) int64, biases (b,) float32) on ``device`` for every row's
    logit_bias pairs, or None when no row has one."""
    entries = [(r, i, b) for r, p in enumerate(params) for i, b in p.logit_bias]
    if not entries:
        return None
    rows, ids, biases = zip(*entries)
    return (torch.tensor(rows, dtype=torch.int64).to(device),
            torch.tensor(ids, dtype=torch.int64).to(device),
            torch.tensor(biases, dtype=torch.float32).to(device))


def check_bias_ids(params, vocab_size: int):
    """ValueError when a logit_bias token id is outside the vocabulary."""
    bad = [i for i, _ in params.logit_bias if i >= vocab_size]
    if bad:
        raise ValueError(f"logit_bias names token {bad[0]}, outside the vocabulary "
                         f"(0..{vocab_size - 1})")


def token_state(prompt, output, vocab: int, device="cpu"):
    """(counts (1, vocab) float32: each token's occurrences in ``output``; seen (1, vocab) bool:
    the tokens of ``prompt`` or ``output``) from token id lists."""
    counts = torch.zeros(1, vocab, dtype=torch.float32, device=device)
    seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)
    out = torch.tensor(list(output), dtype=torch.int64, device=device)
    counts[0].index_add_(0, out, torch.ones_like(out, dtype=torch.float32))
    seen[0, torch.tensor(list(prompt), dtype=torch.int64, device=device)] = True
    seen[0, out] = True
    return counts, seen


def process_logits(logits, values, counts=None, seen=None, bias=None,
                   min_p: bool = False) -> torch.Tensor:
    """Steps 1-5 of the module docstring: a new (n, vocab) float32 tensor.

    logits (n, vocab) float32 (not changed); values (n, 5) from ``row_values``; counts (n,
    vocab) float32 and seen (n, vocab) bool from ``token_state`` (or kept up to date on the
    device), None when no row has a penalty; bias from ``bias_index`` or None; min_p: whether
    some row uses min_p (the step is skipped otherwise: with m = 0 it keeps every token).
    """
    x = logits.float().clone()
    if bias is not None:
        rows, ids, biases = bias
        x.index_put_((rows, ids), x[rows, ids] + biases)
    if counts is not None:
        rep = values[:, REPETITION:REPETITION + 1]
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
        x = x - values[:, FREQUENCY:FREQUENCY + 1] * counts
        x = x - values[:, PRESENCE:PRESENCE + 1] * (counts > 0).float()
    if min_p:
        s = x * values[:, INV_TEMPERATURE:INV_TEMPERATURE + 1]
        keep = torch.exp(s - s.amax(-1, keepdim=True)) >= values[:, MIN_P:MIN_P + 1]
        x = torch.where(keep, x, -math.inf)
    return x


def count_tokens(counts, seen, ids):
    """Add each row's sampled token to its state: counts, seen (n, vocab); ids (n,) int on the
    device (row j's token is ids[j]). In place, no host read."""
    index = ids.long().view(-1, 1)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=counts.dtype))
    seen.scatter_(1, index, True)


def process_host(logits, params, prompt=(), output=()) -> torch.Tensor:
    """The processed row (1, vocab) float32 for one logits row with ``params``, the prompt's and
    the output's token ids: the definition, on the host."""
    row = logits.detach().float().cpu().reshape(1, -1)
    counts = seen = None
    if params.penalized:
        counts, seen = token_state(prompt, output, row.shape[-1])
    return process_logits(row, row_values([params], "cpu"), counts, seen,
                          bias_index([params], "cpu"), min_p=params.min_p > 0 and not params.greedy)
