"""Prompt log-probabilities (``LLMEngine.add_request(..., prompt_logprobs=k)``): each prompt
token after the first gets its log-probability given the tokens before it and the k most likely
(id, log-probability) pairs, from the raw logits of the prompt's rows (evaluation harnesses
score a text this way).

The row at position p predicts the token at p + 1: a chunk of n tokens from position s gives the
entries of the prompt tokens s + 1 .. s + n (those inside the prompt). So every row of such a
request's prompt chunks needs its logits: those steps run eagerly (``BatchRunner.run_rows``),
the other requests' rows in them keep only their last row's logits. A request still missing
entries takes no cached prefix pages (their rows would never run) and, preempted, keeps the
entries it has: its recomputed chunks fill only the missing ones.

The entries are reported once, in ``RequestOutput.prompt_logprobs`` of the output of the step
that ran the prompt's last chunk (the request's first output): one per prompt token, None for
the first, then (log-probability, [(id, log-probability), ...] the k most likely).
"""

from __future__ import annotations

import torch

from .batch_sampling import token_logprobs
from .request import Request


def needs_rows(req: Request) -> bool:
    """Whether req's next chunk still has prompt rows whose logits it needs."""
    return req.prompt_logprobs is not None and len(req.prompt_lps) < len(req.prompt) - 1


def collect(reqs: list[Request], starts: list[int], rows: dict[int, torch.Tensor]):
    """Take the entries of the step's chunks: rows {i: (n, vocab) logits of reqs[i]'s chunk,
    which starts at position starts[i]} (``BatchRunner.run_rows``)."""
    for i, found in rows.items():
        _collect(reqs[i], starts[i], found)


def _collect(req: Request, start: int, rows: torch.Tensor):
    """Entries found before (a chunk recomputed after a preemption) are kept."""
    first = len(req.prompt_lps)  # the row at position `first` predicts the next entry's token
    end = min(start + rows.shape[0], len(req.prompt) - 1)  # rows past it predict outputs
    if end <= first:
        return
    targets = req.prompt[first + 1:end + 1]
    found = token_logprobs(rows[first - start:end - start], targets,
                           [req.prompt_logprobs] * len(targets))
    req.prompt_lps.extend(found)


def report(req: Request) -> list | None:
    """The prompt entries (None first) once all are found and not reported yet; else None."""
    if req.prompt_logprobs is None or req.prompt_reported or needs_rows(req):
        return None
    req.prompt_reported = True
    return [None, *req.prompt_lps]
