"""Bad input at load time (issue 20): corrupt weights, configs whose sizes do not match their
files, more memory than there is, max_len beyond the model's positions, text that is not valid
Unicode. Each case is refused with one clear error before anything large is allocated."""

from __future__ import annotations

import json
import math
import shutil
import struct
import time

import pytest
import torch

from tileinfer import ConfigError, WeightsError, load_model
from tileinfer.model import loader
from tileinfer.model.config import LongContextWarning
from tileinfer.model.loader import MemoryLimitError
from tileinfer.model.finite_weights import FiniteCheck, check_finite
from tileinfer.model.weights import expected_weight_bytes, load_weights
from tiny_models import tiny  # noqa: F401


@pytest.fixture
def model_dir(tiny, tmp_path):  # noqa: F811
    target = tmp_path / "model"
    shutil.copytree(tiny.directory("llama", False, torch.float32), target)
    return target


def tensor_byte_range(path, name):
    """(start, end) file offsets of tensor ``name``'s data in a safetensors file."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    start, end = header[name]["data_offsets"]
    return 8 + header_len + start, 8 + header_len + end


def test_random_bytes_in_a_weight_tensor_are_refused_with_its_name(model_dir):
    # Before: the model loaded silently and printed <|endoftext|> forty times (NaN logits).
    name = "model.layers.1.mlp.up_proj.weight"
    file = model_dir / "model.safetensors"
    start, end = tensor_byte_range(file, name)
    noise = torch.randint(0, 256, (end - start,), generator=torch.Generator().manual_seed(0),
                          dtype=torch.uint8).numpy().tobytes()
    with open(file, "r+b") as f:
        f.seek(start)
        f.write(noise)
    with pytest.raises(WeightsError, match=rf"tensor '{name}' holds \d+ NaN or infinite values"):
        load_model(model_dir, dtype=torch.float32, max_len=32)


def test_values_that_overflow_the_dtype_are_refused(model_dir):
    from safetensors.torch import load_file, save_file

    tensors = load_file(model_dir / "model.safetensors")
    tensors["model.norm.weight"][3] = 1e6  # finite in float32, inf in float16
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    load_model(model_dir, dtype=torch.float32, max_len=32)
    with pytest.raises(WeightsError, match="'model.norm.weight' holds 1 NaN or infinite value "
                                           r"\(of 256\) in float16"):
        load_model(model_dir, dtype=torch.float16, max_len=32)


def test_finite_check_sees_nan_and_inf_anywhere():
    for bad in (float("nan"), float("inf"), -float("inf")):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            t = torch.randn(333, 77).to(dtype)
            t.view(-1)[4321] = bad
            with pytest.raises(WeightsError, match="'w' holds 1 NaN or infinite value"):
                check_finite(t, "w")
    check_finite(torch.randn(5), "ok")
    check_finite(torch.zeros(0), "empty")
    check_finite(torch.ones(3, dtype=torch.int8), "ints")


def test_the_deferred_finite_check_names_the_first_bad_tensor_at_its_flush():
    check = FiniteCheck()
    good = [torch.randn(40, 7, dtype=torch.bfloat16) for _ in range(3)]
    bad = torch.randn(9, 5)
    bad[2, 3], bad[8, 0] = float("nan"), -float("inf")
    for i, t in enumerate(good[:2]):
        assert check.add(t, f"good{i}") is t
    check.add(bad, "bad")
    check.add(torch.full((4,), float("inf"), dtype=torch.float16), "worse")  # also bad, later
    check.add(torch.ones(3, dtype=torch.int8), "ints")
    with pytest.raises(WeightsError, match=r"'bad' holds 2 NaN or infinite values \(of 45\) "
                                           "in float32"):
        check.flush()
    check.add(good[2], "good2")  # a flush forgets what it read
    check.flush()
    check.flush()  # nothing pending


def _edit_config(model_dir, **changes):
    path = model_dir / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_absurd_layer_count_is_refused_at_once_naming_the_field(model_dir):
    # Before: ran for minutes listing 10**8 layers' tensors and died of memory.
    _edit_config(model_dir, num_hidden_layers=10**8)
    start = time.perf_counter()
    with pytest.raises(WeightsError, match="config field 'num_hidden_layers' is 100000000, but "
                                           "the checkpoint in .* holds layers 0..1"):
        load_model(model_dir, dtype=torch.float32, max_len=32)
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("field,value,tensor", [
    ("hidden_size", 10**6, "model.embed_tokens.weight"),
    ("intermediate_size", 10**7, "model.layers.0.mlp.up_proj.weight"),
    ("vocab_size", 10**9, "model.embed_tokens.weight"),
])
def test_sizes_that_do_not_match_the_files_are_refused_before_allocating(model_dir, monkeypatch,
                                                                         field, value, tensor):
    _edit_config(model_dir, **{field: value})
    allocations = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: allocations.append(a) or real_empty(*a, **k))
    with pytest.raises(WeightsError, match=rf"tensor '{tensor}' has shape .* from config.json"):
        load_model(model_dir, dtype=torch.float32, max_len=32)
    assert not allocations


def test_more_memory_than_available_is_refused_before_loading(model_dir, monkeypatch):
    monkeypatch.setattr(loader, "available_memory", lambda device: 1 << 20)
    monkeypatch.setattr(loader, "load_weights",
                        lambda *a, **k: pytest.fail("weights loaded despite the memory check"))
    with pytest.raises(MemoryLimitError, match=r"loading model .* needs about .* but only "
                                               r"1.0 MiB is available on cpu"):
        load_model(model_dir, dtype=torch.float32, max_len=32)


def test_expected_weight_bytes_equal_what_a_load_allocates(tiny):  # noqa: F811
    from tileinfer.model.config import load_config
    from tileinfer.model.weights import weight_bytes

    for tie, dtype, quantize in [(False, torch.float32, None), (True, torch.bfloat16, None),
                                 (True, torch.bfloat16, "int8"), (False, torch.float32, "int8")]:
        path = tiny.directory("llama", tie, torch.float32)
        config = load_config(path)
        weights = load_weights(config, path, dtype=dtype, quantize=quantize)
        assert expected_weight_bytes(config, dtype, quantize) == weight_bytes(weights)


def test_max_len_beyond_the_models_positions_is_refused_unless_insisted(model_dir):
    # Before: --max-len 20000 beyond the model's 8,192 positions was accepted without a word.
    with pytest.raises(ConfigError, match="max_len 300 exceeds the model's 256 positions "
                                          r"\(config field 'max_position_embeddings'\)"):
        load_model(model_dir, dtype=torch.float32, max_len=300)
    with pytest.warns(LongContextWarning, match="max_len 300 exceeds the model's 256 positions"):
        model = load_model(model_dir, dtype=torch.float32, max_len=300, allow_long=True)
    assert model.max_len == 300


def test_default_max_len_is_capped_by_the_models_positions(model_dir):
    assert load_model(model_dir, dtype=torch.float32).max_len == 256


def test_huge_max_len_that_is_insisted_on_is_refused_for_memory(model_dir):
    # Before: --max-len 1000000000 ran for minutes and died of memory.
    start = time.perf_counter()
    with pytest.warns(LongContextWarning), pytest.raises(
            MemoryLimitError, match="RoPE tables for max_len 1000000000"):
        load_model(model_dir, dtype=torch.float32, max_len=10**9, allow_long=True)
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "100"])
def test_max_len_must_be_a_positive_integer(model_dir, bad):
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        load_model(model_dir, max_len=bad)


def test_lone_surrogate_in_text_is_one_clear_error(smollm2_dir):
    from tileinfer import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    # What Python makes of the byte 0xff on a command line (surrogateescape), and half a UTF-16
    # pair: before, the tokenizer's TypeError ("TextInputSequence must be str").
    with pytest.raises(ValueError, match=r"not valid Unicode: a lone surrogate U\+DCFF at "
                                         r"character 3 \(the byte 0xff, which was not UTF-8\)"):
        tok.encode("caf\udcff")
    with pytest.raises(ValueError, match=r"lone surrogate U\+D83D at character 0$"):
        tok.encode("\ud83d")
    assert tok.encode("café 😀")  # valid text is unaffected
    assert math.isfinite(len(tok.encode("x")))
