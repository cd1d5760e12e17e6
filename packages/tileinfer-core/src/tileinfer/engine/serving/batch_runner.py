"""BatchRunner: one forward step over many sequences, with CUDA graphs for decode steps.

A step of decode rows only (one token per sequence) is padded up to a batch-size bucket (1, 2,
4, 8, ..., up to ``max_batch``) and, on a CUDA device with a graph-safe backend, replayed from a
CUDA graph captured once per bucket (``engine/runtime/graphs.py capture_graph``) on static metadata and
buffers, as ``ModelRunner`` does for one sequence. Padding rows are sequences of one token (id 0
at position 0) whose only page is a scratch page the runner keeps out of the pool, so they write
their keys and values there and never touch a real sequence; their logits are dropped.

Every other step (prefill chunks, mixed with decode rows or not) runs eagerly with buffers made
for it, or, with ``static_mixed``, padded to a static shape (``engine/serving/mixed_steps.py``): padding
sequences on the scratch page take the padding tokens, and the shape's graph is captured the
second time a step needs it (the first runs the same padded step eagerly, so both give the same
logits). An eager step waits on the host (Python and one launch per op), a replay does not.
Such shapes are the evictable steps of ``StaticSteps``: the few most recently used keep their
buffers and graphs, and only so many are built in the runtime's life, so that a workload whose
shapes keep changing does not build and capture at every step (a capture costs more than the
eager step); past that a step whose shape is not kept runs eagerly at its true size.

The static steps, the graph pool and the scratch page are the model runtime's
(``engine/runtime``), shared with the single-sequence runner, so a shape is captured once per
process however many engines come and go. Without graphs every step runs eagerly at its true size, no padding, unless
static_decode / static_mixed ask for the static steps (tests).

The rows of a step are separate sequences, so the linear ops are called with
``batch_invariant=False``: the backend may read each weight once for all rows (tensor-core
tiles) even at a few rows, summing in another order than a 1-row step.

``run`` returns one logits row per sequence (its last token's), float32; ``sample`` draws the
rows' tokens (each row with its own parameters and stream, ``sample_batch``) and starts their
copy to the host. It reserves pages like
``prepare_step`` (all or nothing) but does not append the ids to the sequences: the caller does
once the step's results are accepted, and on an error truncates the sequences back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kv.cache import Sequence
from ..kv.step import StepMetadata, prepare_step
from ..runtime.graphs import use_graphs
from ..runtime.static_steps import StaticStep
from .batch_grammar import mask_rows
from .batch_processing import count_rows, hold_stops, process_rows
from .batch_sampling import sample_batch
from .mixed_steps import MixedShape, mixed_shape, padding_lengths


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= max_batch."""
    sizes = [1]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes


@dataclass(eq=False)
class SampledIds:
    """A step's sampled token ids: on the device (``ids``), and their copy to the host
    (``host``, complete once ``ready`` is: an event on CUDA, None on the CPU), with each row's
    logits' sum (``host_sums``: NaN or inf shows there, engine/runtime/finite.py)."""

    ids: torch.Tensor
    host: torch.Tensor
    host_sums: torch.Tensor
    ready: object = None

    def tolist(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()

    def sums(self) -> list[float]:
        """Each row's logits' sum (after ``tolist``)."""
        return self.host_sums.tolist()


class BatchRunner:
    """Forward steps of many sequences of ``model`` on its runtime's KV pool.

    runtime: the model's ``ModelRuntime`` (pool, static steps, scratch page).
    graphs: None picks CUDA graphs when the model is on CUDA and its backend is graph-safe.
    max_batch: the largest decode step replayed from a graph (larger ones run eagerly).
    static_decode: run decode steps padded to the buckets on static metadata and buffers even
    without graphs (eagerly): what a graph replays, on any device (for tests). Default: graphs.
    static_mixed: run steps with prefill chunks padded to static shapes too (with graphs:
    replayed from CUDA graphs). Default: graphs.
    """

    def __init__(self, model, runtime, graphs: bool | None = None, max_batch: int = 64,
                 static_decode: bool | None = None, static_mixed: bool | None = None):
        self.model, self.runtime = model, runtime
        self.graphs = graphs = use_graphs(model, graphs)
        self.static_decode = graphs if static_decode is None else static_decode
        if graphs and not self.static_decode:
            raise ValueError("CUDA graphs replay static decode steps: static_decode=False "
                             "needs graphs=False")
        self.static_mixed = graphs if static_mixed is None else static_mixed
        self.max_batch = max_batch
        self.buckets = bucket_sizes(max_batch) if self.static_decode else []
        self.mixed_buckets = bucket_sizes(max_batch) if self.static_mixed else []
        self.steps = runtime.steps
        self.replays = self.eager_steps = self.tokens_run = self.mixed_steps = 0
        self.last_static = False
        self._last_hidden = None  # the last step's logit_normed buffer, and its rows' order

    @property
    def cache(self):
        return self.runtime.cache

    @property
    def scratch_page(self) -> int:
        """The runtime's page for padding rows' keys and values."""
        return self.runtime.scratch_page

    def static_decode_sizes(self) -> list[int]:
        """The batch sizes of the decode steps built so far (for inspection)."""
        return sorted(k[1] for k, _ in self.steps.items() if k[0] == "decode")

    def mixed_steps_kept(self) -> dict:
        """MixedShape -> its static step, for the mixed shapes kept now (for inspection)."""
        return {k[1]: step for k, step in self.steps.items() if k[0] == "mixed"}

    def bucket_for(self, batch: int) -> int | None:
        """The graph bucket a decode step of ``batch`` sequences runs in, or None (eager)."""
        for size in self.buckets:
            if size >= batch:
                return size
        return None

    def run(self, seqs: list[Sequence], token_lists: list[list[int]],
            tokens: int | None = None) -> torch.Tensor:
        """Logits (len(seqs), vocab) float32 of each sequence's last new token. Valid until the
        next ``run``. ``last_static`` says whether the step ran as a static decode step.
        tokens: the step's token count, if the caller has it."""
        tokens = sum(map(len, token_lists)) if tokens is None else tokens
        self.tokens_run += tokens
        size = None
        if self.static_decode and tokens == len(seqs):
            size = self.bucket_for(len(seqs))
        self.last_static = size is not None
        if size is None and self.static_mixed:
            shape = mixed_shape(len(seqs), tokens, max(map(len, token_lists)), self.mixed_buckets,
                                min(self.model.max_len, self.cache.max_seq_len))
            if shape is not None and self.steps.can_build(("mixed", shape)):
                return self._run_mixed(shape, seqs, token_lists, tokens)
        if size is None:
            self.eager_steps += 1
            meta = prepare_step(self.cache, seqs, token_lists, max_len=self.model.max_len)
            buffers = self.model.new_buffers(meta.num_tokens, meta.num_logits)
            return self._forward(meta, buffers)
        bucket = self._static_step(size, seqs, token_lists)
        return self._replay(bucket, len(seqs))

    def run_rows(self, seqs: list[Sequence], token_lists: list[list[int]], every_row: list[bool],
                 tokens: int | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """An eager step in which the sequences b with every_row[b] get the logits of every row
        of their chunk, the others of their last row only: (each sequence's last row's logits
        (len(seqs), vocab), {b: its rows' logits (len(token_lists[b]), vocab)} for the marked
        ones), float32. Runs eagerly (no static shape has the extra rows)."""
        tokens = sum(map(len, token_lists)) if tokens is None else tokens
        self.tokens_run += tokens
        self.eager_steps += 1
        self.last_static = False
        meta = prepare_step(self.cache, seqs, token_lists, all_logits=every_row,
                            max_len=self.model.max_len)
        buffers = self.model.new_buffers(meta.num_tokens, meta.num_logits)
        logits = self._forward(meta, buffers)
        last, rows, end = [], {}, 0
        for b, (ids, every) in enumerate(zip(token_lists, every_row)):
            n = len(ids) if every else 1
            if every:
                rows[b] = logits[end:end + n]
            end += n
            last.append(end - 1)
        self._last_hidden = buffers.logit_normed, last
        return logits[last], rows

    def keep_hidden_states(self, reqs, rows: list[int]):
        """For each request reqs[i] (i in rows) that asks for its hidden state: a copy of the
        last step's, in ``req.hidden`` (copied now: the next step may reuse the buffers)."""
        wanted = [i for i in rows if reqs[i].hidden_state]
        if wanted:
            for i, row in zip(wanted, self.hidden_rows(wanted)):
                reqs[i].hidden = row

    def hidden_rows(self, rows: list[int]) -> torch.Tensor:
        """A copy (len(rows), hidden_size) of the last step's final hidden states (after the
        final norm: the lm_head's input) of its sequences ``rows`` (their last tokens')."""
        normed, index = self._last_hidden
        picked = rows if index is None else [index[r] for r in rows]
        return normed[torch.tensor(picked, dtype=torch.int64).to(normed.device)]

    def run_device_ids(self, seqs: list[Sequence], ids: torch.Tensor) -> torch.Tensor:
        """A static decode step whose token ids are on the device already: ids (len(seqs),)
        int32, e.g. the previous step's samples, not read back yet (the engine's pipelining).
        Pages are reserved as ``run`` does; padding rows keep the ids their slots last held
        (some earlier step's tokens: any valid id will do). Logits as ``run``'s."""
        size = self.bucket_for(len(seqs)) if self.static_decode else None
        if size is None:
            raise ValueError(f"no static decode step holds {len(seqs)} sequences")
        self.tokens_run += len(seqs)
        bucket = self._static_step(size, seqs, [[0]] * len(seqs), keep_ids=True)
        bucket.meta.ids[:len(seqs)].copy_(ids, non_blocking=True)
        self.last_static = True
        return self._replay(bucket, len(seqs))

    def sample(self, logits: torch.Tensor, params, seeds, counters,
               raw: torch.Tensor | None = None) -> SampledIds:
        """Each row's token (``sample_batch``: row r with params[r] from the stream
        (seeds[r], counters[r])) and the sum of its ``raw`` logits (default ``logits``: the
        model's, before any processing, whose -inf are no fault), their copy to the host
        started."""
        if raw is None or raw is logits:  # the sums come from the sampling call
            sums = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
            ids = sample_batch(self.model.ops, logits, params, seeds, counters, sums=sums)
        else:
            ids = sample_batch(self.model.ops, logits, params, seeds, counters)
            sums = raw.sum(dim=1)
        if not ids.is_cuda:
            return SampledIds(ids, ids, sums)
        host = ids.to("cpu", non_blocking=True)  # pinned, filled in stream order
        host_sums = sums.to("cpu", non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return SampledIds(ids, host, host_sums, ready)

    def sample_requests(self, logits: torch.Tensor, reqs, ahead: int = 0) -> SampledIds:
        """``sample`` for rows of requests: row j is reqs[j]'s token len(output) + ahead, from
        its parameters (logit bias, penalties and min_p applied first, ``batch_processing``)
        and its stream (seed, that index); the stop ids held back before a request's
        min_new_tokens, then a grammar's mask (``batch_grammar``)."""
        counters = [len(req.output) + ahead for req in reqs]
        rows = hold_stops(process_rows(logits, reqs, counters), reqs, counters)
        rows = mask_rows(rows, reqs, counters)
        sampled = self.sample(rows, [req.sampling for req in reqs], [req.seed for req in reqs],
                              counters, raw=logits)
        count_rows(sampled.ids, reqs, counters)
        return sampled

    def _static_step(self, size: int, seqs, token_lists, keep_ids: bool = False) -> StaticStep:
        """Bucket ``size``'s metadata filled with the step of seqs, padding rows after them."""
        bucket = self._bucket(size)
        pad = size - len(seqs)
        prepare_step(self.cache, list(seqs) + bucket.extra["pad"][:pad],
                     list(token_lists) + [[0]] * pad, max_len=self.model.max_len,
                     out=bucket.meta, keep_ids=keep_ids)
        return bucket

    def _replay(self, bucket: StaticStep, n: int, capture_at: int = 1) -> torch.Tensor:
        """Run the bucket's step from its graph (captured on its ``capture_at``-th use), or
        eagerly on its static metadata and buffers without graphs; logits of the first n rows."""
        before = self.steps.replays
        self._last_hidden = bucket.buffers.logit_normed, None
        self.steps.run(bucket, None, lambda: self._forward(bucket.meta, bucket.buffers),
                       capture_at=capture_at, eager=not self.graphs)
        self.replays += self.steps.replays - before
        return bucket.buffers.logits[:n]

    def _run_mixed(self, shape: MixedShape, seqs, token_lists, tokens: int) -> torch.Tensor:
        """A step with prefill chunks (``tokens`` in all), padded to ``shape``: eagerly on its
        static metadata and buffers the first time the shape comes, captured the second,
        replayed after."""
        bucket = self.steps.get(("mixed", shape), lambda: self._mixed_bucket(shape),
                                evictable=True)
        pads = padding_lengths(shape, len(seqs), tokens)
        prepare_step(self.cache, list(seqs) + bucket.extra["pad"][:len(pads)],
                     list(token_lists) + [[0] * n for n in pads], max_len=self.model.max_len,
                     out=bucket.meta)
        self.mixed_steps += 1
        return self._replay(bucket, len(seqs), capture_at=2)

    def _mixed_bucket(self, shape: MixedShape) -> StaticStep:
        """New static metadata, buffers and padding sequences for ``shape``. A padding sequence
        may run max_query tokens: its block table repeats the scratch page, so every position
        lands on it."""
        meta = StepMetadata.for_cache(self.cache, shape.tokens, num_logits=shape.batch,
                                      batch=shape.batch, max_len=self.model.max_len,
                                      max_query_len=shape.max_query)
        pages = [self.scratch_page] * self.cache.pages_for(shape.max_query)
        pad = [Sequence(pages=list(pages)) for _ in range(shape.batch)]
        return StaticStep(meta, self.model.new_buffers(shape.tokens, shape.batch),
                          extra={"pad": pad})

    def _forward(self, meta, buffers) -> torch.Tensor:
        self._last_hidden = buffers.logit_normed, None
        return self.model.forward_step(meta, buffers, self.cache, batch_invariant=False)

    def warmup(self, sizes=None):
        """Build (and with graphs capture) the static steps of these buckets (default all) now,
        with padding rows only, so that no request pays for it later."""
        for size in self.buckets if sizes is None else sizes:
            bucket = self._bucket(self.bucket_for(size))
            prepare_step(self.cache, bucket.extra["pad"], [[0]] * len(bucket.extra["pad"]),
                         max_len=self.model.max_len, out=bucket.meta)
            if not self.graphs or None not in bucket.graphs:
                self._replay(bucket, 0)

    def _bucket(self, size: int) -> StaticStep:
        def make():
            meta = StepMetadata.for_cache(self.cache, size, num_logits=size, batch=size,
                                          max_len=self.model.max_len, max_query_len=1)
            pad = [Sequence(pages=[self.scratch_page]) for _ in range(size)]
            return StaticStep(meta, self.model.new_buffers(size, size), extra={"pad": pad})
        return self.steps.get(("decode", size), make)
