"""Static steps: the one mechanism behind every replayed step, single-sequence and batched.

A static step is a step shape (a token count, a batch size, logits of the last row or of every
row, ...) with metadata and activation buffers whose tensors never change identity: the host
writes each step's values into them (one packed copy) and runs the model on them. On a CUDA
device with a graph-safe backend the step is captured once per *variant* (what the step does
besides the forward: which sampling it runs) in a CUDA graph and replayed after; every graph
shares one memory pool.

When a variant is captured: on its first use (``capture_at=1``: decode steps, which a generation
runs many times) or its second (``capture_at=2``: prefills and mixed steps, which may come once;
the first runs eagerly on the same static tensors, so both runs compute the same rows the same
way). A static step's owner names it by a key; ``StaticSteps`` keeps the most recently used
``max_kept`` of the keys that ask to be evictable (the rest live as long as the steps do) and
builds at most ``max_builds`` evictable ones in its life, so that a workload of ever-changing
shapes cannot capture at every step (a capture costs more than an eager step).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .graphs import capture_graph

MAX_KEPT = 6  # evictable static steps kept (buffers and graphs each)
MAX_BUILDS = 32  # evictable static steps built in a runtime's life, at most


@dataclass(eq=False)
class StaticStep:
    """One step shape: static metadata and buffers, the graphs of its variants, the variants
    run once eagerly, and whatever its owner keeps beside them (``extra``: padding sequences,
    row tokens, the last logits)."""

    meta: object
    buffers: object
    graphs: dict = field(default_factory=dict)
    uses: dict = field(default_factory=dict)  # variant -> runs so far
    extra: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of its activation buffers (the attention workspace and scratch excluded)."""
        total = 0
        for value in vars(self.buffers).values():
            tensors = value.values() if isinstance(value, dict) else [value]
            total += sum(t.numel() * t.element_size() for t in tensors
                         if isinstance(t, torch.Tensor))
        return total


class StaticSteps:
    """The static steps of one model, keyed by their owners, and their one CUDA-graph pool.

    graphs: capture and replay (a CUDA device with a graph-safe backend); without graphs every
    run is eager on the static tensors. max_kept, max_builds: bounds of the evictable steps.
    """

    def __init__(self, graphs: bool, max_kept: int = MAX_KEPT, max_builds: int = MAX_BUILDS):
        self.graphs = graphs
        self.max_kept, self.max_builds = max_kept, max_builds
        self._fixed: dict = {}
        self._evictable: OrderedDict = OrderedDict()
        self.builds = 0  # evictable steps built so far
        self._pool = None
        self.captures = self.replays = self.eager_runs = 0

    def get(self, key, make: Callable[[], StaticStep], evictable: bool = False) -> StaticStep | None:
        """The static step of ``key``, made with ``make()`` on first use. An evictable step is
        None once ``max_builds`` have been built and it is not kept (the caller runs eagerly)."""
        step = self._fixed.get(key)
        if step is not None:
            return step
        if not evictable:
            step = self._fixed[key] = make()
            return step
        step = self._evictable.get(key)
        if step is None:
            if self.builds >= self.max_builds:
                return None
            while len(self._evictable) >= self.max_kept:
                self._evictable.popitem(last=False)
            step = self._evictable[key] = make()
            self.builds += 1
        self._evictable.move_to_end(key)
        return step

    def find(self, key) -> StaticStep | None:
        """The static step of ``key`` if it is kept, without making or touching it."""
        step = self._fixed.get(key)
        return step if step is not None else self._evictable.get(key)

    def can_build(self, key) -> bool:
        """Whether ``get(key, ..., evictable=True)`` would give a step."""
        return key in self._evictable or key in self._fixed or self.builds < self.max_builds

    def run(self, step: StaticStep, variant, body: Callable[[], None], capture_at: int = 1,
            warmup: Callable[[], None] | None = None, eager: bool = False):
        """Run ``body`` (the step on its static tensors: forward and whatever the variant adds)
        once: replayed from the variant's graph, captured now if this is its ``capture_at``-th
        use, else eagerly (always eagerly without graphs, or when ``eager``). ``warmup`` runs
        before a capture instead of ``body`` (default ``body``), on a side stream."""
        uses = step.uses[variant] = step.uses.get(variant, 0) + 1
        graph = step.graphs.get(variant)
        if graph is None and self.graphs and not eager and uses >= capture_at:
            if self._pool is None or self.num_graphs == 0:
                # A new pool once every graph of the old one is gone: PyTorch keeps a pool
                # whose graphs were all destroyed until its memory is freed, and asserts when a
                # capture joins it then.
                self._pool = torch.cuda.graph_pool_handle()
            graph = step.graphs[variant] = capture_graph(body, warmup=warmup, pool=self._pool)
            self.captures += 1
        if graph is None or eager:
            self.eager_runs += 1
            body()
        else:
            self.replays += 1
            graph.replay()

    def steps(self) -> list[StaticStep]:
        return [*self._fixed.values(), *self._evictable.values()]

    def items(self) -> list[tuple]:
        """(key, step) of every step kept, fixed ones first, evictable ones oldest first."""
        return [*self._fixed.items(), *self._evictable.items()]

    def drop(self, predicate: Callable[[object], bool]):
        """Forget the steps whose key satisfies ``predicate`` (their graphs go with them)."""
        for table in (self._fixed, self._evictable):
            for key in [k for k in table if predicate(k)]:
                del table[key]

    def clear(self):
        """Forget every step and graph (after the KV pool's tensors change: graphs hold their
        addresses)."""
        self._fixed.clear()
        self._evictable.clear()

    @property
    def nbytes(self) -> int:
        return sum(step.nbytes for step in self.steps())

    @property
    def num_graphs(self) -> int:
        return sum(len(step.graphs) for step in self.steps())
