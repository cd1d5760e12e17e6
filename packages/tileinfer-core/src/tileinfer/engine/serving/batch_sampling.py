"""Sampling the rows of a batched step, each with its own parameters and random stream.

A batch row r needs its request's parameters and the stream ``(seed_r, k_r)`` (its seed, and the
index k_r of the token it samples). A backend with the optional ``sample_per_row`` op samples
every row in one call. Otherwise ``sample_tokens``, which takes one (temperature, top_k, top_p)
for all its rows, one seed tensor, and gives row j the stream ``(seed, counter + j)``:

- greedy rows ignore the stream: all of them go in one call;
- other rows are grouped by (temperature, top_k, top_p, seed) and, within a group, by runs of
  consecutive counters (row j of a call uses counter + j): one call per run. Requests rarely
  share a seed, so in practice this is one call per sampled row.

``sample_batch`` is the one place that knows this.
"""

from __future__ import annotations

import torch

from ...backend.sampling import SamplingParams, row_parameters
from ..runtime.finite import sample_with_sums


def _runs(rows, counters):
    """Split rows (sorted by counter) into runs of consecutive counters."""
    runs, current = [], []
    for r in sorted(rows, key=lambda r: counters[r]):
        if current and counters[r] != counters[current[-1]] + 1:
            runs.append(current)
            current = []
        current.append(r)
    if current:
        runs.append(current)
    return runs


_NO_STREAM: dict = {}


def _no_stream(dev) -> torch.Tensor:
    """A zero seed / counter for calls whose rows are all greedy (read by no row), per device."""
    t = _NO_STREAM.get(dev)
    if t is None:
        t = _NO_STREAM[dev] = torch.zeros(1, dtype=torch.int64, device=dev)
    return t


def sample_batch(ops, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                 counters: list[int], sums: torch.Tensor | None = None) -> torch.Tensor:
    """Token ids (m,) int32 on logits' device for logits (m, vocab) float32: row r sampled with
    params[r] from the stream (seeds[r], counters[r]), as ``sample_host`` would. sums: (m,)
    float32 to receive each row's logit sum (engine/runtime/finite.py), or None."""
    m = logits.shape[0]
    if not len(params) == len(seeds) == len(counters) == m:
        raise ValueError(f"sample_batch: {m} logit rows, {len(params)} params, {len(seeds)} "
                         f"seeds and {len(counters)} counters")
    dev = logits.device
    out = torch.empty(m, dtype=torch.int32, device=dev)
    groups: dict[tuple, list[int]] = {}
    for r, p in enumerate(params):
        key = ("greedy",) if p.greedy else (p.temperature, p.top_k, p.top_p, seeds[r])
        groups.setdefault(key, []).append(r)
    if list(groups) == [("greedy",)]:  # greedy rows read no stream: one call, no upload
        p, none = params[0], _no_stream(dev)
        if sums is not None:
            sample_with_sums(ops, out, sums, logits, p.temperature, p.top_k, p.top_p, none, none)
        else:
            ops.sample_tokens(out, logits, p.temperature, p.top_k, p.top_p, none, none, None)
        return out
    if sums is not None:
        torch.sum(logits, dim=1, out=sums)
    # Seeds and counters of every row in one host-to-device copy; calls take 1-element views.
    streams = torch.tensor([seeds, counters], dtype=torch.int64).to(dev, non_blocking=True)
    if ops.sample_per_row is not None:  # every row in one call
        inv_t, top_k, top_p = row_parameters(params)
        floats = torch.tensor([inv_t, top_p], dtype=torch.float32).to(dev, non_blocking=True)
        ops.sample_per_row(out, logits, floats[0], torch.tensor(top_k, dtype=torch.int32).to(
            dev, non_blocking=True), floats[1], streams[0], streams[1])
        return out
    for key, rows in groups.items():
        p = params[rows[0]]
        runs = [rows] if key == ("greedy",) else _runs(rows, counters)
        for run in runs:
            first = run[0]
            contiguous = run == list(range(first, first + len(run)))
            if contiguous:  # rows next to each other: the op reads and writes views
                src, dst = logits[first:first + len(run)], out[first:first + len(run)]
            else:
                index = torch.tensor(run, dtype=torch.long).to(dev, non_blocking=True)
                src = logits.index_select(0, index)
                dst = torch.empty(len(run), dtype=torch.int32, device=dev)
            ops.sample_tokens(dst, src, p.temperature, p.top_k, p.top_p,
                              streams[0, first:first + 1], streams[1, first:first + 1], None)
            if not contiguous:
                out.index_copy_(0, index, dst)
    return out


def token_logprobs(logits: torch.Tensor, ids: list[int], tops: list[int]) -> list[tuple]:
    """For logits (m, vocab) and the sampled ids: row r's (log-probability of ids[r], its
    tops[r] most likely (id, log-probability) pairs), from the log-softmax of the raw logits."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, torch.tensor(ids, device=lp.device).view(-1, 1)).view(-1).tolist()
    top_v, top_i = lp.topk(max(tops), dim=-1)
    top_v, top_i = top_v.tolist(), top_i.tolist()
    return [(chosen[r], list(zip(top_i[r][:tops[r]], top_v[r][:tops[r]])))
            for r in range(len(ids))]


def sampled_logprobs(rows: torch.Tensor, reqs, ids: list[int]) -> dict[int, tuple]:
    """{j: ``token_logprobs`` entry of ids[j]} for the sampled rows j (rows (m, vocab)) whose
    request reqs[j] asked for logprobs."""
    want = [j for j, req in enumerate(reqs) if req.logprobs is not None]
    if not want:
        return {}
    found = token_logprobs(rows[want], [ids[j] for j in want], [reqs[j].logprobs for j in want])
    return dict(zip(want, found))
