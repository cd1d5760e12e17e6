"""ModelRuntime: what a loaded model keeps between calls, made once and shared by every path.

``runtime_of(model)`` gives the model's one runtime (made on first use, closed by
``model.close()``). It holds:

- ``cache``: the KV page pool (``PagedKVCache``). Every path takes its sequences from it: each
  ``generate`` call, a ``ChatSession``'s conversation, the serving engine's requests. Its size
  is what the largest user asked for: at least one sequence of the model's ``max_len``, more
  when an ``LLMEngine`` sizes it for serving. Asked for more pages while in use, it grows in
  place (live sequences keep their pages and contents); idle, and asked for another page size
  or precision, it is made anew (the old pages freed first). In use means a sequence holds
  pages or an ``LLMEngine`` is open: an engine keeps the pool it was made with, and one whose
  pool was made anew (by another page size or precision, or model.close()) refuses work.
- ``steps``: the ``StaticSteps`` of every runner (static step buffers and CUDA graphs, one graph
  pool), so a step shape is captured once per process, not once per call.
- ``seed`` and ``counter``: the device sampling stream that captured graphs read, and
  ``logit_sum`` they write (``finite.py``).
- ``step_seconds``: what steps of n rows measured (the speculative loop's cost model).
- ``scratch_page``: one page kept out of the pool's use, where padding rows of static steps
  write their keys and values.
- parts made on demand by the layers above (the single-sequence runner of each graphs
  setting), through ``part(name, make)``, so this module imports none of them.

``lock``: one step at a time on the model's static tensors. A generation holds it for its
whole length, a serving engine for each step; a second thread waits.

Its memory is bounded: the pool's pages, static buffers for a fixed set of step shapes plus at
most ``StaticSteps.max_kept`` evictable ones, and their graphs; ``memory()`` reports it.
"""

from __future__ import annotations

import gc
import threading
import weakref

import torch

from ...model.loader import check_fits
from ..kv.cache import PagedKVCache, check_pool_args, kv_bytes_per_token
from .graphs import use_graphs
from .static_steps import StaticSteps

_ATTACHMENT = "runtime"


class PoolBusyError(RuntimeError):
    """The KV pool must be made anew (another page size or precision, or a smaller size) while
    sequences hold pages of it."""


class ModelRuntime:
    """The runtime of one loaded model (see the module docstring)."""

    def __init__(self, model):
        self.model = model
        self.graphs = use_graphs(model, None)
        self.lock = threading.RLock()
        self.steps = StaticSteps(self.graphs)
        self.cache: PagedKVCache | None = None
        self.scratch_page: int | None = None
        device = model.device
        self.seed = torch.zeros(1, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        # The sum of the last sampled row's logits (a NaN check, engine/runtime/finite.py).
        self.logit_sum = torch.zeros(1, dtype=torch.float32, device=device)
        self.step_seconds: dict[int, list[float]] = {}
        self.engines = weakref.WeakSet()  # the open LLMEngines (open_engines)
        self._parts: dict = {}
        self.pool_builds = 0

    # -- the KV pool -------------------------------------------------------------------------

    def min_pages(self, page_size: int) -> int:
        """Pages of one sequence of max_len, plus the scratch page."""
        return -(-self.model.max_len // page_size) + 1

    def kv_pool(self, num_pages: int | None = None, page_size: int = 16,
                quantize: str | None = None, key_smoothing=None,
                exact: bool = False) -> PagedKVCache:
        """The pool, made or changed to hold at least ``num_pages`` pages (exactly, with
        ``exact``; default: one max_len sequence) of ``page_size`` positions in ``quantize``'s
        precision with ``key_smoothing``. Growing keeps every live sequence; anything else that
        changes the pool needs it idle (``PoolBusyError``). Bad arguments are refused before
        anything changes (``check_pool_args``)."""
        check_pool_args(self.model.config, num_pages, page_size, quantize, key_smoothing)
        with self.lock:
            want = max(num_pages or 0, 1 if exact else self.min_pages(page_size))
            cache = self.cache
            if cache is not None and self._same_kind(cache, page_size, quantize, key_smoothing):
                if cache.num_pages == want or (cache.num_pages > want and not exact):
                    return cache
                if cache.num_pages < want and (self.live_pages() or self.open_engines()):
                    self._grow(want)  # keeps the live sequences' pages and the engines' pool
                    return cache
            if cache is not None and self.live_pages():
                raise PoolBusyError(
                    f"the model's KV pool ({cache.num_pages} pages of {cache.page_size}, "
                    f"{cache.quantize or 'unquantized'}) holds {self.live_pages()} pages of live "
                    "sequences (a ChatSession, an LLMEngine); close them before asking for a "
                    "pool of another size, page size or precision")
            # (an idle engine still open keeps the old pool object, emptied, and refuses work)
            self._build(want, page_size, quantize, key_smoothing)
            return self.cache

    def open_engines(self) -> int:
        """LLMEngines made on the pool and not closed. Each keeps the pool it was made with, so
        while one is open a pool too small is grown in place rather than made anew."""
        if self.engines:
            gc.collect()  # an engine dropped without close() in a reference cycle goes now
        return len(self.engines)

    def reserve_room(self, pages: int):
        """Grow the pool (same page size and precision) so that ``pages`` of it are free."""
        with self.lock:
            cache = self.cache
            missing = pages - cache.free_pages
            if missing > 0:
                check_fits(missing * cache.nbytes // cache.num_pages, cache.device,
                           f"a KV pool of {missing * cache.page_size} more tokens")
                self._grow(cache.num_pages + missing)

    def live_pages(self) -> int:
        """Pages held by sequences (the scratch page is not counted)."""
        if self.cache is None:
            return 0
        return self.cache.allocator.held - (self.scratch_page is not None)

    @staticmethod
    def _same_kind(cache, page_size, quantize, key_smoothing) -> bool:
        if cache.page_size != page_size or cache.quantize != quantize:
            return False
        if key_smoothing is None or cache.k_smooth is None:
            return key_smoothing is None and cache.k_smooth is None
        factors = torch.stack([torch.as_tensor(f, dtype=torch.float32) for f in key_smoothing])
        return torch.equal(factors.to(cache.k_smooth.device), cache.k_smooth)

    def _build(self, num_pages, page_size, quantize, key_smoothing):
        model = self.model
        self.steps.clear()
        self._drop_pool()  # no sequence holds pages; an idle engine keeps the object
        page_bytes = kv_bytes_per_token(model.config, quantize, model.dtype) * page_size
        check_fits(num_pages * page_bytes, model.device,
                   f"a KV pool of {num_pages * page_size} tokens")
        self.cache = PagedKVCache(model.config, num_pages, page_size=page_size, dtype=model.dtype,
                                  device=model.device, quantize=quantize,
                                  key_smoothing=key_smoothing, max_seq_len=model.max_len)
        self.scratch_page = self.cache.allocator.allocate(1)[0]
        self.pool_builds += 1

    def _grow(self, num_pages: int):
        self.cache.grow(num_pages)
        self.steps.clear()  # graphs hold the old pools' addresses
        self.pool_builds += 1

    # -- parts -------------------------------------------------------------------------------

    def part(self, name, make):
        """The part called ``name``, made with ``make()`` the first time (a runner)."""
        part = self._parts.get(name)
        if part is None:
            part = self._parts[name] = make()
        return part

    # -- memory ------------------------------------------------------------------------------

    def memory(self) -> dict:
        """Bytes held: the KV pool, the static steps' buffers, and the number of CUDA graphs."""
        cache = self.cache
        return dict(kv_pool_bytes=0 if cache is None else cache.nbytes,
                    kv_pool_pages=0 if cache is None else cache.num_pages,
                    kv_pages_live=self.live_pages(),
                    static_step_bytes=self.steps.nbytes, static_steps=len(self.steps.steps()),
                    cuda_graphs=self.steps.num_graphs)

    def _drop_pool(self):
        """The pool's memory given back (an engine may still hold the emptied object), and the
        pool and scratch page forgotten."""
        if self.cache is not None:
            self.cache.free_memory()
        self.cache = self.scratch_page = None

    def close(self):
        """Drop the graphs, the static steps and the pool (their memory goes back to the
        caching allocator, and to the device with ``torch.cuda.empty_cache``), also while an
        open engine still holds the pool object (it refuses its next step: POOL_GONE)."""
        with self.lock:
            for part in self._parts.values():
                if hasattr(part, "close"):
                    part.close()
            self._parts.clear()
            self.steps.clear()
            self._drop_pool()
            if torch.device(self.model.device).type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()


_MAKING = threading.Lock()


def runtime_of(model) -> ModelRuntime:
    """The model's runtime, made on first use (``model.close()`` closes it)."""
    runtime = model.attachments.get(_ATTACHMENT)
    if runtime is None:
        with _MAKING:  # two threads' first calls make one runtime
            runtime = model.attachments.get(_ATTACHMENT)
            if runtime is None:
                runtime = model.attachments[_ATTACHMENT] = ModelRuntime(model)
    return runtime


def existing_runtime(model) -> ModelRuntime | None:
    """The model's runtime if one was made (and not closed), else None."""
    return model.attachments.get(_ATTACHMENT)
