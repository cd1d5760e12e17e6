"""Grammars (structured outputs) for the rows of a batched step: each structured request keeps a
``GrammarMatcher`` (``Request.grammar``, made at its first sampled token) that has taken its
output so far. Before a step's rows are sampled, each structured row's allowed-token bitmask is
computed on the host (while the device runs the step's forward, launched before) and its
disallowed logits set to -inf; after the host reads a token, ``advance`` has the matcher take
it. A request with a grammar is never pipelined (its next mask needs this token on the host),
and a step without such rows costs nothing.
"""

from __future__ import annotations

import torch

from ...backend.grammar import mask_logits


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
    out = logits.clone()
    for j in rows:
        m = _matcher(reqs[j], counters[j])
        host = torch.zeros(1, m.words, dtype=torch.int32)
        m.fill(host[0])
        words = host.to(logits.device, non_blocking=True)
        out[j:j + 1] = mask_logits(logits[j:j + 1], words)
    return out


def advance(req, token: int) -> str | None:
    """Have req's grammar take its committed (non-stop) token: "done" when the grammar allows
    nothing more (the request ends), an error message when it rejects the token, else None."""
    m = _matcher(req, len(req.output) - 1)
    if not m.advance(token):
        return f"the grammar rejected token {token}: {m.error}"
    return "done" if m.done else None
