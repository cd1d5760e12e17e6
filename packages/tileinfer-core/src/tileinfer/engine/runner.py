"""ModelRunner: forward steps of one sequence with static buffers and CUDA graphs.

Steps of up to ``MAX_GRAPH_TOKENS`` tokens (decode, speculative verification) run from static
metadata and activation buffers; on a CUDA device with a graph-safe backend each step size is
captured once in a CUDA graph (forward plus, optionally, device sampling) and replayed.

Prefill steps of up to ``MAX_PREFILL_BUCKET`` tokens run the same way, padded up to a power of
two (``prefill_bucket``): an eager prefill spends most of its time on the host (about 10 ms for
SmolLM2's 30 layers, whose kernels take 1.6 ms of GPU; benchmarks/RESULTS.md, session 12). The
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

Speculative decoding adds two things: steps that return the logits of every row (a verify step
of the last token and k drafts: ``forward(..., all_logits=True)``, with static slots and graphs
of their own), and the output hidden states of chosen layers, which a DFlash drafter reads after
each step (``capture_hidden_states``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..backend.sampling import SamplingParams
from .graphs import capture_graph, use_graphs
from .step import prepare_step, static_metadata

MAX_GRAPH_TOKENS = 8
MAX_PREFILL_BUCKET = 512
MIN_PREFILL_BUCKET = 16


def prefill_bucket(n: int) -> int | None:
    """The static step size a prefill of n tokens is padded to (the next power of two, at least
    ``MIN_PREFILL_BUCKET``), or None past ``MAX_PREFILL_BUCKET``."""
    bucket = max(MIN_PREFILL_BUCKET, 1 << max(0, n - 1).bit_length())
    return bucket if bucket <= MAX_PREFILL_BUCKET else None


@dataclass
class _Slot:
    """Static state of one step size: metadata, buffers, its graphs and its last logits."""

    meta: object
    buffers: object
    logits: torch.Tensor | None = None  # output of the last run
    tokens: torch.Tensor | None = None  # (n,) int32: every row's greedy token (sample_rows)
    # One graph per sampling captured with it: None (no sampling) or (temperature, top_k, top_p).
    graphs: dict = field(default_factory=dict)


class ModelRunner:
    """Forward steps of ``model`` on ``cache``, with CUDA graphs for steps of 1..8 tokens.

    graphs: None picks them when the model is on CUDA and its backend is graph-safe.
    static_prefill: run prefills padded to their bucket on static slots (default: with graphs);
    without graphs they then run eagerly on those slots, which is what a graph replays (tests).
    """

    def __init__(self, model, cache, graphs: bool | None = None, extra_sizes=(),
                 static_prefill: bool | None = None):
        self.model, self.cache = model, cache
        self.graphs = graphs = use_graphs(model, graphs)
        self.static_prefill = graphs if static_prefill is None else static_prefill
        self._prefill_seen: set = set()  # (bucket, sampling key) run once, eagerly
        self.sizes = sorted(set(range(1, MAX_GRAPH_TOKENS + 1)) | set(extra_sizes))
        self._slots: dict[int, _Slot] = {}  # steps that return the last row's logits
        self._all_logits_slots: dict[int, _Slot] = {}  # steps that return every row's logits
        # Layers whose output hidden states every step writes, and who reads them after a step.
        self.hidden_layers: tuple[int, ...] = ()
        self.step_listener = None
        device = model.device
        # The counter-based random stream of device sampling: seed and the next counter.
        self.seed = torch.zeros(1, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self._pool = None  # the graphs share one memory pool
        # Row count -> the latest measured seconds of steps of that many rows, kept across
        # generations: the pipelined speculative loop's cost model (how much a verify step of
        # n rows costs against a 1-token step on this model, backend and device).
        self.step_seconds: dict[int, list[float]] = {}

    # -- static slots ------------------------------------------------------------------------

    def _slot(self, n: int, all_logits: bool = False) -> _Slot:
        slots = self._all_logits_slots if all_logits else self._slots
        slot = slots.get(n)
        if slot is None:
            meta = static_metadata(self.model, n, self.cache, n_logits=n if all_logits else 1)
            slot = _Slot(meta, self.model.new_buffers(n, meta.num_logits,
                                                      hidden_layers=self.hidden_layers))
            slots[n] = slot
        return slot

    def add_sizes(self, sizes):
        """Also run steps of these token counts from static slots (and graphs)."""
        self.sizes = sorted(set(self.sizes) | {int(n) for n in sizes})

    def capture_hidden_states(self, layers, listener):
        """Have every step write the output hidden states of ``layers`` (transformers'
        ``hidden_states[layer + 1]`` before any final norm, see ``StepBuffers.hidden_out``) and
        then call ``listener(seq, start, ids, hidden_out)``: the step ran ``ids`` at positions
        ``start..`` of ``seq``, and ``hidden_out`` maps each layer to its (len(ids), hidden) rows,
        valid until the next step of that size. A DFlash drafter reads them. Static slots made
        without these outputs are dropped (and their graphs captured again when next used)."""
        layers = tuple(sorted({int(layer) for layer in layers}))
        if layers != self.hidden_layers:
            self._slots.clear()
            self._all_logits_slots.clear()
            self.hidden_layers = layers
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

    def _run_static(self, slot: _Slot, n: int, sampling: SamplingParams | None,
                    rows: bool = False, capture_later: bool = False):
        """Run the slot's step (replay or eager) and, if sampling, sample its last row (rows:
        every row's argmax into slot.tokens instead). capture_later: run eagerly, on the same
        slot, the first time this step and sampling come (a prefill bucket's first use)."""
        if rows and slot.tokens is None:
            slot.tokens = torch.zeros(n, dtype=torch.int32, device=self.model.device)
        key = self._graph_key(sampling, rows)
        eager_once = (capture_later and key not in slot.graphs
                      and (n, key) not in self._prefill_seen)
        if eager_once:
            self._prefill_seen.add((n, key))
        if not self.graphs or eager_once:
            slot.logits = self.model.forward_step(slot.meta, slot.buffers, self.cache)
            self._sample_step(slot, sampling, rows, self.next_token)
            return
        graph = slot.graphs.get(key)
        if graph is None:
            graph = slot.graphs[key] = self._capture(slot, sampling, rows)
        graph.replay()

    def _sample_step(self, slot: _Slot, sampling, rows: bool, out):
        if sampling is None:
            return
        if rows:  # greedy: the argmax of every row (it does not advance the counter)
            self.model.ops.sample_tokens(slot.tokens, slot.logits, 0.0, 0, 1.0, self.seed,
                                         self.counter, None)
        else:
            self._sample_into(slot.logits, sampling, out)

    @staticmethod
    def _graph_key(sampling: SamplingParams | None, rows: bool = False):
        if sampling is None:
            return None
        key = (sampling.temperature, sampling.top_k, sampling.top_p)
        return ("rows", *key) if rows else key

    def captured_graph(self, n: int, sampling: SamplingParams | None):
        """The CUDA graph of the n-token step (last row's logits) sampling with ``sampling``, once
        a step has captured it, else None: benchmarks replay it to time the GPU alone."""
        slot = self._slots.get(n)
        return None if slot is None else slot.graphs.get(self._graph_key(sampling))

    def _sample_into(self, logits, sampling, out):
        self.model.ops.sample_tokens(out, logits[-1:], sampling.temperature, sampling.top_k,
                                     sampling.top_p, self.seed, self.counter, None)
        self.counter.add_(1)

    def _capture(self, slot: _Slot, sampling: SamplingParams | None,
                 rows: bool = False) -> torch.cuda.CUDAGraph:
        """Capture the slot's step (and sampling) in a graph. The step's metadata is already in
        the static tensors; capturing does not run it, so the first replay does."""
        counter = self.counter.clone()
        scratch = torch.empty_like(self.next_token)

        def warmup():  # samples into scratch so that the step's input ids stay as they are
            slot.logits = self.model.forward_step(slot.meta, slot.buffers, self.cache)
            self._sample_step(slot, sampling, rows, scratch)
            self.counter.copy_(counter)

        def step():
            slot.logits = self.model.forward_step(slot.meta, slot.buffers, self.cache)
            self._sample_step(slot, sampling, rows, self.next_token)

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return capture_graph(step, warmup=warmup, pool=self._pool)

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
                logits, buffers = slot.logits, slot.buffers
            elif not all_logits and (bucket := self._prefill_bucket(seq, n)) is not None:
                slot = self._slot(bucket)
                prepare_step(self.cache, [seq], [ids + ids[-1:] * (bucket - n)], max_len=max_len,
                             out=slot.meta, padding=bucket - n)
                if first_from is not None:
                    slot.meta.ids[:1].copy_(first_from)
                self._run_static(slot, bucket, sampling, capture_later=True)
                logits, buffers, padded = slot.logits, slot.buffers, True
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
        return slot.logits

    def row_tokens(self, n: int) -> torch.Tensor:
        """(n,) int32 on the device: every row's greedy token of the last n-token step run with
        ``sample_rows`` (a static buffer: read it before the next such step)."""
        return self._slot(n, all_logits=True).tokens

    @property
    def next_token(self) -> torch.Tensor:
        """(1,) int32 on the device: the token the last sampling step drew, which is also the
        input of the next 1-token step."""
        return self._slot(1).meta.ids
