"""The device state of logit bias, penalties and min_p for the sequence a ``ModelRunner``
generates (``tileinfer.backend.logit_processing`` defines what they do).

It is made once per runner, the first time a generation asks for one of them, and its tensors
keep their identity from then on, so that a step's CUDA graph reads them by address: the token
counts and the seen-token mask, set at the start of each generation (``begin``) and updated on
the device by every sampling step (``count``, inside the step's graph), the parameter values, and
one set of logit-bias buffers per bias length. A generation that uses none of them never touches
it: its steps run what they ran before.
"""

from __future__ import annotations

import torch

from ...backend.logit_processing import (check_bias_ids, count_tokens, process_logits,
                                         row_values)
from ...backend.sampling import SamplingParams


def graph_key(params: SamplingParams) -> tuple:
    """What a captured step's graph depends on besides (temperature, top_k, top_p): which steps
    run and the bias length (the values are read from the state's tensors), and whether a
    grammar mask applies. () when none run."""
    key = ("grammar",) if params.structured else ()
    if not params.processes_logits:
        return key
    return ("processed", params.penalized, len(params.logit_bias),
            params.min_p > 0 and not params.greedy, *key)


class SequenceGrammar:
    """The grammar of the generation a runner runs: its matcher, the next token's bitmask on
    the host (``host``, (1, words) int32, pinned on CUDA) and on the device (``words``, the
    tensor a step's graph reads by address; made once per bitmask width)."""

    def __init__(self, device):
        self.device = device
        self.matcher = None
        self.words: torch.Tensor | None = None
        self.host: torch.Tensor | None = None

    def begin(self, params: SamplingParams, stop_ids=()):
        self.matcher = params.structure.matcher(stop_ids)
        n = self.matcher.words
        if self.words is None or self.words.shape[1] != n:
            self.words = torch.zeros(1, n, dtype=torch.int32, device=self.device)
            pin = self.words.is_cuda
            self.host = torch.zeros(1, n, dtype=torch.int32, pin_memory=pin)

    def load_mask(self):
        """Compute the next token's bitmask on the host and send it to the device. The previous
        copy is complete: the caller read the last step's token since."""
        self.matcher.fill(self.host[0])
        self.words.copy_(self.host, non_blocking=True)


class SequenceProcessing:
    """counts (1, vocab) float32: each token's occurrences in the output so far; seen (1,
    vocab) bool: the tokens of the context (everything before the output) or the output;
    values (1, 5) float32 (``row_values``); bias buffers (rows, ids, biases) per bias length."""

    def __init__(self, vocab: int, device):
        self.vocab, self.device = vocab, device
        self.counts = torch.zeros(1, vocab, dtype=torch.float32, device=device)
        self.seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)
        self.values = torch.zeros(1, 5, dtype=torch.float32, device=device)
        self._bias: dict[int, tuple] = {}
        self.params: SamplingParams | None = None

    def begin(self, params: SamplingParams, context: list[int]):
        """Set up a generation with ``params`` after the ``context`` token ids (ValueError for a
        logit_bias token outside the vocabulary). Runs eagerly, before the first step."""
        check_bias_ids(params, self.vocab)
        self.counts.zero_()
        self.seen.zero_()
        if context:
            ids = torch.tensor(context, dtype=torch.int64).to(self.device)
            self.seen[0].index_fill_(0, ids, True)
        self.values.copy_(row_values([params], "cpu"))
        n = len(params.logit_bias)
        if n:
            if n not in self._bias:
                self._bias[n] = (torch.zeros(n, dtype=torch.int64, device=self.device),
                                 torch.zeros(n, dtype=torch.int64, device=self.device),
                                 torch.zeros(n, dtype=torch.float32, device=self.device))
            ids, biases = zip(*params.logit_bias)
            self._bias[n][1].copy_(torch.tensor(ids, dtype=torch.int64))
            self._bias[n][2].copy_(torch.tensor(biases, dtype=torch.float32))
        self.params = params

    def process(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """The processed row (1, vocab) float32 of a logits row (1, vocab)."""
        counts, seen = (self.counts, self.seen) if params.penalized else (None, None)
        bias = self._bias[len(params.logit_bias)] if params.logit_bias else None
        return process_logits(logits, self.values, counts, seen, bias,
                              min_p=params.min_p > 0 and not params.greedy)

    def count(self, ids: torch.Tensor, params: SamplingParams):
        """Add the sampled token ids (1,) (on the device) to the counts, when a penalty reads
        them."""
        if params.penalized:
            count_tokens(self.counts, self.seen, ids)

    def saved(self):
        """A copy of the counts and the mask, for a warm-up run that must leave them as they
        were (``restore``)."""
        return self.counts.clone(), self.seen.clone()

    def restore(self, saved):
        self.counts.copy_(saved[0])
        self.seen.copy_(saved[1])
