"""BatchRunner: one forward step over many sequences, with CUDA graphs for decode steps.

A step of decode rows only (one token per sequence) is padded up to a batch-size bucket (1, 2,
4, 8, ..., up to ``max_batch``) and, on a CUDA device with a graph-safe backend, replayed from a
CUDA graph captured once per bucket (``engine/graphs.py capture_graph``) on static metadata and
buffers, as ``ModelRunner`` does for one sequence. Padding rows are sequences of one token (id 0
at position 0) whose only page is a scratch page the runner keeps out of the pool, so they write
their keys and values there and never touch a real sequence; their logits are dropped.

Every other step (prefill chunks, mixed with decode rows or not) runs eagerly with buffers made
for it, or, with ``static_mixed``, padded to a static shape (``engine/mixed_steps.py``): padding
sequences on the scratch page take the padding tokens, and the shape's graph is captured the
second time a step needs it (the first runs the same padded step eagerly, so both give the same
logits). An eager step waits on the host (about 10 ms of Python and launches for a llama3-8b
step), a replay does not. At most ``MIXED_KEPT`` such shapes keep their buffers and graphs
(least recently used first out), and at most ``MIXED_BUILDS`` are built in a runner's life: a
workload whose shapes keep changing would otherwise build and capture at every step (a capture
costs more than the eager step), so past that a step whose shape is not kept runs eagerly at its
true size. Without graphs every step runs eagerly at its true size, no padding, unless
static_decode / static_mixed ask for the static steps (tests).

The rows of a step are separate sequences, so the linear ops are called with
``batch_invariant=False``: the backend may read each weight once for all rows (tensor-core
tiles) even at a few rows, summing in another order than a 1-row step.

``run`` returns one logits row per sequence (its last token's), float32. It reserves pages like
``prepare_step`` (all or nothing) but does not append the ids to the sequences: the caller does
once the step's results are accepted, and on an error truncates the sequences back.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from .cache import PagedKVCache, Sequence, check_cache
from .graphs import capture_graph, use_graphs
from .mixed_steps import MixedShape, mixed_shape, padding_lengths
from .step import StepMetadata, prepare_step

MIXED_KEPT = 6  # static mixed-step shapes kept (buffers and graph each)
MIXED_BUILDS = 32  # static mixed-step shapes built in a runner's life, at most


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= max_batch."""
    sizes = [1]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes


@dataclass
class _Bucket:
    meta: object
    buffers: object
    graph: object = None
    pad: list = field(default_factory=list)  # padding sequences (scratch page only)


class BatchRunner:
    """Forward steps of many sequences of ``model`` on ``cache``.

    graphs: None picks CUDA graphs when the model is on CUDA and its backend is graph-safe.
    max_batch: the largest decode step replayed from a graph (larger ones run eagerly).
    static_decode: run decode steps padded to the buckets on static metadata and buffers even
    without graphs (eagerly): what a graph replays, on any device (for tests). Default: graphs.
    static_mixed: run steps with prefill chunks padded to static shapes too (with graphs:
    replayed from CUDA graphs). Default: graphs.
    """

    def __init__(self, model, cache: PagedKVCache, graphs: bool | None = None,
                 max_batch: int = 64, static_decode: bool | None = None,
                 static_mixed: bool | None = None):
        check_cache(model, cache)
        self.model, self.cache = model, cache
        self.graphs = graphs = use_graphs(model, graphs)
        self.static_decode = graphs if static_decode is None else static_decode
        if graphs and not self.static_decode:
            raise ValueError("CUDA graphs replay static decode steps: static_decode=False "
                             "needs graphs=False")
        self.static_mixed = static_mixed = graphs if static_mixed is None else static_mixed
        self.buckets = bucket_sizes(max_batch) if self.static_decode else []
        self.mixed_buckets = bucket_sizes(max_batch) if static_mixed else []
        self._static: dict[int, _Bucket] = {}
        self._mixed: OrderedDict[MixedShape, _Bucket] = OrderedDict()
        self._mixed_seen: set[MixedShape] = set()  # shapes run once (eagerly, not captured)
        self._pool = None
        # The padding rows' page, held by the runner for its whole life.
        self.scratch_page = (cache.allocator.allocate(1)[0]
                             if self.static_decode or static_mixed else None)
        self.replays = self.eager_steps = self.tokens_run = self.mixed_steps = 0
        self.mixed_builds = 0
        self.last_static = False

    @property
    def reserved_pages(self) -> int:
        """Pages of the pool the runner keeps for itself."""
        return 0 if self.scratch_page is None else 1

    def close(self):
        """Give the scratch page back and drop the graphs."""
        if self.scratch_page is not None:
            self.cache.allocator.release([self.scratch_page])
            self.scratch_page = None
        self._static.clear()
        self._mixed.clear()
        self.buckets = self.mixed_buckets = []

    def bucket_for(self, batch: int) -> int | None:
        """The graph bucket a decode step of ``batch`` sequences runs in, or None (eager)."""
        for size in self.buckets:
            if size >= batch:
                return size
        return None

    def run(self, seqs: list[Sequence], token_lists: list[list[int]]) -> torch.Tensor:
        """Logits (len(seqs), vocab) float32 of each sequence's last new token. Valid until the
        next ``run``. ``last_static`` says whether the step ran as a static decode step."""
        tokens = sum(map(len, token_lists))
        self.tokens_run += tokens
        size = None
        if self.static_decode and all(len(ids) == 1 for ids in token_lists):
            size = self.bucket_for(len(seqs))
        self.last_static = size is not None
        if size is None and self.static_mixed:
            shape = mixed_shape(len(seqs), tokens, max(map(len, token_lists)), self.mixed_buckets,
                                min(self.model.max_len, self.cache.max_seq_len))
            if shape is not None and (shape in self._mixed or self.mixed_builds < MIXED_BUILDS):
                return self._run_mixed(shape, seqs, token_lists, tokens)
        if size is None:
            self.eager_steps += 1
            meta = prepare_step(self.cache, seqs, token_lists, max_len=self.model.max_len)
            buffers = self.model.new_buffers(meta.num_tokens, meta.num_logits)
            return self._forward(meta, buffers)
        bucket = self._static_step(size, seqs, token_lists)
        return self._replay(bucket, len(seqs))

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

    def _static_step(self, size: int, seqs, token_lists, keep_ids: bool = False) -> _Bucket:
        """Bucket ``size``'s metadata filled with the step of seqs, padding rows after them."""
        bucket = self._bucket(size)
        pad = size - len(seqs)
        prepare_step(self.cache, list(seqs) + bucket.pad[:pad], list(token_lists) + [[0]] * pad,
                     max_len=self.model.max_len, out=bucket.meta, keep_ids=keep_ids)
        return bucket

    def _replay(self, bucket: _Bucket, n: int, eager: bool = False) -> torch.Tensor:
        """Run the bucket's step from its graph (captured on the first replay), or eagerly on
        its static metadata and buffers without graphs or when asked (eager); logits of the
        first n rows."""
        if eager or not self.graphs:
            self._forward(bucket.meta, bucket.buffers)
        else:
            if bucket.graph is None:
                bucket.graph = self._capture(bucket)
            bucket.graph.replay()
            self.replays += 1
        return bucket.buffers.logits[:n]

    def _run_mixed(self, shape: MixedShape, seqs, token_lists, tokens: int) -> torch.Tensor:
        """A step with prefill chunks (``tokens`` in all), padded to ``shape``: eagerly on its
        static metadata and buffers the first time the shape comes, captured the second,
        replayed after."""
        bucket = self._mixed.get(shape)
        if bucket is None:
            bucket = self._mixed_bucket(shape)
        self._mixed.move_to_end(shape)
        pads = padding_lengths(shape, len(seqs), tokens)
        prepare_step(self.cache, list(seqs) + bucket.pad[:len(pads)],
                     list(token_lists) + [[0] * n for n in pads], max_len=self.model.max_len,
                     out=bucket.meta)
        self.mixed_steps += 1
        first = shape not in self._mixed_seen
        self._mixed_seen.add(shape)
        return self._replay(bucket, len(seqs), eager=first)

    def _mixed_bucket(self, shape: MixedShape) -> _Bucket:
        """New static metadata, buffers and padding sequences for ``shape`` (dropping the least
        recently used shape past ``MIXED_KEPT``). A padding sequence may run max_query tokens:
        its block table repeats the scratch page, so every position lands on it."""
        while len(self._mixed) >= MIXED_KEPT:
            self._mixed.popitem(last=False)
        meta = StepMetadata.for_cache(self.cache, shape.tokens, num_logits=shape.batch,
                                      batch=shape.batch, max_len=self.model.max_len,
                                      max_query_len=shape.max_query)
        pages = [self.scratch_page] * self.cache.pages_for(shape.max_query)
        pad = [Sequence(pages=list(pages)) for _ in range(shape.batch)]
        bucket = _Bucket(meta, self.model.new_buffers(shape.tokens, shape.batch), pad=pad)
        self._mixed[shape] = bucket
        self.mixed_builds += 1
        return bucket

    def _forward(self, meta, buffers) -> torch.Tensor:
        return self.model.forward_step(meta, buffers, self.cache, batch_invariant=False)

    def warmup(self, sizes=None):
        """Build (and with graphs capture) the static steps of these buckets (default all) now,
        with padding rows only, so that no request pays for it later."""
        for size in self.buckets if sizes is None else sizes:
            bucket = self._bucket(self.bucket_for(size))
            prepare_step(self.cache, bucket.pad, [[0]] * len(bucket.pad),
                         max_len=self.model.max_len, out=bucket.meta)
            if not self.graphs:
                self._forward(bucket.meta, bucket.buffers)
            elif bucket.graph is None:
                bucket.graph = self._capture(bucket)

    def _bucket(self, size: int) -> _Bucket:
        bucket = self._static.get(size)
        if bucket is None:
            meta = StepMetadata.for_cache(self.cache, size, num_logits=size, batch=size,
                                          max_len=self.model.max_len, max_query_len=1)
            pad = [Sequence(pages=[self.scratch_page]) for _ in range(size)]
            bucket = self._static[size] = _Bucket(meta, self.model.new_buffers(size, size),
                                                  pad=pad)
        return bucket

    def _capture(self, bucket: _Bucket):
        """Capture the bucket's step. Its metadata already holds the current step; the warm-up
        runs it once (writing the same keys and values the first replay writes again)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()

        return capture_graph(lambda: self._forward(bucket.meta, bucket.buffers), pool=self._pool)
