"""The argument checks that generate, ChatSession and LLMEngine.add_request share
(engine/arguments.py): what counts as an integer, a sequence of token ids and a seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tileinfer.engine.arguments import as_integer, check_seed, token_ids


@pytest.mark.parametrize("value", [7, np.int64(7), np.int32(7), torch.tensor(7),
                                   torch.tensor(7, dtype=torch.int32)])
def test_integer_scalars_are_integers(value):
    assert as_integer(value, "x") == 7 and type(as_integer(value, "x")) is int


@pytest.mark.parametrize("value", [True, np.True_, torch.tensor(True), 7.0, np.float32(7),
                                   torch.tensor(7.0), "7", b"7", None, [7]])
def test_what_is_not_an_integer_is_refused_by_name(value):
    with pytest.raises(TypeError, match="^count must be an integer, got "):
        as_integer(value, "count")


def test_token_ids_take_sequences_tensors_and_arrays():
    for ids in ([5, 6, 7], (5, 6, 7), torch.tensor([5, 6, 7]), np.array([5, 6, 7]),
                [np.int64(5), torch.tensor(6), 7], range(5, 8)):
        assert token_ids(ids, "ids", 8) == [5, 6, 7]
    assert token_ids([], "ids", 8) == []


@pytest.mark.parametrize("ids, error, message", [
    ("5678", TypeError, "^ids must be a sequence of token ids \\(integers\\), got a str"),
    (b"56", TypeError, "got a bytes"),
    (5, TypeError, "got int$"),
    ([5.9, 6.9], TypeError, "got 5.9 at index 0$"),
    (torch.tensor([5.0, 6.0]), TypeError, "got 5.0 at index 0$"),
    (torch.tensor([True, False]), TypeError, "got True at index 0$"),
    ([[5, 6]], TypeError, "got \\[5, 6\\] at index 0$"),
    ([5, None], TypeError, "got None at index 1$"),
    ([5, 8], ValueError, "^ids: token id 8 is outside the vocabulary \\(0..7\\)$"),
    ([-1], ValueError, "^ids: token id -1 is outside the vocabulary"),
])
def test_what_is_not_token_ids_is_refused_by_name(ids, error, message):
    with pytest.raises(error, match=message):
        token_ids(ids, "ids", 8)


def test_seeds_are_int64_integers():
    assert check_seed(-2 ** 63) == -2 ** 63 and check_seed(2 ** 63 - 1) == 2 ** 63 - 1
    assert check_seed(np.int64(3)) == check_seed(torch.tensor(3)) == 3
    drawn = {check_seed(None) for _ in range(4)}
    assert all(0 <= s < 2 ** 63 for s in drawn) and len(drawn) > 1
    for bad in (2 ** 63, -2 ** 63 - 1, 2 ** 64, 1.5, "7", True, torch.tensor(1.0)):
        with pytest.raises(ValueError, match="^seed must be an integer in the int64 range, got"):
            check_seed(bad)
