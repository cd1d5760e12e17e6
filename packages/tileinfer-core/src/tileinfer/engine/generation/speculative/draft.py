"""A draft model: a smaller model of the same vocabulary decodes k tokens ahead of the target.

The draft model has its own paged KV cache, sequence and ``ModelRunner`` (CUDA graphs where the
target has them). Each proposal first brings the draft sequence in step with the target's tokens:
it keeps the longest common prefix (rolling the rest back with ``truncate``: the drafts the target
rejected), runs the tokens it lacks (usually the target's last token, or two when every draft was
accepted), then decodes k tokens, each fed to the next step on the device (no host round trip
between draft steps; one wait at the end for the k ids).

Drafts are the draft model's argmax, or, with ``sample=True`` and a target that samples, samples
with the target's sampling parameters from the drafter's own random stream, returned with their
distributions q (the ``probs_out`` of ``sample_tokens``) for the p/q rule.
"""

from __future__ import annotations

import torch

from ....backend.sampling import SamplingParams
from ...kv.cache import common_prefix_len, new_cache
from ..runner import ModelRunner
from .proposer import Draft, Proposer, check_k, draft_seed


class DraftProposer(Proposer):
    """Drafts of ``draft_model`` (a loaded ``Model``), up to k per step (fewer, down to none,
    while they are rejected: ``adaptive``, see ``DraftBudget``), on a cache of its own for up
    to ``max_tokens`` positions (default: the draft model's max_len). Near the end of that
    cache it drafts fewer tokens, then none."""

    def __init__(self, draft_model, k: int = 4, sample: bool = False,
                 max_tokens: int | None = None, graphs: bool | None = None, page_size: int = 16,
                 adaptive: bool = True):
        self.k = check_k(k)
        self.adaptive = bool(adaptive)
        self.model, self.sample = draft_model, bool(sample)
        max_tokens = draft_model.max_len if max_tokens is None else max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
            raise ValueError(f"max_tokens must be an integer >= 2, got {max_tokens!r}")
        self.cache = new_cache(draft_model, max_tokens, page_size=page_size)
        self.runner = ModelRunner(draft_model, self.cache, graphs=graphs)
        self.seq = self.cache.new_sequence()
        self.capacity = min(draft_model.max_len, self.cache.max_seq_len,
                            self.cache.num_pages * page_size)
        self.sampling = SamplingParams()
        self._drafts = torch.empty(self.k, dtype=torch.int32, device=draft_model.device)
        self._probs = None  # (k, vocab) float32, made when first sampling
        self._proposed_for = 0  # len(tokens) of the last proposal

    def __repr__(self):
        return f"DraftProposer({self.model!r}, k={self.k}, sample={self.sample})"

    def begin(self, runner, seq, sampling, seed):
        target = runner.model
        vocab, draft_vocab = target.config.vocab_size, self.model.config.vocab_size
        if draft_vocab != vocab:
            raise ValueError(f"the draft model's vocabulary ({draft_vocab} tokens) differs from "
                             f"the target's ({vocab}): a draft model must share the target's "
                             "tokenizer")
        if self.model.device.type != target.device.type:
            raise ValueError(f"the draft model runs on {self.model.device}, the target on "
                             f"{target.device}")
        self.sampling = sampling if self.sample else SamplingParams()
        if not self.sampling.greedy and self._probs is None:
            self._probs = torch.empty(self.k, vocab, dtype=torch.float32,
                                      device=self.model.device)
        self.runner.seed.fill_(draft_seed(seed))

    def propose(self, tokens, k: int) -> Draft:
        tokens = [int(t) for t in tokens]
        # The draft sequence will hold tokens and k - 1 drafts.
        k = min(k, self.k, self.capacity - len(tokens) + 1)
        if k < 1 or not tokens:
            return Draft()
        runner, seq, params = self.runner, self.seq, self.sampling
        # Usually the tokens of the last proposal are still a common prefix: compare them in one
        # list comparison, then element by element only past them.
        m = min(self._proposed_for, len(seq), len(tokens))
        start = m if seq.tokens[:m] == tokens[:m] else 0
        common = start + common_prefix_len(seq.tokens[start:], tokens[start:])
        keep = min(common, len(tokens) - 1)
        self._proposed_for = len(tokens)
        self.cache.truncate(seq, keep)
        new = tokens[keep:]
        if len(new) > self.k + 1:
            # Longer than any verify step: a prompt, which the target ran as one step and then
            # sampled the last token from. Run it the same way (the prompt, then that token in
            # a 1-token step), so that a draft model equal to the target computes that token's
            # keys, values and logits bit for bit as the target did (a prompt step's matrix
            # products round differently from a decode step's).
            runner.forward(seq, new[:-1])
            new = new[-1:]
        logits = runner.forward(seq, new)
        probs = None if params.greedy else self._probs[:k]
        for j in range(k):
            # Draft j is for position len(tokens) + j; its stream is the drafter's.
            runner.counter.fill_(len(tokens) + j)
            q = None if probs is None else probs[j:j + 1]
            runner.model.ops.sample_tokens(runner.next_token, logits, params.temperature,
                                           params.top_k, params.top_p, runner.seed,
                                           runner.counter, q)
            self._drafts[j:j + 1].copy_(runner.next_token)
            if j + 1 < k:
                logits = runner.decode_from_device(seq, None)  # input: the draft just sampled
        ids = self._drafts[:k].tolist()
        seq.tokens[len(tokens):] = ids[:k - 1]  # the placeholders of decode_from_device
        return Draft(ids, probs)
