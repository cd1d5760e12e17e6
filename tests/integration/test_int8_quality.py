"""INT8 quality and memory: perplexity of INT8 weights and INT8 KV on the real SmolLM2, key
smoothing against an independent computation and on keys with outlier channels, and the memory
report against the tensors really allocated.

Measured on the CPU (ref backend, bf16 activations), SmolLM2-135M-Instruct over the first 160
tokens of Genesis 1 (benchmarks/data/kjv-genesis.txt), key smoothing calibrated on 256 tokens of
Genesis 11; KL is the mean KL divergence from the bf16 model's next-token distribution:

                      perplexity vs bf16 (3.575)   KL from bf16   top-1 = bf16
  INT8 weights        +0.91%                       0.0138         94.3%
  INT8 KV             +0.74%                       0.0066         96.9%
  INT8 KV, smoothed   -0.67%                       0.0037         97.5%

Perplexity over 159 tokens moves by up to ~1.5% either way from any small change (measured over
other spans of Genesis), so the perplexity bounds are the issue's targets or a little above the
measured spread, and the KL bounds about twice the measured values; a broken INT8 path (scales
dropped, smoothing not undone) sends both far past them.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tileinfer import memory_report
from tileinfer.backend.registry import get_backend
from tileinfer.engine.kv.cache import PagedKVCache, new_cache
from tileinfer.engine.generation.calibration import (calibrate_key_smoothing, calibration_text,
                                          key_smoothing_from_calibration)
from tileinfer.engine.generation.forward import forward
from tileinfer.engine.kv.step import prepare_step
from tileinfer.io.tokenizer import load_tokenizer
from tileinfer.model import load_model
from tileinfer_backend_ref.kv import store_kv  # the ground truth's cache writes
from tileinfer.model.config import config_from_dict
from tileinfer.model.quant import Int8Weight
from tiny_models import COMMON, load_reference, prompt_ids, tiny  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
TEXT = REPO / "benchmarks" / "data" / "kjv-genesis.txt"
CONFIG = config_from_dict(dict(COMMON, model_type="llama"))  # head_dim 64, 2 kv heads, 2 layers


def _chapter(n: int) -> str:
    text = TEXT.read_text()
    return re.search(rf"^CHAPTER {n}\n(.*?)(?=^CHAPTER |\Z)", text, flags=re.M | re.S).group(1)


# -- memory report ---------------------------------------------------------------------------

def _allocated(cache: PagedKVCache) -> int:
    """Bytes of the storages behind the cache's tensors, as allocated."""
    tensors = (cache.k_pages, cache.v_pages, cache.k_scales, cache.v_scales, cache.k_smooth)
    return sum(t.untyped_storage().nbytes() for t in tensors if t is not None)


@pytest.mark.parametrize("page_size", [16, 7])
def test_int8_kv_about_doubles_the_tokens_a_budget_holds(tiny, page_size):
    model = load_model(tiny.directory("llama", False, torch.bfloat16), max_len=64)
    budget = 3_000_000 + 12_345
    reports = {}
    for kv, smooth in ((None, False), ("int8", False), ("int8", True)):
        r = memory_report(model, budget_bytes=budget, kv_quantize=kv, key_smoothing=smooth,
                          page_size=page_size)
        # A cache of the reported capacity fits the budget and one page more does not, counted
        # from the storage really allocated.
        pages = r["kv_capacity_tokens"] // page_size
        assert pages * page_size == r["kv_capacity_tokens"]
        smoothing = [torch.ones(2, 64)] * 2 if smooth else None
        fits = new_cache(model, num_pages=pages, page_size=page_size, quantize=kv,
                               key_smoothing=smoothing)
        over = new_cache(model, num_pages=pages + 1, page_size=page_size, quantize=kv,
                               key_smoothing=smoothing)
        assert _allocated(fits) <= budget < _allocated(over)
        assert r["kv_bytes_per_token"] * page_size == _allocated(over) - _allocated(fits)
        # ...and a cache passed in is measured the same way.
        r_cache = memory_report(model, fits, budget_bytes=budget)
        assert r_cache["cache_bytes"] == _allocated(fits)
        assert r_cache["cache_tokens"] == r["kv_capacity_tokens"]
        assert r_cache["kv_bytes_per_token"] == r["kv_bytes_per_token"]
        assert r_cache["kv_cache"] == r["kv_cache"]
        reports[r["kv_cache"]] = r
    head_dim = CONFIG.head_dim
    # bf16: 2 bytes per element; INT8: 1 byte per element and a float32 scale per vector.
    assert reports["bf16"]["kv_bytes_per_token"] == 2 * 2 * 2 * head_dim * 2
    ratio = reports["int8"]["kv_bytes_per_token"] / reports["bf16"]["kv_bytes_per_token"]
    assert ratio == (head_dim + 4) / (2 * head_dim)
    capacity = reports["int8"]["kv_capacity_tokens"] / reports["bf16"]["kv_capacity_tokens"]
    assert capacity == pytest.approx(2 * head_dim / (head_dim + 4), abs=0.02)  # 1.88x, whole pages
    # Smoothing factors cost a fixed layers * kv_heads * head_dim float32, not per token.
    assert reports["int8-smooth"]["kv_fixed_bytes"] == 2 * 2 * head_dim * 4
    assert reports["int8-smooth"]["kv_bytes_per_token"] == reports["int8"]["kv_bytes_per_token"]


def _tensor_bytes(weights) -> dict[str, int]:
    """Bytes by role, summed over the loaded model's tensors (each storage once)."""
    seen, out = set(), {"embed": 0, "linear": 0, "other": 0}

    def add(role, t):
        if t is not None and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out[role] += t.untyped_storage().nbytes()

    add("embed", weights.embed)
    for layer in weights.layers:
        for x in (layer.qkv, layer.o, layer.up, layer.down):
            for t in ((x.q, x.scale) if isinstance(x, Int8Weight) else (x,)):
                add("linear", t)
        for t in (layer.attn_norm, layer.mlp_norm, layer.q_norm, layer.k_norm):
            add("other", t)
    head = weights.lm_head
    for t in ((head.q, head.scale) if isinstance(head, Int8Weight) else (head,)):
        add("linear", t)
    add("other", weights.norm)
    return out


@pytest.mark.parametrize("tie", [False, True])
def test_int8_weights_halve_the_linear_and_decode_bytes(tiny, tie):
    directory = tiny.directory("llama", tie, torch.bfloat16)
    bf16, int8 = load_model(directory, max_len=32), load_model(directory, max_len=32,
                                                               quantize="int8")
    rb, ri = memory_report(bf16), memory_report(int8)
    tb, ti = _tensor_bytes(bf16.weights), _tensor_bytes(int8.weights)
    for r, t in ((rb, tb), (ri, ti)):
        assert r["weight_bytes"] == sum(t.values())
        assert r["linear_weight_bytes"] == t["linear"] + (t["embed"] if tie and r is rb else 0)
    assert (rb["weights"], ri["weights"]) == ("bf16", "int8")
    # int8 values are half of bf16; each output row adds a float32 scale (4 bytes per row of
    # 256..512 inputs, under 1%).
    linear_ratio = ri["linear_weight_bytes"] / rb["linear_weight_bytes"]
    assert 0.5 < linear_ratio < 0.51, linear_ratio
    # What a decode step reads (all but the embedding table) halves, tied or not...
    assert 0.5 < ri["decode_weight_bytes"] / rb["decode_weight_bytes"] < 0.52
    # ...while the resident bytes keep the bf16 embedding table, beside the INT8 head it is
    # read as when tied.
    row = tb["embed"] // bf16.config.vocab_size
    assert ti["embed"] == tb["embed"]
    assert ri["decode_weight_bytes"] == ri["weight_bytes"] - ti["embed"] + row
    assert rb["decode_weight_bytes"] == rb["weight_bytes"] - (0 if tie else tb["embed"]) + row
    assert ri["weight_bytes"] == tb["embed"] + ri["linear_weight_bytes"] + ti["other"]


def test_bench_shows_weight_and_kv_bytes(tiny, capsys):
    from tileinfer_cli.main import main

    directory = tiny.directory("llama", False, torch.bfloat16)
    assert main(["bench", "--model", str(directory), "--backend", "ref", "--int8",
                 "--kv-cache", "int8", "--prompt-len", "4", "--new-tokens", "3", "--repeats", "1",
                 "--graphs", "off", "--pipeline", "off"]) == 0
    out = capsys.readouterr().out
    model = load_model(directory, max_len=64, quantize="int8")
    r = memory_report(model, kv_quantize="int8")
    assert re.search(r"weights [\d.]+ [kMG]?B \(int8; [\d.]+ [kMG]?B read per decode token\), "
                     rf"KV cache {r['kv_bytes_per_token']:,} bytes per token \(int8; ", out), out
    assert f'"weight_bytes": {r["weight_bytes"]}' in out
    assert f'"kv_bytes_per_token": {r["kv_bytes_per_token"]}' in out


# -- key smoothing ---------------------------------------------------------------------------

def _smoothing_by_hand(keys: np.ndarray, alpha=0.5, floor=1e-2) -> np.ndarray:
    """The documented procedure, channel by channel: keys (tokens, kv_heads, head_dim)."""
    tokens, heads, dim = keys.shape
    out = np.ones((heads, dim))
    for h in range(heads):
        amax = [max(abs(float(keys[t, h, c])) for t in range(tokens)) for c in range(dim)]
        top = max(amax)
        if top == 0:
            continue
        s = [max(a, floor * top) ** alpha for a in amax]
        out[h] = np.array(s) / (sum(s) / dim)
    return out


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_key_smoothing_matches_a_computation_by_hand(alpha):
    gen = torch.Generator().manual_seed(4)
    keys = torch.randn(50, 3, 16, generator=gen)
    keys[:, 0, 5] *= 25.0  # an outlier channel
    keys[:, 1, 2] += 12.0  # an offset channel (as RoPE's slow dimensions have)
    keys[:, 1, 9] *= 1e-5  # a near-silent channel: held at the floor
    keys[:, 2] = 0.0  # a silent head: factors 1
    (factors,) = key_smoothing_from_calibration([keys.to(torch.bfloat16)], alpha=alpha)
    expected = _smoothing_by_hand(keys.to(torch.bfloat16).float().numpy(), alpha=alpha)
    np.testing.assert_allclose(factors.numpy(), expected, rtol=1e-5)


def test_calibration_longer_than_max_len_runs_separate_sequences(tiny):
    """Ids longer than max_len are cut into sequences of max_len, each from position 0, and
    prefilled in chunks: the factors are those of transformers' keys of each piece."""
    directory = tiny.directory("llama", False, torch.float32)
    model = load_model(directory, dtype=torch.float32, max_len=24)
    ids = prompt_ids(60, seed=11)
    factors = calibrate_key_smoothing(model, ids, alpha=0.6, chunk=10)
    reference = load_reference(directory, torch.float32)
    pieces = [[] for _ in range(CONFIG.num_layers)]
    with torch.no_grad():
        for begin in (0, 24, 48):
            cache = reference(torch.tensor([ids[begin:begin + 24]])).past_key_values
            for layer, kv in enumerate(cache.layers):
                pieces[layer].append(kv.keys[0].transpose(0, 1))  # (n, kv_heads, head_dim)
    for layer, ours in enumerate(factors):
        keys = torch.cat(pieces[layer]).numpy()
        np.testing.assert_allclose(ours.cpu().numpy(), _smoothing_by_hand(keys, alpha=0.6),
                                   rtol=1e-4)
    with pytest.raises(ValueError, match="at least one calibration token"):
        calibrate_key_smoothing(model, [])
    with pytest.raises(ValueError, match="pass the calibration token ids"):
        calibrate_key_smoothing(model)  # the tiny model's folder has no tokenizer


def _attention_outputs(keys, values, queries, quantize, smoothing):
    """The ref backend's causal attention over keys/values stored through store_kv."""
    n = keys.shape[0]
    cache = PagedKVCache(CONFIG, num_pages=n // 16, page_size=16, dtype=torch.float32,
                         device="cpu", quantize=quantize, key_smoothing=smoothing)
    seq = cache.new_sequence()
    meta = prepare_step(cache, [seq], [[0] * n])
    kv, ref = cache.layer(0), get_backend("ref")
    store_kv(kv, keys, values, meta.slots)
    out = torch.empty_like(queries)
    ref.attention(out, queries, kv, meta.attention, CONFIG.head_dim ** -0.5, True, None)
    return out


def test_smoothed_int8_keys_give_attention_closer_to_full_precision():
    """Keys with a few large channels, some with an offset, as real models' keys after RoPE
    have: smoothing (calibrated on other keys of the same distribution) brings INT8 attention
    closer to full-precision attention than plain INT8."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = CONFIG.num_heads, CONFIG.num_kv_heads, CONFIG.head_dim
    spread, offset = torch.ones(kv_heads, dim), torch.zeros(kv_heads, dim)
    spread[:, [3, 17, 40]] = torch.tensor([15.0, 25.0, 10.0])
    offset[:, [17, 50]] = torch.tensor([20.0, 8.0])

    def draw(n):
        return torch.randn(n, kv_heads, dim, generator=gen) * spread + offset

    smoothing = key_smoothing_from_calibration([draw(256)] * CONFIG.num_layers)
    n = 128
    keys, values = draw(n), torch.randn(n, kv_heads, dim, generator=gen)
    queries = torch.randn(n, heads, dim, generator=gen) * 0.5
    exact = _attention_outputs(keys, values, queries, None, None)
    error = {}
    for name, factors in (("plain", None), ("smoothed", smoothing)):
        out = _attention_outputs(keys, values, queries, "int8", factors)
        error[name] = ((out - exact).norm() / exact.norm()).item()
    # Measured: plain 0.0330, smoothed 0.0104 (3.2x lower).
    assert error["smoothed"] < 0.5 * error["plain"], error
    assert 0 < error["smoothed"] < 0.02, error


# -- perplexity of the real SmolLM2 ----------------------------------------------------------

def _log_probs(model, cache, ids) -> torch.Tensor:
    """(len(ids) - 1, vocab) float32: the log-probabilities each position gives the next."""
    seq = cache.new_sequence()
    with torch.no_grad():
        logits = forward(model, cache, seq, ids, all_logits=True)
    cache.release(seq)
    return torch.log_softmax(logits[:-1].float(), dim=-1)


def _compare(smollm2, log_probs) -> tuple[float, float]:
    """(perplexity ratio to bf16, mean KL divergence from bf16)."""
    base, targets = smollm2["log_probs"], torch.tensor(smollm2["ids"][1:])[:, None]
    nll_diff = (base.gather(1, targets) - log_probs.gather(1, targets)).mean().item()
    kl = (base.exp() * (base - log_probs)).sum(-1).mean().item()
    return math.exp(nll_diff), kl


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    tokenizer = load_tokenizer(smollm2_dir)
    ids = tokenizer.encode(_chapter(1), add_special_tokens=False)[:160]
    calib = tokenizer.encode(_chapter(11), add_special_tokens=False)[:256]
    bf16 = load_model(smollm2_dir, max_len=256)
    return dict(dir=smollm2_dir, ids=ids, calib=calib, bf16=bf16,
                log_probs=_log_probs(bf16, new_cache(bf16, 256), ids))


def test_smollm2_int8_weights_perplexity_close_to_bf16(smollm2):
    targets = torch.tensor(smollm2["ids"][1:])[:, None]
    ppl = math.exp(-smollm2["log_probs"].gather(1, targets).mean().item())
    assert 3 < ppl < 5, ppl  # a sane model on a text it has seen much of (3.575)
    int8 = load_model(smollm2["dir"], max_len=256, quantize="int8")
    ratio, kl = _compare(smollm2, _log_probs(int8, new_cache(int8, 256), smollm2["ids"]))
    assert abs(ratio - 1) < 0.02, ratio  # measured +0.91%
    assert 0 < kl < 0.03, kl  # measured 0.0138


def test_smollm2_int8_kv_perplexity_close_to_bf16_and_smoothing_helps(smollm2):
    model = smollm2["bf16"]
    smoothing = calibrate_key_smoothing(model, smollm2["calib"])
    results = {}
    for name, factors in (("plain", None), ("smoothed", smoothing)):
        cache = new_cache(model, 256, quantize="int8", key_smoothing=factors)
        results[name] = _compare(smollm2, _log_probs(model, cache, smollm2["ids"]))
    (plain_ratio, plain_kl), (smooth_ratio, smooth_kl) = results["plain"], results["smoothed"]
    # The CPU's bf16 kernels move the plain cache's ratio: +0.74% measured on an AMD EPYC, +1.63%
    # on an Intel Xeon with AVX-512; the smoothed one stayed within 0.7% on both.
    assert abs(plain_ratio - 1) < 0.02 and abs(smooth_ratio - 1) < 0.015, results
    assert 0 < plain_kl < 0.013 and 0 < smooth_kl < 0.0075, results  # 0.0066, 0.0037
    assert smooth_kl < 0.8 * plain_kl, results  # measured 0.56x


def test_default_calibration_text_runs_on_the_model_tokenizer(smollm2):
    model = smollm2["bf16"]
    ids = load_tokenizer(smollm2["dir"]).encode(calibration_text(), add_special_tokens=False)
    assert 300 < len(ids) < 400
    factors = calibrate_key_smoothing(model)
    assert len(factors) == model.config.num_layers
    assert factors[0].shape == (model.config.num_kv_heads, model.config.head_dim)
    assert all(bool((f > 0).all()) for f in factors)


def test_cli_int8_smooth_session_calibrates_on_the_default_text(smollm2):
    """``tileinfer run/chat --kv-cache int8-smooth`` builds its session with factors calibrated
    on ``calibration_text()``."""
    from tileinfer_cli.main import build_parser
    from tileinfer_cli.session import new_session

    from tileinfer import SamplingParams

    args = build_parser().parse_args(["run", "--kv-cache", "int8-smooth", "--max-len", "256",
                                      "hello"])
    model = smollm2["bf16"]
    model.close()  # the session makes the model's KV pool anew, in INT8 with the factors
    session = new_session(args, model, load_tokenizer(smollm2["dir"]), SamplingParams(), None)
    assert session.cache.quantize == "int8"
    expected = torch.stack(calibrate_key_smoothing(model))
    torch.testing.assert_close(session.cache.k_smooth, expected, rtol=0, atol=0)
    session.close()


# -- the benchmark script's windows ----------------------------------------------------------

def _benchmark():
    spec = importlib.util.spec_from_file_location("perplexity_bench",
                                                  REPO / "benchmarks" / "perplexity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("n,window,stride", [(10, 4, 4), (10, 4, 2), (11, 5, 3), (3, 8, 8)])
def test_perplexity_windows_score_every_token_once(n, window, stride):
    scored = []
    for begin, end, first in _benchmark().windows(n, window, stride):
        assert end - begin <= window and begin < first <= end
        scored += range(first, end)
    assert scored == list(range(1, n))


def test_perplexity_benchmark_text_splits_into_chapters():
    book = _benchmark().chapters(TEXT.read_text())
    assert sorted(book) == list(range(1, 17))
    assert book[1].startswith("CHAPTER 1\n\nIn the beginning God created the heaven and the earth.")
