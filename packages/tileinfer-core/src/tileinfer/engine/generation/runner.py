"""ModelRunner: forward steps of one sequence with static buffers and CUDA graphs.

Steps of up to ``MAX_GRAPH_TOKENS`` tokens (decode, speculative verification) run from static
metadata and activation buffers; on a CUDA device with a graph-safe backend each step size is
captured once in a CUDA graph (forward plus, optionally, device sampling) and replayed.

Prefill steps of up to ``MAX_PREFILL_BUCKET`` tokens run the same way, padded up to a power of
two (``prefill_bucket``): an eager prefill spends most of its time on the host (the host
launches every op of every layer while the GPU waits; benchmarks/RESULTS.md has the figures). The
padding tokens follow the real ones in the same sequence, so causal attention keeps them out of
every real row; they write keys and values at the positions after the real tokens, which the
next steps overwrite, and their pages go back to the pool after the step. A bucket's first
prefill runs the padded step eagerly and the second captures it, so a one-off prompt does not
pay for a capture, and both run the same kernels on the same rows (the same logits). Longer
prefills, and those whose padding would not fit, run eagerly at their true size.

Replaying needs the step's metadata in the static tensors: the host builds it (reserving pages)
and sends it with one copy from a pinned staging buffer. The token ids of a step can instead come
from the device: the sampling op writes the next token straight into the 1-token step's ids, so
pipelined decoding (``tileinfer.generate``) never waits for the host.

A runner stands on ``StaticSteps`` (``engine/runtime/static_steps.py``): the runtime's
(``runtime_of(model)``), shared with every other path of the model and kept as long as the
model, or, made standalone with a cache of its own, its own.

Speculative decoding adds two things: steps that return the logits of every row (a verify step
of the last token and k drafts: ``forward(..., all_logits=True)``, with static slots and graphs
of their own), and the output hidden states of chosen layers, which a DFlash drafter reads after
each step (``capture_hidden_states``).
"""

from __future__ import annotations

import contextlib

import torch

from ...backend.sampling import SamplingParams
from ..kv.step import prepare_step, static_metadata
from ..runtime.finite import check_finite, sample_with_sums
from ..runtime.graphs import use_graphs
from ..runtime.runtime import runtime_of
from ..runtime.static_steps import StaticStep, StaticSteps
from ...backend.grammar import mask_logits
from .sequence_processing import SequenceGrammar, SequenceProcessing, graph_key

MAX_GRAPH_TOKENS = 8
MAX_PREFILL_BUCKET = 512
MIN_PREFILL_BUCKET = 16


def prefill_bucket(n: int) -> int | None:
    """The static step size a prefill of n tokens is padded to (the next power of two, at least
    ``MIN_PREFILL_BUCKET``), or None past ``MAX_PREFILL_BUCKET``."""
    bucket = max(MIN_PREFILL_BUCKET, 1 << max(0, n - 1).bit_length())
    return bucket if bucket <= MAX_PREFILL_BUCKET else None


class ModelRunner:
    """Forward steps of ``model`` on a KV cache, with CUDA graphs for steps of 1..8 tokens.

    runtime: the model's ``ModelRuntime`` whose pool, static steps, sampling stream and step
    costs the runner shares (``runner_for`` gives the runtime's runner); without one, ``cache``
    is the runner's own and so are the rest. graphs: None picks them when the model is on CUDA
    and its backend is graph-safe. static_prefill: run prefills padded to their bucket on static
    steps (default: with graphs); without graphs they then run eagerly on those steps, which is
    what a graph replays (tests).
    """

    def __init__(self, model, cache=None, graphs: bool | None = None, extra_sizes=(),
                 static_prefill: bool | None = None, runtime=None):
        self.model = model
        self.graphs = graphs = use_graphs(model, graphs)
        self.static_prefill = graphs if static_prefill is None else static_prefill
        self.sizes = sorted(set(range(1, MAX_GRAPH_TOKENS + 1)) | set(extra_sizes))
        # Layers whose output hidden states every step writes, and who reads them after a step.
        self.hidden_layers: tuple[int, ...] = ()
        self.step_listener = None
        self.runtime = runtime
        # Logit bias, penalties and min_p of the current generation: made on first use.
        self.processing: SequenceProcessing | None = None
        # The grammar of the current generation (structured outputs): made on first use.
        self.grammar: SequenceGrammar | None = None
        if runtime is not None:
            self.steps = runtime.steps
            # The counter-based random stream of device sampling: seed and the next counter.
            self.seed, self.counter = runtime.seed, runtime.counter
            self.logit_sum = runtime.logit_sum
            # Row count -> the latest measured seconds of steps of that many rows: the
            # pipelined speculative loop's cost model, kept as long as the runtime.
            self.step_seconds = runtime.step_seconds
            self._cache = None
        else:
            if cache is None:
                raise ValueError("a ModelRunner needs a cache or a runtime")
            self.steps = StaticSteps(graphs)
            device = model.device
            self.seed = torch.zeros(1, dtype=torch.int64, device=device)
            self.counter = torch.zeros(1, dtype=torch.int64, device=device)
            self.logit_sum = torch.zeros(1, dtype=torch.float32, device=device)
            self.step_seconds: dict[int, list[float]] = {}
            self._cache = cache

    @property
    def cache(self):
        return self._cache if self.runtime is None else self.runtime.cache

    @property
    def lock(self):
        """Held while a generation runs on the runner (the runtime's: one at a time)."""
        return self.runtime.lock if self.runtime is not None else contextlib.nullcontext()

    # -- static steps ------------------------------------------------------------------------

    def _slot(self, n: int, all_logits: bool = False) -> StaticStep:
        """The static step of n tokens (logits of the last row, or of every row)."""
        key = ("seq", n, all_logits, self.hidden_layers)

        def make():
            meta = static_metadata(self.model, n, self.cache, n_logits=n if all_logits else 1)
            return StaticStep(meta, self.model.new_buffers(n, meta.num_logits,
                                                           hidden_layers=self.hidden_layers))
        return self.steps.get(key, make)

    def static_step(self, n: int, all_logits: bool = False) -> StaticStep | None:
        """The static step of n tokens if one was made (for inspection), else None."""
        return self.steps.find(("seq", n, all_logits, self.hidden_layers))

    def add_sizes(self, sizes):
        """Also run steps of these token counts from static steps (and graphs)."""
        self.sizes = sorted(set(self.sizes) | {int(n) for n in sizes})

    def capture_hidden_states(self, layers, listener):
        """Have every step write the output hidden states of ``layers`` (transformers'
        ``hidden_states[layer + 1]`` before any final norm, see ``StepBuffers.hidden_out``) and
        then call ``listener(seq, start, ids, hidden_out)``: the step ran ``ids`` at positions
        ``start..`` of ``seq``, and ``hidden_out`` maps each layer to its (len(ids), hidden) rows,
        valid until the next step of that size. A DFlash drafter reads them. Steps then use
        static steps made with these outputs (captured again when first used)."""
        self.hidden_layers = tuple(sorted({int(layer) for layer in layers}))
        self.step_listener = listener

    def _after_step(self, seq, start, ids, buffers):
        if self.step_listener is not None:  # a padded step's hidden states have more rows
            hidden = {layer: rows[:len(ids)] for layer, rows in buffers.hidden_out.items()}
            self.step_listener(seq, start, ids, hidden)

    def _prefill_bucket(self, seq, n: int) -> int | None:
        """The bucket a prefill of n tokens after seq's runs in, padded, or None (eager): when
        static prefills are on, the bucket fits the sequence's length limit and the padding's
        pages are free without evicting cached prefixes."""
        bucket = prefill_bucket(n) if self.static_prefill else None
        if bucket is None or len(seq) + bucket > min(self.model.max_len, self.cache.max_seq_len):
            return None
        # Pages for the real tokens and the padding, from pages that hold no cached prefix (too
        # few: the eager step runs, and raises OutOfPagesError where the real ones do not fit).
        cache = self.cache
        padded = max(0, cache.pages_for(len(seq) + bucket) - len(seq.pages))
        return bucket if padded <= cache.allocator.free - cache.allocator.cached else None

    def _run_static(self, slot: StaticStep, n: int, sampling: SamplingParams | None,
                    rows: bool = False, capture_at: int = 1):
        """Run the slot's step (replay or eager) and, if sampling, sample its last row (rows:
        every row's argmax into the slot's ``tokens`` instead). capture_at 2: run eagerly, on
        the same slot, the first time this step and sampling come (a prefill bucket)."""
        if rows and "tokens" not in slot.extra:
            slot.extra["tokens"] = torch.zeros(n, dtype=torch.int32, device=self.model.device)
            slot.extra["sums"] = torch.zeros(n, dtype=torch.float32, device=self.model.device)

        def step():
            slot.extra["logits"] = self.model.forward_step(slot.meta, slot.buffers, self.cache)
            self._sample_step(slot, sampling, rows, self.next_token)

        def warmup():  # samples into scratch so that the step's input ids stay as they are
            counter, scratch = self.counter.clone(), torch.empty_like(self.next_token)
            counts = self.processing.saved() if self.processing is not None else None
            slot.extra["logits"] = self.model.forward_step(slot.meta, slot.buffers, self.cache)
            self._sample_step(slot, sampling, rows, scratch)
            self.counter.copy_(counter)
            if counts is not None:
                self.processing.restore(counts)

        self.steps.run(slot, self._graph_key(sampling, rows), step, capture_at=capture_at,
                       warmup=warmup, eager=not self.graphs)

    def _sample_step(self, slot: StaticStep, sampling, rows: bool, out):
        if sampling is None:
            return
        logits = slot.extra["logits"]
        if rows:  # greedy: the argmax of every row (it does not advance the counter)
            sample_with_sums(self.model.ops, slot.extra["tokens"], slot.extra["sums"], logits,
                             0.0, 0, 1.0, self.seed, self.counter)
        else:
            self._sample_into(logits, sampling, out)

    @staticmethod
    def _graph_key(sampling: SamplingParams | None, rows: bool = False):
        if sampling is None:
            return None
        key = (sampling.temperature, sampling.top_k, sampling.top_p, *graph_key(sampling))
        return ("rows", *key) if rows else key

    def captured_graph(self, n: int, sampling: SamplingParams | None):
        """The CUDA graph of the n-token step (last row's logits) sampling with ``sampling``, once
        a step has captured it, else None: benchmarks replay it to time the GPU alone."""
        return self._slot(n).graphs.get(self._graph_key(sampling))

    def _sample_into(self, logits, sampling, out):
        # The sampled row's sum (of the model's logits, before any processing) is read with the
        # token: NaN or inf shows (engine/runtime/finite.py).
        raw = row = logits[-1:]
        if sampling.processes_logits:
            row = self.processing.process(row, sampling)
        if sampling.structured:  # the bitmask load_mask sent for this token
            row = mask_logits(row, self.grammar.words)
        t, top_k, top_p = sampling.temperature, sampling.top_k, sampling.top_p
        if row is raw:
            sample_with_sums(self.model.ops, out, self.logit_sum, row, t, top_k, top_p,
                             self.seed, self.counter)
        else:
            self.model.ops.sample_tokens(out, row, t, top_k, top_p, self.seed, self.counter, None)
            torch.sum(raw, dim=1, out=self.logit_sum)
        self.counter.add_(1)
        if sampling.processes_logits:
            self.processing.count(out, sampling)

    def begin_sampling(self, sampling: SamplingParams, context, stop_ids=()):
        """Set up logit bias, penalties, min_p and a grammar for a generation after the
        ``context`` token ids (everything the sequence holds before its output; the repetition
        penalty reads them): needed before the first step that samples with such parameters.
        stop_ids: the generation's stop tokens, which the grammar allows where it accepts.
        Nothing to do for parameters without them."""
        if sampling.structured:
            if self.grammar is None:
                self.grammar = SequenceGrammar(self.model.device)
            self.grammar.begin(sampling, stop_ids)
        if not sampling.processes_logits:
            return
        if self.processing is None:
            self.processing = SequenceProcessing(self.model.config.vocab_size, self.model.device)
        self.processing.begin(sampling, [int(i) for i in context])

    def _check_sampling(self, sampling):
        if sampling is not None and sampling.processes_logits and (
                self.processing is None or self.processing.params != sampling):
            raise ValueError("sampling with logit bias, penalties or min_p needs "
                             "begin_sampling(sampling, context) before the generation's steps")

    # -- public steps ------------------------------------------------------------------------

    def forward(self, seq, ids, sampling: SamplingParams | None = None,
                all_logits: bool = False, first_from: torch.Tensor | None = None,
                sample_rows: bool = False) -> torch.Tensor:
        """Run ``ids`` after the cached positions of ``seq`` and append them to it; returns the
        last row's logits (1, vocab) float32, or every row's (len(ids), vocab) with all_logits
        (a speculative verify step). Short steps' logits live in static buffers: read them
        before the next step of the same kind and length. With ``sampling``, also samples the
        next token from the last row on the device into ``next_token`` with the stream
        (seed, counter) and advances the counter. first_from: a (1,) int32 device tensor whose
        value replaces ids[0] on the device (copied in stream order, so an earlier step still
        running may write it; ids[0] is then a placeholder, appended to seq as it is).
        sample_rows (with all_logits, a step size in ``sizes`` and greedy ``sampling``): every
        row's argmax instead, into ``row_tokens(len(ids))``, inside the step's graph (a
        speculative verify step). On an error the sequence is left as it was."""
        if sample_rows and not (all_logits and sampling is not None and sampling.greedy
                                and len(ids) in self.sizes):
            raise ValueError("sample_rows needs all_logits, a static step size and greedy "
                             "sampling")
        self._check_sampling(sampling)
        ids = [int(i) for i in ids]
        n, start = len(ids), len(seq)
        max_len = self.model.max_len
        padded = False
        try:
            if n in self.sizes:
                slot = self._slot(n, all_logits)
                prepare_step(self.cache, [seq], [ids], all_logits=all_logits, max_len=max_len,
                             out=slot.meta)
                if first_from is not None:
                    slot.meta.ids[:1].copy_(first_from)
                self._run_static(slot, n, sampling, rows=sample_rows)
                logits, buffers = slot.extra["logits"], slot.buffers
            elif not all_logits and (bucket := self._prefill_bucket(seq, n)) is not None:
                slot = self._slot(bucket)
                prepare_step(self.cache, [seq], [ids + ids[-1:] * (bucket - n)], max_len=max_len,
                             out=slot.meta, padding=bucket - n)
                if first_from is not None:
                    slot.meta.ids[:1].copy_(first_from)
                self._run_static(slot, bucket, sampling, capture_at=2)
                logits, buffers, padded = slot.extra["logits"], slot.buffers, True
            else:
                meta = prepare_step(self.cache, [seq], [ids], all_logits=all_logits,
                                    max_len=max_len)
                if first_from is not None:
                    meta.ids[:1].copy_(first_from)
                buffers = self.model.new_buffers(n, meta.num_logits,
                                                 hidden_layers=self.hidden_layers)
                logits = self.model.forward_step(meta, buffers, self.cache)
                if sampling is not None:
                    self._sample_into(logits, sampling, self.next_token)
        except BaseException:
            self.cache.truncate(seq, start)  # gives back pages reserved for the step
            raise
        seq.tokens.extend(ids)
        if padded:
            self.cache.truncate(seq, len(seq))  # gives back the padding's pages
        self._after_step(seq, start, ids, buffers)
        return logits if all_logits else logits[-1:]

    def decode_from_device(self, seq, sampling: SamplingParams | None):
        """One pipelined decode step whose input is the token the previous step sampled on the
        device (already in ``next_token``); the host only sends positions and slots. Appends a
        placeholder id (-1) to ``seq``: the caller writes the real token once it knows it.
        Returns the step's logits (1, vocab), valid until the next 1-token step."""
        self._check_sampling(sampling)
        start = len(seq)
        slot = self._slot(1)
        try:
            prepare_step(self.cache, [seq], [[-1]], max_len=self.model.max_len, out=slot.meta,
                         keep_ids=True)
            self._run_static(slot, 1, sampling)
        except BaseException:
            self.cache.truncate(seq, start)
            raise
        seq.tokens.append(-1)
        self._after_step(seq, start, [-1], slot.buffers)
        return slot.extra["logits"]

    def row_tokens(self, n: int) -> torch.Tensor:
        """(n,) int32 on the device: every row's greedy token of the last n-token step run with
        ``sample_rows`` (a static buffer: read it before the next such step)."""
        return self._slot(n, all_logits=True).extra["tokens"]

    def row_sums(self, n: int) -> torch.Tensor:
        """(n,) float32 on the device: the sum of every row's logits of that step."""
        return self._slot(n, all_logits=True).extra["sums"]

    def check_finite(self, total: float, token_index: int):
        """NonFiniteLogitsError unless ``total``, the logits' sum of new token ``token_index``
        (``logit_sum`` or ``row_sums``), is finite."""
        check_finite(total, token_index, self.model.ops.name)

    @property
    def next_token(self) -> torch.Tensor:
        """(1,) int32 on the device: the token the last sampling step drew, which is also the
        input of the next 1-token step."""
        return self._slot(1).meta.ids


def runner_for(model, graphs: bool | None = None, num_pages: int | None = None,
               page_size: int = 16, kv_quantize: str | None = None,
               key_smoothing=None) -> ModelRunner:
    """The model's single-sequence runner on its runtime (made once per graphs setting), its KV
    pool holding at least ``num_pages`` pages of ``page_size`` in ``kv_quantize``'s precision
    (see ``ModelRuntime.kv_pool``)."""
    runtime = runtime_of(model)
    with runtime.lock:
        runtime.kv_pool(num_pages, page_size, kv_quantize, key_smoothing)
        graphs = use_graphs(model, graphs)
        return runtime.part(("runner", graphs),
                            lambda: ModelRunner(model, graphs=graphs, runtime=runtime))
