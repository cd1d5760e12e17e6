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

import math
from dataclasses import dataclass, field

import torch

from .config import ModelConfig


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


@dataclass(frozen=True)
class LayerKV:
    """One layer's pools, in the argument form of the ``store_kv``/``attention`` ops."""

    k_cache: torch.Tensor  # (num_pages, page_size, kv_heads, head_dim)
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None  # (num_pages, page_size, kv_heads) float32, INT8 only
    v_scale: torch.Tensor | None
    k_smooth: torch.Tensor | None  # (kv_heads, head_dim) float32, INT8 with key smoothing only


class PageAllocator:
    """Free page ids; hands out the lowest free ids first (deterministic layouts in tests)."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: pop() gives the lowest id

    @property
    def free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPagesError(n, len(self._free))
        return [self._free.pop() for _ in range(n)]

    def release(self, pages):
        self._free.extend(pages)
        self._free.sort(reverse=True)


def kv_bytes_per_token(config: ModelConfig, quantize: str | None = None,
                       dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of cache one position takes over all layers (keys and values)."""
    vectors = 2 * config.num_layers * config.num_kv_heads
    if quantize == "int8":
        return vectors * (config.head_dim + 4)  # int8 values + one float32 scale
    if quantize is not None:
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    return vectors * config.head_dim * torch.empty((), dtype=dtype).element_size()


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
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages and page_size must be >= 1, got {num_pages}, {page_size}")
        if quantize not in (None, "int8"):
            raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
        if key_smoothing is not None and quantize != "int8":
            raise ValueError("key_smoothing applies to an INT8 cache only (quantize='int8')")
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
        if key_smoothing is not None:
            self.k_smooth = self._check_smoothing(key_smoothing)

    def _check_smoothing(self, key_smoothing) -> torch.Tensor:
        c = self.config
        factors = torch.stack([torch.as_tensor(f, dtype=torch.float32) for f in key_smoothing])
        expected = (c.num_layers, c.num_kv_heads, c.head_dim)
        if tuple(factors.shape) != expected:
            raise ValueError(f"key_smoothing must hold one (kv_heads, head_dim) = "
                             f"{expected[1:]} tensor per layer ({expected[0]}), got shape "
                             f"{tuple(factors.shape)}")
        if not bool((factors > 0).all()) or not bool(torch.isfinite(factors).all()):
            raise ValueError("key_smoothing factors must be finite and > 0")
        return factors.to(self.device).contiguous()

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


def key_smoothing_from_calibration(per_layer_keys, alpha: float = 0.5, floor: float = 1e-2):
    """Per-layer key smoothing factors (kv_heads, head_dim) from calibration keys.

    per_layer_keys: one (tokens, kv_heads, head_dim) tensor per layer, the keys as the cache
    stores them (after the k norm and RoPE). Procedure, per layer and kv head:

    1. ``amax[c] = max over tokens |key[c]|``, the range of channel c;
    2. clamped from below to ``floor * max_c amax[c]``, so that a channel nearly silent during
       calibration is not blown up by a tiny divisor should it carry more later;
    3. ``s[c] = amax[c] ** alpha``: with alpha = 0.5 (as SmoothQuant's default migration
       strength) a channel's range after division is sqrt(amax), which halves the dynamic range
       between channels (in log terms) that one per-vector scale has to cover;
    4. normalized so that the factors' mean is 1 (the smoothed keys keep their overall size).

    A head whose keys were all zero gets factors of 1.
    """
    factors = []
    for keys in per_layer_keys:
        amax = keys.float().abs().amax(dim=0)  # (kv_heads, head_dim)
        head_max = amax.amax(dim=-1, keepdim=True)
        amax = torch.where(head_max > 0, torch.maximum(amax, floor * head_max),
                           torch.ones_like(amax))
        s = amax ** alpha
        factors.append((s / s.mean(dim=-1, keepdim=True)).contiguous())
    return factors


def calibrate_key_smoothing(model, ids=None, alpha: float = 0.5, floor: float = 1e-2,
                            chunk: int = 512):
    """Key smoothing factors (``key_smoothing_from_calibration``) of model's keys on a
    calibration text.

    ids: the calibration token ids; by default the model's tokenizer encodes
    ``calibration_text()`` (a short public-domain English text). Ids longer than the model's
    max_len are cut into consecutive sequences of max_len tokens, each run from position 0; each
    sequence is prefilled ``chunk`` tokens at a time (the keys do not depend on the chunking), in
    a fresh cache in the model dtype.
    """
    from .model import forward  # model.py imports this module

    if ids is None:
        ids = default_calibration_ids(model)
    ids = list(ids.tolist() if torch.is_tensor(ids) else ids)
    if not ids:
        raise ValueError("calibrate_key_smoothing needs at least one calibration token")
    span = min(len(ids), model.max_len)
    cache = PagedKVCache(model.config, math.ceil(span / 16), page_size=16, dtype=model.dtype,
                         device=model.device)
    keys = [[] for _ in range(model.config.num_layers)]
    for begin in range(0, len(ids), span):
        seq = cache.new_sequence()
        part = ids[begin:begin + span]
        for start in range(0, len(part), chunk):
            forward(model, cache, seq, part[start:start + chunk])
        for layer in range(model.config.num_layers):
            keys[layer].append(cache.sequence_keys(layer, seq))
        cache.release(seq)
    return key_smoothing_from_calibration([torch.cat(k) for k in keys], alpha=alpha, floor=floor)


def calibration_text() -> str:
    """The default calibration text: public-domain English prose (the United States Declaration
    of Independence, 1776, its opening paragraphs)."""
    return _CALIBRATION_TEXT


def default_calibration_ids(model) -> list[int]:
    """``calibration_text()`` encoded by the tokenizer of model's folder."""
    from .tokenizer import load_tokenizer

    folder = getattr(model, "model_dir", None)
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise ValueError("the model has no tokenizer.json to encode the calibration text with; "
                         "pass the calibration token ids to calibrate_key_smoothing")
    return load_tokenizer(folder).encode(calibration_text(), add_special_tokens=False)


_CALIBRATION_TEXT = """\
When in the Course of human events, it becomes necessary for one people to dissolve the political \
bands which have connected them with another, and to assume among the powers of the earth, the \
separate and equal station to which the Laws of Nature and of Nature's God entitle them, a decent \
respect to the opinions of mankind requires that they should declare the causes which impel them \
to the separation.

We hold these truths to be self-evident, that all men are created equal, that they are endowed by \
their Creator with certain unalienable Rights, that among these are Life, Liberty and the pursuit \
of Happiness. That to secure these rights, Governments are instituted among Men, deriving their \
just powers from the consent of the governed, That whenever any Form of Government becomes \
destructive of these ends, it is the Right of the People to alter or to abolish it, and to \
institute new Government, laying its foundation on such principles and organizing its powers in \
such form, as to them shall seem most likely to effect their Safety and Happiness. Prudence, \
indeed, will dictate that Governments long established should not be changed for light and \
transient causes; and accordingly all experience hath shewn, that mankind are more disposed to \
suffer, while evils are sufferable, than to right themselves by abolishing the forms to which \
they are accustomed. But when a long train of abuses and usurpations, pursuing invariably the \
same Object evinces a design to reduce them under absolute Despotism, it is their right, it is \
their duty, to throw off such Government, and to provide new Guards for their future security.
"""
