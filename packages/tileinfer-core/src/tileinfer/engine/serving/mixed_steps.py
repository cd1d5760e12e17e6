"""Static shapes for the batched engine's steps with prefill chunks (``BatchRunner``).

A step of b sequences, t tokens in all and a longest query of q tokens runs, padded, as a static
step of ``MixedShape(tokens=T, batch=B, max_query=Q)``: T a token bucket >= t, B a batch bucket
>= b, Q a power of two >= q (at least 16, at most the longest sequence allowed). The B - b
padding sequences take the T - t padding tokens, each at least one and at most Q (their queries
must stay within the step's bound), on the runner's scratch page. Where no shape fits (too many
tokens, too many sequences, padding that does not fit in the padding sequences) the step runs
eagerly at its true size.

Token buckets are multiples of 16 up to 128, then of 64 up to ``MIXED_MAX_TOKENS``: a static
batch's prefill (8 prompts of 16 tokens: 128) needs no padding at all, and a longer step wastes
at most 63 rows. A llama3-8b step past ``MIXED_MAX_TOKENS`` keeps the GPU busy longer than the
host needs to launch it, so a graph would gain it little, and the buffers of the kept shapes
stay small.
"""

from __future__ import annotations

from typing import NamedTuple

MIXED_MAX_TOKENS = 512
MIN_MAX_QUERY = 16


class MixedShape(NamedTuple):
    tokens: int
    batch: int
    max_query: int


def token_bucket(n: int) -> int | None:
    """The smallest token bucket >= n (multiples of 16 up to 128, then of 64), or None past
    ``MIXED_MAX_TOKENS``."""
    step = 16 if n <= 128 else 64
    bucket = max(16, -(-n // step) * step)
    return bucket if bucket <= MIXED_MAX_TOKENS else None


def query_bucket(q: int) -> int:
    """The static bound of a step's longest query: a power of two >= q, at least 16."""
    return max(MIN_MAX_QUERY, 1 << max(0, q - 1).bit_length())


def mixed_shape(batch: int, tokens: int, max_query: int, batch_buckets,
                max_len: int | None = None) -> MixedShape | None:
    """The static shape a step of ``batch`` sequences, ``tokens`` tokens and a longest query of
    ``max_query`` tokens runs in (``batch_buckets``: the runner's batch sizes, ascending), or
    None. max_len: the longest sequence allowed (a padding sequence is one too), which also
    bounds the query bucket."""
    sizes = [size for size in batch_buckets if size >= batch]
    q = query_bucket(max_query) if max_len is None else min(query_bucket(max_query), max_len)
    for size in sizes:  # the smallest batch bucket whose padding sequences hold the padding
        pads = size - batch
        t = token_bucket(tokens + pads)  # every padding sequence runs at least one token
        if t is None:
            return None
        if t == tokens or (pads and pads * q >= t - tokens):
            return MixedShape(t, size, q)
    return None


def padding_lengths(shape: MixedShape, batch: int, tokens: int) -> list[int]:
    """Token counts of the padding sequences of a step of ``batch`` sequences and ``tokens``
    tokens in ``shape``: one per padding sequence, each in 1..max_query, summing to the padding."""
    pads, extra = shape.batch - batch, shape.tokens - tokens
    if pads == 0:
        return []
    lengths = [1] * pads
    extra -= pads
    for i in range(pads):  # fill the first ones up to the query bound
        take = min(extra, shape.max_query - 1)
        lengths[i] += take
        extra -= take
    assert extra == 0, "mixed_shape left more padding than its sequences hold"
    return lengths
