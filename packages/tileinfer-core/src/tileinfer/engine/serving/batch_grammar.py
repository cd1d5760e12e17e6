"""Grammars (structured outputs) for the rows of a batched step: each structured request keeps a
``GrammarMatcher`` (``Request.grammar``, made at its first sampled token) that has taken its
output so far. Before a step's rows are sampled, the structured rows' allowed-token bitmasks are
computed on the host, all at once on llguidance's threads (while the device runs the step's
forward, launched before), copied to the device together, and the disallowed logits set to -inf
in one operation; after the host reads a token, ``advance`` has the matcher take it. A
pipelined step of such rows runs its forward first and is sampled once the tokens before it are
committed (``LLMEngine``), since each next mask needs the token before it; a step without such
rows costs nothing.
"""

from __future__ import annotations

import torch

from ...backend.grammar import fill_masks, mask_logits


def _matcher(req, k: int):
    """req's matcher holding its first k output tokens (rebuilt from the host's when not)."""
    m = req.grammar
    if m is None or m.consumed != k:
        m = req.grammar = req.sampling.structure.matcher(req.stop_ids)
        for token in req.output[:k]:
            m.advance(token)
    return m


def mask_rows(logits: torch.Tensor, reqs, counters: list[int]) -> torch.Tensor:
    """The logits (m, vocab) to sample rows of reqs from (row j: reqs[j]'s token counters[j]):
    ``logits`` itself when no row has a grammar, else a copy with each grammar's mask."""
    rows = [j for j, req in enumerate(reqs) if req.sampling.structured]
    if not rows:
        return logits
    matchers = [_matcher(reqs[j], counters[j]) for j in rows]
    host = torch.empty((len(rows), matchers[0].words), dtype=torch.int32,
                       pin_memory=logits.is_cuda)
    fill_masks(matchers, host)
    words = host.to(logits.device, non_blocking=True)
    if len(rows) == len(reqs):
        return mask_logits(logits, words)
    out = logits.clone()
    index = torch.tensor(rows).to(logits.device, non_blocking=True)
    out[index] = mask_logits(logits[index], words).to(out.dtype)
    return out


def advance(req, token: int) -> str | None:
    """Have req's grammar take its committed (non-stop) token: "done" when the grammar allows
    nothing more (the request ends), an error message when it rejects the token, else None."""
    m = _matcher(req, len(req.output) - 1)
    if not m.advance(token):
        return f"the grammar rejected token {token}: {m.error}"
    return "done" if m.done else None
