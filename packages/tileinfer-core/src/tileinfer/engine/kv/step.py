"""The metadata of one forward step: which tokens run, where they sit, where their k/v go.

A step holds one or more sequences, their new tokens flattened along the token axis (sequence b
owns rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``). One sequence is batch 1; several make a
batched step (a server, speculative verification of several sequences).

For CUDA graphs: a graph captured once replays with the same tensors, so the runner allocates one
static ``StepMetadata`` per captured shape (``StepMetadata.allocate``) and, before each replay,
fills it from a freshly prepared one with ``meta.copy_into(static)`` (or passes ``out=static`` to
``prepare_step``). On a GPU the static tensors are views of one int32 buffer (``PackedUpload``),
so filling them is one host-to-device copy from pinned memory rather than one small pageable
copy per tensor (each costs the GPU a few microseconds between two decode steps).
``max_context_len`` is an upper bound (the longest sequence the cache and the model allow), not
the step's true context length, so it is the same for every step and a graph captured with it
stays valid.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, fields

import torch

from ...backend.types import AttentionStep
from .cache import PagedKVCache, Sequence
from .packed_upload import PackedUpload


@dataclass
class StepMetadata:
    """Device tensors of one step, plus two host-side upper bounds for launch grids.

    ids (n,) int32: the new tokens. positions (n,) int32: their positions. slots (n,) int64: their
    cache slots (``page * page_size + offset``). cu_seqlens_q (batch + 1,) int32: row offsets of
    the sequences. context_lens (batch,) int32: cached positions of each sequence including this
    step's. block_table (batch, max_pages) int32: each sequence's pages, padded with 0 (padding is
    never read). logit_rows (m,) int64: the rows whose logits the step computes.
    max_query_len: the longest query of the step (host int); max_context_len: an upper bound of
    context_lens (host int, constant per cache). ``attention`` is the attention ops' view of it.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    cu_seqlens_q: torch.Tensor
    context_lens: torch.Tensor
    block_table: torch.Tensor
    logit_rows: torch.Tensor
    max_query_len: int
    max_context_len: int
    upload: PackedUpload | None = None  # static metadata on a GPU: its tensors' one buffer

    @property
    def num_tokens(self) -> int:
        return self.ids.shape[0]

    @property
    def num_logits(self) -> int:
        return self.logit_rows.shape[0]

    @property
    def batch(self) -> int:
        return self.context_lens.shape[0]

    @property
    def attention(self) -> AttentionStep:
        return AttentionStep(self.positions, self.slots, self.cu_seqlens_q, self.context_lens,
                             self.block_table, self.max_query_len, self.max_context_len)

    @classmethod
    def allocate(cls, num_tokens: int, num_logits: int, batch: int, max_pages: int,
                 max_query_len: int, max_context_len: int, device) -> "StepMetadata":
        """Zero-filled static metadata for steps of this shape (to capture a graph with)."""
        shapes = {"slots": ((num_tokens,), torch.int64), "logit_rows": ((num_logits,), torch.int64),
                  "positions": ((num_tokens,), torch.int32),
                  "cu_seqlens_q": ((batch + 1,), torch.int32),
                  "context_lens": ((batch,), torch.int32),
                  "block_table": ((batch, max_pages), torch.int32),
                  "ids": ((num_tokens,), torch.int32)}
        upload = None
        if torch.device(device).type == "cuda":
            upload = PackedUpload(shapes, device)
            tensors = upload.views
        else:
            tensors = {name: torch.zeros(shape, dtype=dtype, device=device)
                       for name, (shape, dtype) in shapes.items()}
        return cls(**tensors, max_query_len=max_query_len, max_context_len=max_context_len,
                   upload=upload)

    @classmethod
    def for_cache(cls, cache: PagedKVCache, num_tokens: int, num_logits: int = 1, batch: int = 1,
                  max_len: int | None = None, max_query_len: int | None = None) -> "StepMetadata":
        """Static metadata for steps of ``batch`` sequences, num_tokens tokens and num_logits
        logit rows on cache, for a model of max_len positions: block tables and
        max_context_len as ``prepare_step`` builds them."""
        return cls.allocate(num_tokens, num_logits, batch, max_pages_per_step(cache, max_len),
                            num_tokens if max_query_len is None else max_query_len,
                            context_bound(cache, max_len), cache.device)

    def to(self, device) -> "StepMetadata":
        """The same metadata with its tensors on device."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if torch.is_tensor(value):
                moved[name] = value.to(device, non_blocking=True)
        return StepMetadata(**moved)

    def copy_into(self, static: "StepMetadata", keep_ids: bool = False) -> "StepMetadata":
        """Write this step's tensors into static's (same shapes) without reallocating them.

        The host bounds must fit the ones static was captured with: max_query_len at most
        static's, max_context_len at most static's. keep_ids: leave static.ids as they are (the
        previous step sampled them on the device).
        """
        if (self.max_query_len > static.max_query_len
                or self.max_context_len > static.max_context_len):
            raise ValueError(f"step bounds (query {self.max_query_len}, context "
                             f"{self.max_context_len}) exceed the static ones (query "
                             f"{static.max_query_len}, context {static.max_context_len})")
        pairs = [(f.name, getattr(self, f.name), getattr(static, f.name)) for f in fields(self)
                 if torch.is_tensor(getattr(self, f.name)) and not (f.name == "ids" and keep_ids)]
        for name, mine, theirs in pairs:
            if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
                raise ValueError(f"step metadata {name}: {tuple(mine.shape)} {mine.dtype} "
                                 f"does not fit the static {tuple(theirs.shape)} {theirs.dtype}")
        if static.upload is not None and not any(mine.is_cuda for _, mine, _ in pairs):
            static.upload.send({name: mine for name, mine, _ in pairs}, keep_ids=keep_ids)
            return static
        for _, mine, theirs in pairs:
            theirs.copy_(mine, non_blocking=True)
        return static


def _check_fits(static: StepMetadata, token_lists, all_logits: bool):
    """The errors ``copy_into`` would raise, raised before any page is reserved."""
    batch, num_tokens = len(token_lists), sum(map(len, token_lists))
    num_logits = sum(len(ids) if every else 1
                     for ids, every in zip(token_lists, _per_sequence(all_logits, batch)))
    if (static.batch, static.num_tokens, static.num_logits) != (batch, num_tokens, num_logits):
        raise ValueError(f"the static step metadata holds {static.batch} sequences, "
                         f"{static.num_tokens} tokens and {static.num_logits} logit rows; this "
                         f"step has {batch}, {num_tokens} and {num_logits}")
    if max(map(len, token_lists)) > static.max_query_len:
        raise ValueError(f"a query of {max(map(len, token_lists))} tokens exceeds the static "
                         f"max_query_len {static.max_query_len}")


def _per_sequence(all_logits, batch: int) -> list[bool]:
    return list(all_logits) if isinstance(all_logits, (list, tuple)) else [all_logits] * batch


def as_token_ids(ids) -> list[int]:
    return [int(i) for i in (ids.tolist() if torch.is_tensor(ids) else ids)]


def context_bound(cache: PagedKVCache, max_len: int | None = None) -> int:
    """The longest context of any step on cache for a model of max_len positions."""
    return cache.max_seq_len if max_len is None else min(max_len, cache.max_seq_len)


def max_pages_per_step(cache: PagedKVCache, max_len: int | None = None) -> int:
    """Width of the block tables of steps on cache (constant: the longest allowed sequence)."""
    return cache.pages_for(context_bound(cache, max_len))


def prepare_step(cache: PagedKVCache, seqs: list[Sequence], token_lists, all_logits=False,
                 max_len: int | None = None, out: StepMetadata | None = None,
                 keep_ids: bool = False, append: bool = False, padding: int = 0) -> StepMetadata:
    """Reserve cache pages for the new tokens of every sequence, then build the step's metadata.

    seqs[b] continues with token_lists[b] (ids, at the positions after its cached ones).
    all_logits: logits for every row, else for the last row of each sequence; a list of one bool
    per sequence: every row of the sequences marked, the last row of the others. max_len: the
    model's longest sequence (RoPE table length). Errors (a sequence too long:
    ContextLengthError; too few free pages: OutOfPagesError; a bad id) are raised before any
    sequence or page changes.
    out: static metadata to write into (see ``StepMetadata.copy_into``); keep_ids: leave
    out.ids alone (their values come from the device; token_lists then hold placeholders, which
    are not checked). append: append the ids to the sequences' tokens here; by default the
    caller appends them once the step ran (``forward`` does). padding: the last ``padding`` ids
    of the last sequence only fill a static step up to its size: they run and write keys and
    values at the positions after the real ones (which later steps overwrite; the caller gives
    back their pages), and that sequence's logits row is its last real one.
    """
    token_lists = [as_token_ids(ids) for ids in token_lists]
    if len(seqs) != len(token_lists) or not seqs:
        raise ValueError(f"a step needs one token list per sequence, got {len(seqs)} sequences "
                         f"and {len(token_lists)} token lists")
    if len({id(s) for s in seqs}) != len(seqs):
        raise ValueError("a sequence appears twice in one step")
    vocab = cache.config.vocab_size
    for seq, ids in zip(seqs, token_lists):
        if not ids:
            raise ValueError("every sequence of a step needs at least one new token")
        bad = [] if keep_ids else [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        cache.check_length(seq, len(ids), max_len)
    every_row = _per_sequence(all_logits, len(seqs))
    if len(every_row) != len(seqs):
        raise ValueError(f"all_logits: {len(every_row)} flags for {len(seqs)} sequences")
    if not 0 <= padding < len(token_lists[-1]) or (padding and any(every_row)):
        raise ValueError(f"padding {padding} needs a longer last token list and no all_logits")
    if out is not None:
        _check_fits(out, token_lists, all_logits)
    cache.reserve_all(zip(seqs, (len(ids) for ids in token_lists)))

    page_size = cache.page_size
    max_pages = max_pages_per_step(cache, max_len)
    positions, slots, cu, context_lens, logit_rows = [], [], [0], [], []
    # The block table (batch * max_pages ids) is the bulk of a batched step's metadata: built
    # in an int32 array, which converts to a tensor far faster than nested lists of ints.
    table, zeros = array("i"), array("i", bytes(4 * max_pages))
    for seq, ids, every in zip(seqs, token_lists, every_row):
        start = len(seq)
        for p in range(start, start + len(ids)):
            positions.append(p)
            slots.append(seq.pages[p // page_size] * page_size + p % page_size)
        cu.append(cu[-1] + len(ids))
        context_lens.append(start + len(ids))
        pages = seq.pages[:max_pages]
        table.extend(pages)
        table.extend(zeros[:max_pages - len(pages)])
        logit_rows.extend(range(cu[-2], cu[-1]) if every else [cu[-1] - 1])
    logit_rows[-1] -= padding

    tensor = torch.tensor  # built on the host, then sent to the device (or into out)
    meta = StepMetadata(
        ids=tensor([i for ids in token_lists for i in ids], dtype=torch.int32),
        positions=tensor(positions, dtype=torch.int32),
        slots=tensor(slots, dtype=torch.int64),
        cu_seqlens_q=tensor(cu, dtype=torch.int32),
        context_lens=tensor(context_lens, dtype=torch.int32),
        block_table=torch.frombuffer(table, dtype=torch.int32).view(len(seqs), max_pages).clone(),
        logit_rows=tensor(logit_rows, dtype=torch.int64),
        max_query_len=max(len(ids) for ids in token_lists),
        # An upper bound of every context length on this cache, the same for every step.
        max_context_len=context_bound(cache, max_len),
    )
    if append:
        for seq, ids in zip(seqs, token_lists):
            seq.tokens.extend(ids)
    return meta.copy_into(out, keep_ids=keep_ids) if out is not None else meta.to(cache.device)


def static_metadata(model, n_tokens: int, cache: PagedKVCache, n_logits: int = 1,
                    batch: int = 1) -> StepMetadata:
    """Static step metadata for model's steps of n_tokens tokens on cache, for CUDA graphs: fill
    it with ``prepare_step(..., max_len=model.max_len, out=meta)`` before each replay."""
    return StepMetadata.for_cache(cache, n_tokens, n_logits, batch, max_len=model.max_len)
