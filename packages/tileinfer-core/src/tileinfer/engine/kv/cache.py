"""The paged KV cache: page pools per layer, a page allocator, and the sequences that own pages.

Layout (see ``hookspecs``): per layer a key pool and a value pool ``(num_pages, page_size,
kv_heads, head_dim)``; cache slot ``s`` is offset ``s % page_size`` of page ``s // page_size``. A
``Sequence`` lists its pages in position order (its block table): position p lives in page
``pages[p // page_size]`` at offset ``p % page_size``.

INT8 cache: the pools are int8 and every cached vector has one float32 scale (``k_scale``/
``v_scale`` ``(num_pages, page_size, kv_heads)``): ``vec ~= scale * q``. About half the bytes of
bf16 (head_dim + 4 bytes per vector instead of 2 * head_dim), and half what decode attention reads.
Keys can be smoothed: divided per channel by ``k_smooth`` (kv_heads, head_dim) before being
quantized and multiplied back when read, so that a few large channels (keys after RoPE have some)
do not set the scale of every vector and wash out the small channels.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ...backend.types import LayerKV
from ...model.config import ModelConfig
from ..arguments import as_integer


class OutOfPagesError(RuntimeError):
    """The cache has fewer free pages than a step needs. Raised before anything changes."""

    def __init__(self, needed: int, free: int):
        self.needed, self.free = needed, free
        super().__init__(f"the KV cache is out of pages: the step needs {needed} more pages, "
                         f"only {free} are free")


class ContextLengthError(ValueError):
    """A sequence would grow past the longest one the model or the cache can hold."""


@dataclass
class Sequence:
    """A sequence's place in the cache: its pages (block table, in position order) and the token
    ids whose keys and values are cached, in position order. Its pages may cover more positions
    than it has tokens (reserved ahead of a step)."""

    pages: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)


def common_prefix_len(a, b) -> int:
    """How many leading token ids two sequences of ids share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PageAllocator:
    """The pool's page ids: who holds each page, and which free pages still hold a cached prefix.

    Every page is in exactly one of three states:

    - held: its reference count (the sequences that list it) is >= 1;
    - cached: unreferenced, but published under a prefix key (``publish``): its keys and values
      stay in the pool so that a later sequence with the same prefix can take it back
      (``lookup`` + ``share``); kept in least-recently-released order and evicted, oldest
      first, only when no plain free page is left;
    - free: unreferenced and unpublished; handed out lowest id first (deterministic layouts).

    ``free`` counts what ``allocate`` can hand out: free plus cached pages. Without ``publish``
    this is a plain allocator: ``allocate`` takes one reference, ``release`` drops it.
    """

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages))  # a min-heap: the lowest free id first
        self._refs = [0] * num_pages
        self._cached: OrderedDict[int, None] = OrderedDict()  # oldest released first
        self._key_of: dict[int, object] = {}  # published pages (held or cached) -> key
        self._page_of: dict[object, int] = {}

    @property
    def free(self) -> int:
        return len(self._free) + len(self._cached)

    @property
    def cached(self) -> int:
        """Unreferenced pages kept for their prefix (part of ``free``)."""
        return len(self._cached)

    @property
    def held(self) -> int:
        return self.num_pages - self.free

    def grow(self, num_pages: int):
        """Add free pages up to ``num_pages`` (the pool's tensors grew)."""
        for page in range(self.num_pages, num_pages):
            heapq.heappush(self._free, page)
        self._refs.extend([0] * (num_pages - self.num_pages))
        self.num_pages = num_pages

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def allocate(self, n: int) -> list[int]:
        if n > self.free:
            raise OutOfPagesError(n, self.free)
        pages = []
        for _ in range(n):
            if self._free:
                page = heapq.heappop(self._free)
            else:  # evict the least recently released cached page
                page, _ = self._cached.popitem(last=False)
                del self._page_of[self._key_of.pop(page)]
            self._refs[page] = 1
            pages.append(page)
        return pages

    def share(self, pages):
        """One more reference to each of pages (held or cached, not free)."""
        for page in pages:
            if self._refs[page] == 0:
                if page not in self._cached:
                    raise ValueError(f"page {page} is free: only held or cached pages are shared")
                del self._cached[page]
            self._refs[page] += 1

    def release(self, pages):
        """Drop one reference to each of pages. Pages left unreferenced become cached if
        published, else free. Released last page first, so that of a sequence's cached pages
        its prefix's later pages are evicted before its first ones."""
        pages = list(pages)
        for page in pages:
            if self._refs[page] <= 0:
                raise ValueError(f"page {page} is released more often than it was taken")
        for page in reversed(pages):
            self._refs[page] -= 1
            if self._refs[page] == 0:
                if page in self._key_of:
                    self._cached[page] = None
                else:
                    heapq.heappush(self._free, page)

    def publish(self, page: int, key) -> bool:
        """Publish held page under key (its content is final). False, changing nothing, if the
        key already names another page or the page is already published."""
        if self._refs[page] < 1:
            raise ValueError(f"page {page} is not held: only held pages are published")
        if key in self._page_of or page in self._key_of:
            return False
        self._key_of[page], self._page_of[key] = key, page
        return True

    def lookup(self, key) -> int | None:
        """The page published under key (held or cached), or None."""
        return self._page_of.get(key)

    def key_of(self, page: int):
        return self._key_of.get(page)

    def check(self, held_by=None) -> dict:
        """Verify the bookkeeping; AssertionError on any inconsistency. held_by: optionally the
        page lists of every sequence holding pages, whose counts must equal the references.
        Returns the counts {"held", "cached", "free"}."""
        free, cached = set(self._free), set(self._cached)
        assert len(free) == len(self._free), "a page is twice in the free list"
        assert not free & cached, "a page is both free and cached"
        for page in range(self.num_pages):
            refs = self._refs[page]
            assert refs >= 0, f"page {page} has {refs} references"
            assert (refs == 0) == (page in free or page in cached), \
                f"page {page}: {refs} references but free={page in free} cached={page in cached}"
        assert all(p in self._key_of for p in cached), "a cached page has no key"
        assert not any(p in self._key_of for p in free), "a free page still has a key"
        assert all(self._page_of[k] == p for p, k in self._key_of.items()), "keys disagree"
        assert len(self._page_of) == len(self._key_of), "keys disagree"
        if held_by is not None:
            counts = [0] * self.num_pages
            for pages in held_by:
                for page in pages:
                    counts[page] += 1
            assert counts == self._refs, "references differ from the pages sequences hold"
        return {"held": self.held, "cached": len(cached), "free": len(free)}


def kv_bytes_per_token(config: ModelConfig, quantize: str | None = None,
                       dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of cache one position takes over all layers (keys and values)."""
    vectors = 2 * config.num_layers * config.num_kv_heads
    if quantize == "int8":
        return vectors * (config.head_dim + 4)  # int8 values + one float32 scale
    if quantize is not None:
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    return vectors * config.head_dim * torch.empty((), dtype=dtype).element_size()


def check_pool_args(config: ModelConfig, num_pages, page_size, quantize=None,
                    key_smoothing=None) -> torch.Tensor | None:
    """TypeError or ValueError naming the bad argument of a KV pool, raised before anything is
    allocated (num_pages None: a size to be chosen later). Returns the key smoothing factors as
    one (layers, kv_heads, head_dim) float32 tensor, or None."""
    for name, value in (("num_pages", num_pages), ("page_size", page_size)):
        if value is not None:
            as_integer(value, name)
    if (num_pages is not None and num_pages < 1) or page_size < 1:
        raise ValueError(f"num_pages and page_size must be >= 1, got {num_pages}, {page_size}")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    if key_smoothing is None:
        return None
    if quantize != "int8":
        raise ValueError("key_smoothing applies to an INT8 cache only (quantize='int8')")
    expected = (config.num_layers, config.num_kv_heads, config.head_dim)
    what = (f"key_smoothing must hold one (kv_heads, head_dim) = {expected[1:]} tensor of "
            f"factors per layer ({expected[0]}), as tileinfer.calibrate_key_smoothing gives")
    try:
        rows = [torch.as_tensor(f, dtype=torch.float32) for f in key_smoothing]
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{what}; got a {type(key_smoothing).__name__}") from None
    shapes = {tuple(r.shape) for r in rows}
    if len(rows) != expected[0] or shapes != {expected[1:]}:
        raise ValueError(f"{what}; got {len(rows)} of shape(s) {sorted(shapes)}")
    factors = torch.stack(rows)
    if not bool((factors > 0).all()) or not bool(torch.isfinite(factors).all()):
        raise ValueError("key_smoothing factors must be finite and > 0")
    return factors


class PagedKVCache:
    """Key/value page pools for every layer of a model, and the allocator of their pages.

    config: the model's ModelConfig. num_pages pages of page_size positions each. dtype: the
    activation dtype (the pools' dtype unless quantize="int8"). key_smoothing: with an INT8 cache,
    one (kv_heads, head_dim) tensor of positive factors per layer (see
    ``key_smoothing_from_calibration``), or None. max_seq_len: the longest a sequence may grow
    (default: every page); it sets the width of the block tables of a step, so keep it at the
    model's max_len for static (CUDA graph) step metadata.
    """

    def __init__(self, config: ModelConfig, num_pages: int, page_size: int = 16,
                 dtype: torch.dtype = torch.bfloat16, device=None, quantize: str | None = None,
                 key_smoothing=None, max_seq_len: int | None = None):
        factors = check_pool_args(config, num_pages, page_size, quantize, key_smoothing)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.config = config
        self.num_pages, self.page_size = num_pages, page_size
        self.dtype, self.device, self.quantize = dtype, torch.device(device), quantize
        self.max_seq_len = num_pages * page_size if max_seq_len is None else max_seq_len
        self.max_pages_per_seq = math.ceil(self.max_seq_len / page_size)
        self.allocator = PageAllocator(num_pages)

        shape = (config.num_layers, num_pages, page_size, config.num_kv_heads, config.head_dim)
        pool_dtype = torch.int8 if quantize == "int8" else dtype
        # One tensor per kind for all layers; layer l's pools are views [l]. Zero-filled so that
        # even a stray read of an unwritten slot is finite.
        self.k_pages = torch.zeros(shape, dtype=pool_dtype, device=self.device)
        self.v_pages = torch.zeros(shape, dtype=pool_dtype, device=self.device)
        self.k_scales = self.v_scales = self.k_smooth = None
        if quantize == "int8":
            self.k_scales = torch.zeros(shape[:-1], dtype=torch.float32, device=self.device)
            self.v_scales = torch.zeros(shape[:-1], dtype=torch.float32, device=self.device)
        if factors is not None:
            self.k_smooth = factors.to(self.device).contiguous()

    def grow(self, num_pages: int):
        """Hold ``num_pages`` pages: new pools with the old pages copied to the same ids, so
        every sequence keeps its pages and contents. Steps captured on the old pools must be
        captured again (their graphs hold the old addresses)."""
        if num_pages <= self.num_pages:
            return
        for name in ("k_pages", "v_pages", "k_scales", "v_scales"):
            old = getattr(self, name)
            if old is None:
                continue
            new = torch.zeros((old.shape[0], num_pages, *old.shape[2:]), dtype=old.dtype,
                              device=old.device)
            new[:, :self.num_pages].copy_(old)
            setattr(self, name, new)
            del old
        self.allocator.grow(num_pages)
        self.num_pages = num_pages

    def free_memory(self):
        """Give the pools' device memory back (a closed model's cache): an engine still holding
        this object then holds no memory; the cache must not be used after."""
        for name in ("k_pages", "v_pages", "k_scales", "v_scales"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).new_empty(0))

    def layer(self, i: int) -> LayerKV:
        pick = lambda t: None if t is None else t[i]  # noqa: E731
        return LayerKV(self.k_pages[i], self.v_pages[i], pick(self.k_scales),
                       pick(self.v_scales), pick(self.k_smooth))

    @property
    def free_pages(self) -> int:
        return self.allocator.free

    def pages_for(self, num_positions: int) -> int:
        return math.ceil(num_positions / self.page_size)

    def new_sequence(self) -> Sequence:
        return Sequence()

    def check_length(self, seq: Sequence, n: int, max_len: int | None = None):
        """ContextLengthError if seq cannot grow by n positions (within max_len too, if given)."""
        limit = self.max_seq_len if max_len is None else min(max_len, self.max_seq_len)
        if len(seq) + n > limit:
            source = ("the model's max_len" if max_len is not None and max_len <= self.max_seq_len
                      else "the cache's max_seq_len")
            raise ContextLengthError(
                f"{len(seq)} cached + {n} new tokens exceed the maximum sequence length {limit} "
                f"({source})")

    def reserve_all(self, requests):
        """Give each (sequence, n) of requests pages for n more positions, all or none.

        Raises OutOfPagesError(needed, free) before anything changes when the free pages do not
        cover every request together.
        """
        requests = list(requests)
        for seq, n in requests:
            self.check_length(seq, n)
        needs = [max(0, self.pages_for(len(seq) + n) - len(seq.pages)) for seq, n in requests]
        if sum(needs) > self.free_pages:
            raise OutOfPagesError(sum(needs), self.free_pages)
        for (seq, _), need in zip(requests, needs):
            seq.pages.extend(self.allocator.allocate(need))

    def reserve(self, seq: Sequence, n: int):
        """Pages for n more positions of seq; OutOfPagesError (nothing changed) if too few."""
        self.reserve_all([(seq, n)])

    def truncate(self, seq: Sequence, n: int):
        """Keep the first n cached positions of seq and return the pages it no longer needs."""
        if not 0 <= n <= len(seq):
            raise ValueError(f"cannot truncate a sequence of {len(seq)} tokens to {n}")
        del seq.tokens[n:]
        keep = self.pages_for(n)
        self.allocator.release(seq.pages[keep:])
        del seq.pages[keep:]

    def release(self, seq: Sequence):
        """Return every page of seq; it is empty afterwards."""
        self.truncate(seq, 0)

    def sequence_keys(self, layer: int, seq: Sequence) -> torch.Tensor:
        """The cached keys of seq in one layer (len(seq), kv_heads, head_dim), dequantized."""
        pages = torch.tensor(seq.pages, dtype=torch.long, device=self.device)
        keys = self.k_pages[layer][pages].flatten(0, 1)[:len(seq)].float()
        if self.k_scales is not None:
            keys = keys * self.k_scales[layer][pages].flatten(0, 1)[:len(seq), :, None]
        if self.k_smooth is not None:
            keys = keys * self.k_smooth[layer]
        return keys

    @property
    def nbytes(self) -> int:
        tensors = (self.k_pages, self.v_pages, self.k_scales, self.v_scales)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def new_cache(model, max_tokens: int | None = None, page_size: int = 16,
              quantize: str | None = None, key_smoothing=None,
              num_pages: int | None = None) -> PagedKVCache:
    """A cache in model's dtype and device, with pages for max_tokens positions (default the
    model's max_len) unless num_pages is given; sequences may grow to the model's max_len."""
    if num_pages is None:
        num_pages = math.ceil((max_tokens or model.max_len) / page_size)
    return PagedKVCache(model.config, num_pages, page_size=page_size, dtype=model.dtype,
                        device=model.device, quantize=quantize, key_smoothing=key_smoothing,
                        max_seq_len=model.max_len)


def check_cache(model, cache: PagedKVCache):
    """ValueError unless cache was made for model's config, dtype and device kind."""
    if cache.config != model.config:
        raise ValueError("the KV cache was made for another model configuration")
    if cache.dtype != model.dtype or cache.device.type != model.device.type:
        raise ValueError(f"the KV cache holds {cache.dtype} on {cache.device}; the model runs "
                         f"{model.dtype} on {model.device}")
