"""sampling.cu: device sampling and the speculative p/q accept rule, token-identical to the host
definition (tileinfer.backend.sampling); one block per logit row, or for greedy rows without
probabilities the argmax split over the vocabulary (the decode step's case). sample_per_row: a
batched step's rows, each with its own parameters and stream, one block per row."""

from __future__ import annotations

import torch
from tileinfer.backend.sampling import SamplingParams

from .common import ARGMAX_SCRATCH, ArgmaxScratch, cdiv, contig, dev, fallback, kernel
from .tuning import pdl

# Every float operation rounds as the host's does.
SAMPLING_OPTIONS = ("-fmad=false",)


def _ok(logits, *others) -> bool:
    return logits.dim() == 2 and logits.dtype == torch.float32 and contig(logits, *others)


def sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
    _sample(out, None, logits, temperature, top_k, top_p, seed, counter, probs_out)


def sample_tokens_with_sums(out, sums, logits, temperature, top_k, top_p, seed, counter):
    """Greedy rows: the split argmax adds up each row as it reads it; other rows: sample_tokens
    and a torch reduction."""
    if not (sums.dtype == torch.float32 and sums.dim() == 1 and contig(sums)
            and sums.device == logits.device and sums.shape[0] == logits.shape[0]):
        raise ValueError("sample_tokens_with_sums: sums must be (n,) float32 on the logits' "
                         "device")
    if not _sample(out, sums, logits, temperature, top_k, top_p, seed, counter, None):
        torch.sum(logits, dim=1, out=sums)


def _sample(out, sums, logits, temperature, top_k, top_p, seed, counter, probs_out) -> bool:
    """sample_tokens; with sums, also the rows' sums where the split argmax runs. Whether it
    wrote the sums."""
    params = SamplingParams(temperature, top_k, top_p)  # validates, as the host does
    if not (_ok(logits, out, seed, counter, probs_out) and out.dtype == torch.int32
            and (probs_out is None or probs_out.dtype == torch.float32)):
        fallback("sample_tokens", "layout", out, logits, temperature, top_k, top_p, seed,
                 counter, probs_out)
        return False
    n, vocab = logits.shape
    if n == 0:
        return True
    device = dev(logits)
    chunks = cdiv(vocab, ArgmaxScratch.ARGMAX_CHUNK)
    scratch = ARGMAX_SCRATCH.get(device)
    if (params.greedy and probs_out is None and scratch is not None and n <= ArgmaxScratch.ROWS
            and chunks <= ArgmaxScratch.CHUNKS):
        part_v, part_i, counters, part_s = scratch
        k = kernel("sampling.cu", "argmax_split", "ppiippppp", device, None, SAMPLING_OPTIONS)
        k.launch((chunks, n), (256,), (out, logits, vocab, ArgmaxScratch.ARGMAX_CHUNK, part_v,
                                       part_i, counters, sums, part_s if sums is not None
                                       else None), pdl=pdl(device))
        return True
    inv_t = 1.0 if params.greedy else params.inv_temperature
    k = kernel("sampling.cu", "sample", "ppiififppp", device, None, SAMPLING_OPTIONS)
    k.launch((n,), (1024,), (out, logits, vocab, int(params.greedy), inv_t, int(top_k),
                             float(top_p), seed, counter, probs_out))
    return False


def sample_per_row(out, logits, inv_temperature, top_k, top_p, seed, counter):
    """One block per row, each with its own parameters and stream (the kernel `sample`'s row code
    with per-row arguments)."""
    if not (_ok(logits, out, inv_temperature, top_k, top_p, seed, counter)
            and out.dtype == top_k.dtype == torch.int32
            and inv_temperature.dtype == top_p.dtype == torch.float32
            and seed.dtype == counter.dtype == torch.int64):
        return fallback("sample_per_row", "layout", out, logits, inv_temperature, top_k, top_p,
                        seed, counter)
    n, vocab = logits.shape
    if n == 0:
        return
    k = kernel("sampling.cu", "sample_per_row", "ppippppp", dev(logits), None, SAMPLING_OPTIONS)
    k.launch((n,), (1024,), (out, logits, vocab, inv_temperature, top_k, top_p, seed, counter))


def accept_tokens(out, logits, draft_ids, draft_probs, temperature, top_k, top_p, seed, counter):
    params = SamplingParams(temperature, top_k, top_p)
    if not (_ok(logits, out, draft_ids, draft_probs, seed, counter)
            and out.dtype == draft_ids.dtype == torch.int32
            and (draft_probs is None or draft_probs.dtype == torch.float32)):
        return fallback("accept_tokens", "layout", out, logits, draft_ids, draft_probs,
                        temperature, top_k, top_p, seed, counter)
    n, vocab = logits.shape
    if n == 0:
        return
    inv_t = 1.0 if params.greedy else params.inv_temperature
    k = kernel("sampling.cu", "accept", "ppppiififpp", dev(logits), None, SAMPLING_OPTIONS)
    k.launch((n,), (1024,), (out, logits, draft_ids, draft_probs, vocab, int(params.greedy), inv_t,
                             int(top_k), float(top_p), seed, counter))
