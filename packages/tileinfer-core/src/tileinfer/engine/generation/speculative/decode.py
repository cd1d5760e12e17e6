"""Speculative decoding: the target checks a proposer's drafts, several tokens per step.

Two loops. A proposer that drafts on the host and can guess past tokens the device has not
returned yet (``NgramProposer``: it has ``continuation``) runs the pipelined loop of
``tileinfer.engine.generation.speculative.pipelined``, which never waits for the GPU between steps and drafts
only while drafts keep being accepted. Other proposers (draft models, DFlash, custom ones) run
the synchronous loop below: propose, verify, read, repeat, with a ``DraftBudget`` that drafts
fewer tokens (down to none, probing again later) while drafts are rejected.

Each verify step runs the target once over ``[last, d_0 .. d_{k-1}]``: the last token (sampled,
not yet run) and k drafts, with the logits of every row (a static (k+1)-token step, captured in a
CUDA graph like the decode steps). Row j gives the distribution of the token after
``last, d_0 .. d_{j-1}``, so the step emits the tokens of rows 0..a, where a is the first row
whose draft is not accepted (or k when all are: row k then gives one token more). The keys and
values of the rejected drafts are rolled back with ``truncate``.

Greedy: row j emits the target's argmax (the backend's ``sample_tokens`` at temperature 0, the op
plain greedy decoding uses), and a draft is accepted when it equals it. The emitted tokens are
then those of plain greedy decoding: every backend computes each row of a step of up to 8 tokens
exactly as a 1-token step (ref: up to 32), so a verify row's logits equal the decode step's bit
for bit (tests/tileinfer-core/test_speculative_row_invariance.py); longer verify steps (k > 7 on
triton and cuda) may round differently and flip a near tie.

Sampling: row j < k runs the p/q rule (the backend's ``accept_tokens``: accept d_j with
probability min(1, p/q), else draw from max(p - q, 0) normalized), row k a plain sample. Stream
usage: the n-th new token of the generation (0-based) is drawn from the stream (seed, n), as in
plain generation: the prefill samples token 0 from (seed, 0), and a verify step whose first
emitted token is token g gives row j the stream (seed, g + j), the acceptance uniform and the
resampling noise both. The streams of the rows after a rejection are used again by the next
step, but nothing emitted depended on them, and the drafts come from the drafter's own stream
(``draft_seed``), so every emitted token is drawn with fresh randomness, independent of its
context and its draft: the output follows the target's distribution exactly. It is not the plain
sampled output token for token: an accepted draft is not the token plain sampling would draw.

Afterwards, as in plain generation, the sequence holds the input ids and every generated token
except the last (which was sampled but never run).
"""

from __future__ import annotations

import torch

from .pipelined import generate_pipelined
from .proposer import Draft, DraftBudget, SpecStats


def _room(runner, seq) -> int:
    """How many more positions seq can take: within max_len and the cache's free pages."""
    cache = runner.cache
    limit = min(runner.model.max_len, cache.max_seq_len) - len(seq)
    in_pages = len(seq.pages) * cache.page_size - len(seq) + cache.free_pages * cache.page_size
    return min(limit, in_pages)


def generate_speculative(runner, seq, ids, proposer, max_new_tokens: int, sampling, stop_ids,
                         seed: int, on_token=None, stats: SpecStats | None = None) -> list[int]:
    """Continue ``seq`` with ``ids`` and generate up to ``max_new_tokens`` tokens, checking the
    drafts of ``proposer`` (see the module docstring). Returns the new tokens without the stop
    token; counts steps and drafts in ``stats``. ``tileinfer.generate_into(...,
    speculative=proposer)`` calls this (and rolls the sequence back on an error)."""
    stats = SpecStats() if stats is None else stats
    stop = set(stop_ids)
    model, cache = runner.model, runner.cache
    device = model.device
    k_max = proposer.k
    runner.add_sizes(range(1, k_max + 2))
    proposer.begin(runner, seq, sampling, seed)
    if callable(getattr(proposer, "continuation", None)):
        return generate_pipelined(runner, seq, ids, proposer, max_new_tokens, sampling, stop,
                                  seed, on_token, stats)
    budget = DraftBudget(k_max, getattr(proposer, "adaptive", True))
    runner.seed.fill_(seed)
    runner.counter.zero_()
    out = torch.empty(k_max + 1, dtype=torch.int32, device=device)  # the tokens of a step
    last_counter = torch.empty(1, dtype=torch.int64, device=device)

    runner.forward(seq, ids, sampling)  # prefill: token 0 from the stream (seed, 0)
    emitted = [int(runner.next_token[0])]
    runner.check_finite(float(runner.logit_sum[0]), 0)
    new: list[int] = []
    while True:
        # seq holds everything before emitted[-1]; emitted[0] sits at position first.
        first = len(seq) - (len(emitted) - 1)
        for i, token in enumerate(emitted):
            if token in stop:
                cache.truncate(seq, first + i)
                return new
            new.append(token)
            if on_token is not None:
                on_token(token)
            if len(new) == max_new_tokens:
                cache.truncate(seq, first + i)  # the last token is not run
                return new
        last = emitted[-1]
        # Rows beyond the last token asked for are not needed; a step that does not fit the
        # cache would fail where a plain step may not.
        k = min(budget.next(), max_new_tokens - len(new) - 1, _room(runner, seq) - 1)
        drafts = proposer.propose(seq.tokens + [last], k) if k > 0 else []
        if not isinstance(drafts, Draft):
            drafts = Draft(drafts)
        drafts = drafts.truncated(max(k, 0))
        emitted = _verify(runner, seq, last, drafts, sampling, len(new), out, last_counter)
        for j, total in enumerate(emitted.sums):
            runner.check_finite(total, len(new) + j)
        stats.record(len(drafts), len(emitted) - 1)
        budget.record(len(drafts), len(emitted) - 1)


def _verify(runner, seq, last, drafts: Draft, sampling, counter: int, out, last_counter):
    """Run [last] + drafts on the target and return the tokens the step emits: the accepted
    drafts and one token of the target's. Rolls back the rejected drafts' positions."""
    ops = runner.model.ops
    n, start = len(drafts) + 1, len(seq)
    logits = runner.forward(seq, [last, *drafts], all_logits=True)  # (n, vocab)
    runner.counter.fill_(counter)
    t, top_k, top_p = sampling.temperature, sampling.top_k, sampling.top_p
    if sampling.greedy or n == 1:
        ops.sample_tokens(out[:n], logits, t, top_k, top_p, runner.seed, runner.counter, None)
    else:
        draft_ids = torch.tensor(list(drafts), dtype=torch.int32).to(logits.device)
        ops.accept_tokens(out[:n - 1], logits[:n - 1], draft_ids, drafts.probs, t, top_k, top_p,
                          runner.seed, runner.counter)
        torch.add(runner.counter, n - 1, out=last_counter)  # row n-1 uses (seed, counter + n-1)
        ops.sample_tokens(out[n - 1:n], logits[n - 1:], t, top_k, top_p, runner.seed,
                          last_counter, None)
    tokens = out[:n].tolist()  # waits for the step
    sums = logits[:n].sum(dim=1).tolist()  # NaN or inf in a row shows (runtime/finite.py)
    # A rejected row's token differs from its draft (greedy: it is the argmax the draft missed).
    accepted = 0
    while accepted < n - 1 and tokens[accepted] == drafts[accepted]:
        accepted += 1
    runner.cache.truncate(seq, start + 1 + accepted)  # keep last and the accepted drafts
    return _Emitted(tokens[:accepted + 1], sums[:accepted + 1])


class _Emitted(list):
    """The tokens a verify step emits, and ``sums``: the logits' sum of the row of each."""

    def __init__(self, tokens, sums):
        super().__init__(tokens)
        self.sums = sums
