"""Checks of arguments that several entry points share (``generate``, ``ChatSession``,
``LLMEngine.add_request``), so that each refuses the same bad values with the same message."""

from __future__ import annotations

import operator
import random

import torch


def as_integer(value, name: str) -> int:
    """value as an int: a Python, numpy or torch integer scalar; TypeError naming ``name`` for
    anything else, bools and strings included."""
    if type(value) is int:
        return value
    is_bool = isinstance(value, bool) or (torch.is_tensor(value) and value.dtype == torch.bool)
    try:
        if is_bool:
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def token_ids(values, name: str, vocab_size: int) -> list[int]:
    """values (a sequence, tensor or array of token ids) as a list of ints, each in
    0..vocab_size - 1. TypeError naming ``name`` unless every id is an integer (``as_integer``),
    ValueError for an id outside the vocabulary."""
    what = f"{name} must be a sequence of token ids (integers)"
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what}, got a {type(values).__name__}: encode text with the tokenizer")
    if hasattr(values, "tolist"):  # one conversion of a tensor or array, not one per element
        values = values.tolist()
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what}, got {type(values).__name__}") from None
    ids = []
    for index, value in enumerate(items):
        try:
            ids.append(as_integer(value, name))
        except TypeError:
            raise TypeError(f"{what}, got {value!r} at index {index}") from None
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(f"{name}: token id {bad} is outside the vocabulary "
                         f"(0..{vocab_size - 1})")
    return ids


def check_seed(seed) -> int:
    """seed as an int (None: a random one); ValueError unless it is an integer in the int64
    range, the range of the device sampling stream's seed."""
    if seed is None:
        return random.getrandbits(63)
    try:
        value = as_integer(seed, "seed")
    except TypeError:
        value = None
    if value is None or not -2**63 <= value < 2**63:
        raise ValueError(f"seed must be an integer in the int64 range, got {seed!r}")
    return value
