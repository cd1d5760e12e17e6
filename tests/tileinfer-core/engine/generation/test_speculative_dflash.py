"""DFlash drafters: random drafters written in z-lab's checkpoint layout, their block pass against
an independent plain-PyTorch reading of the format (target hidden states from transformers),
greedy speculative output equal to plain greedy output, the drafter's context kept in step with
the target across rejections, sampled drafts, bad checkpoints and arguments; the GPU with graphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

from speculative_helpers import divergence, gpu_backends, one_cpu_thread  # noqa: F401
from tileinfer import (ConfigError, DFlashProposer, SamplingParams, SpecStats, WeightsError,
                       load_dflash, load_model)
from tileinfer.backend.sampling import filtered_probs
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.generate import generate, generate_into
from tileinfer.engine.generation.runner import ModelRunner
from tileinfer.engine.generation.speculative.dflash import build_target_layer_ids
from tiny_models import COMMON, build_tiny, prompt_ids, save_tiny, tiny  # noqa: F401

MAX_LEN = 160
MASK = 509  # a row of the target's embedding table, as <|MASK|> is for Qwen3's drafters


# --- a drafter in z-lab's layout -------------------------------------------------------------


def build_dflash(directory: Path, target_layers: int = 2, layers: int = 2, block_size: int = 4,
                 target_layer_ids=(0, 1), vocab: int = COMMON["vocab_size"],
                 hidden: int = COMMON["hidden_size"], seed: int = 0, out_scale: float = 1.0,
                 drop=(), **config_overrides) -> Path:
    """A random DFlash drafter: a Qwen3Config with DFlash's keys and the tensors ``layers.*``,
    ``fc``, ``hidden_norm``, ``norm`` (no embedding, no lm_head). out_scale scales o_proj and
    down_proj (what the layers add to the residual stream). drop: tensor names to leave out."""
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=256, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
        max_position_embeddings=4096, rope_parameters={"rope_type": "default",
                                                       "rope_theta": 1e6},
    ).to_dict()
    config.update(architectures=["DFlashDraftModel"],
                  auto_map={"AutoModel": "dflash.DFlashDraftModel"}, block_size=block_size,
                  num_target_layers=target_layers,
                  dflash_config={"mask_token_id": MASK, "target_layer_ids": list(target_layer_ids)})
    config.update(config_overrides)
    gen = torch.Generator().manual_seed(seed)

    def w(*shape, std=0.05):
        return torch.randn(shape, generator=gen) * std

    def norm(n):
        return 1.0 + 0.2 * torch.randn(n, generator=gen)

    q, kv = 4 * 64, 2 * 64
    tensors = {"fc.weight": w(hidden, len(target_layer_ids) * hidden),
               "hidden_norm.weight": norm(hidden), "norm.weight": norm(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": norm(hidden),
            p + "post_attention_layernorm.weight": norm(hidden),
            p + "self_attn.q_proj.weight": w(q, hidden),
            p + "self_attn.k_proj.weight": w(kv, hidden),
            p + "self_attn.v_proj.weight": w(kv, hidden),
            p + "self_attn.o_proj.weight": w(hidden, q, std=0.05 * out_scale),
            p + "self_attn.q_norm.weight": norm(64), p + "self_attn.k_norm.weight": norm(64),
            p + "mlp.gate_proj.weight": w(256, hidden), p + "mlp.up_proj.weight": w(256, hidden),
            p + "mlp.down_proj.weight": w(hidden, 256, std=0.05 * out_scale),
        })
    for name in drop:
        del tensors[name]
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# --- the format read independently (plain PyTorch, no TileInfer op) ---------------------------


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rope(x, positions, theta):
    """Rotate-half RoPE of x (n, heads, head_dim) at positions (n,)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.cat([positions[:, None].float() * inv_freq] * 2, -1)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + half * sin


@torch.no_grad()
def reference_block_logits(drafter_dir: Path, target_hf, context_ids, last: int):
    """The logits of the block [last, mask...] placed after context_ids, as z-lab's drafter
    computes them: target hidden states (transformers, hidden_states[id + 1]) -> fc ->
    hidden_norm; per layer, queries from the block, keys/values from [context; block], no
    causal mask; the target's embedding and lm_head."""
    cfg = json.loads((drafter_dir / "config.json").read_text())
    w = load_file(str(drafter_dir / "model.safetensors"))
    eps, heads, kv_heads, d = (cfg["rms_norm_eps"], cfg["num_attention_heads"],
                               cfg["num_key_value_heads"], cfg["head_dim"])
    theta = cfg["rope_parameters"]["rope_theta"]
    bs, mask = cfg["block_size"], cfg["dflash_config"]["mask_token_id"]
    layer_ids = cfg["dflash_config"]["target_layer_ids"]
    states = target_hf(torch.tensor([list(context_ids)]), output_hidden_states=True).hidden_states
    features = torch.cat([states[i + 1][0] for i in layer_ids], -1)
    context = _rms(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    n = len(context_ids)
    block_pos, all_pos = torch.arange(n, n + bs), torch.arange(n + bs)
    h = target_hf.model.embed_tokens.weight[[last] + [mask] * (bs - 1)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = _rms(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(bs, heads, d)
        q = _rope(_rms(q, w[p + "self_attn.q_norm.weight"], eps), block_pos, theta)
        kv_in = torch.cat([context, x])
        k = (kv_in @ w[p + "self_attn.k_proj.weight"].T).view(n + bs, kv_heads, d)
        k = _rope(_rms(k, w[p + "self_attn.k_norm.weight"], eps), all_pos, theta)
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(n + bs, kv_heads, d)
        k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * d ** -0.5, -1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(bs, heads * d)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        mlp = F.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)
        h = h + mlp @ w[p + "mlp.down_proj.weight"].T
    return _rms(h, w["norm.weight"], eps) @ target_hf.lm_head.weight.T


def load_target(tiny, device=None, backend="ref", dtype=torch.float32):
    return load_model(tiny.directory("qwen3", dtype=dtype), dtype=dtype, backend=backend,
                      max_len=MAX_LEN, device=device)


def attach(proposer, target, sampling=SamplingParams()):
    cache = new_cache(target, MAX_LEN)
    runner = ModelRunner(target, cache)
    seq = cache.new_sequence()
    proposer.begin(runner, seq, sampling, 0)
    return runner, seq


def assert_close_logits(got, expected):
    scale = float(expected.abs().max())
    assert (got - expected).abs().max() < 1e-4 * scale, float((got - expected).abs().max())


# --- the block pass ---------------------------------------------------------------------------


@pytest.mark.parametrize("target_layer_ids,layers", [((0, 1), 2), ((1,), 1), ((0,), 2)],
                         ids=["both-layers", "last-layer", "first-layer"])
def test_block_pass_matches_a_plain_pytorch_reading(tiny, tmp_path, target_layer_ids, layers):
    # Layer 1 is the tiny target's last: transformers reports its output after the final norm.
    target = load_target(tiny)
    directory = build_dflash(tmp_path / "drafter", layers=layers, target_layer_ids=target_layer_ids)
    proposer = DFlashProposer(load_dflash(directory, target))
    assert proposer.k == 3
    runner, seq = attach(proposer, target)
    prompt = prompt_ids()
    runner.forward(seq, prompt)  # the drafter stores the prompt's context
    drafts = proposer.propose(prompt + [7], 3)
    expected = reference_block_logits(directory, tiny.model("qwen3"), prompt, 7)
    assert_close_logits(proposer.block_logits, expected)
    assert drafts == expected[1:].argmax(-1).tolist()
    assert proposer.propose(prompt + [7], 2) == drafts[:2]


def test_default_target_layers_follow_z_lab(tiny, tmp_path):
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B's drafters
    assert build_target_layer_ids(28, 1) == [14]
    # A config without target_layer_ids gets them: a one-layer drafter reads the middle layer.
    directory = build_dflash(tmp_path / "drafter", layers=1, target_layer_ids=(1,),
                             dflash_config={"mask_token_id": MASK})
    assert load_dflash(directory, load_target(tiny)).target_layer_ids == (1,)


# --- losslessness -----------------------------------------------------------------------------


def test_greedy_dflash_output_equals_plain_greedy_and_the_context_stays_in_step(tiny, tmp_path):
    target = load_target(tiny)
    directory = build_dflash(tmp_path / "drafter", block_size=5)
    # Not adaptive: 4 drafts at every step, mostly rejected (many rollbacks of the context).
    proposer = DFlashProposer(load_dflash(directory, target), adaptive=False)
    prompt = prompt_ids()
    plain = generate(target, prompt, 64, stop_ids=[])
    cache = new_cache(target, MAX_LEN)
    runner = ModelRunner(target, cache)
    seq = cache.new_sequence()
    stats = SpecStats()
    out = generate_into(runner, seq, prompt, 64, stop_ids=[], speculative=proposer,
                        spec_stats=stats)
    assert out == plain
    assert stats.verify_steps > 0 and stats.drafted > 3 * stats.verify_steps  # k = 4 mostly
    assert stats.accepted < stats.drafted  # a random drafter is mostly rejected
    # After 60-odd verify steps with rollbacks, the drafter's context is still that of the
    # tokens the target kept: its next block equals a reading from scratch.
    proposer.propose(seq.tokens + [out[-1]], 4)
    expected = reference_block_logits(directory, tiny.model("qwen3"), seq.tokens, out[-1])
    assert_close_logits(proposer.block_logits, expected)
    # A verify step whose last two drafts are rejected: the context drops them too.
    runner.forward(seq, [out[-1], 3, 4, 5], all_logits=True)
    cache.truncate(seq, len(seq) - 2)
    proposer.propose(seq.tokens + [9], 4)
    expected = reference_block_logits(directory, tiny.model("qwen3"), seq.tokens, 9)
    assert_close_logits(proposer.block_logits, expected)


@pytest.fixture(scope="module")
def echo_target(tmp_path_factory):
    """A tied Qwen3 whose layers add little to the residual stream: its greedy next token is
    (almost surely) the current one, so its greedy output repeats the prompt's last token."""
    hf = build_tiny("qwen3", tie=True, seed=21)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.02)
            layer.mlp.down_proj.weight.mul_(0.02)
    directory = save_tiny(hf, tmp_path_factory.mktemp("echo") / "qwen3")
    return hf, directory


def test_all_drafts_accepted_keeps_output_and_context(echo_target, tmp_path):
    # The echo drafter drafts the mask token everywhere and the prompt ends with it, so every
    # draft is right: the steps that accept a whole block are exercised.
    hf, target_dir = echo_target
    target = load_model(target_dir, dtype=torch.float32, max_len=MAX_LEN)
    directory = build_dflash(tmp_path / "drafter", block_size=6, out_scale=0.02)
    proposer = DFlashProposer(load_dflash(directory, target))
    prompt = prompt_ids(10) + [MASK]
    plain = generate(target, prompt, 40, stop_ids=[])
    cache = new_cache(target, MAX_LEN)
    runner = ModelRunner(target, cache)
    seq = cache.new_sequence()
    stats = SpecStats()
    out = generate_into(runner, seq, prompt, 40, stop_ids=[], speculative=proposer,
                        spec_stats=stats)
    assert out == plain
    assert stats.acceptance_rate == 1.0 and stats.verify_steps <= 40 // 6 + 1
    proposer.propose(seq.tokens + [out[-1]], 5)
    assert_close_logits(proposer.block_logits,
                        reference_block_logits(directory, hf, seq.tokens, out[-1]))


def test_sampled_dflash_drafts_carry_the_drafters_distribution(tiny, tmp_path):
    target = load_target(tiny)
    directory = build_dflash(tmp_path / "drafter")
    proposer = DFlashProposer(load_dflash(directory, target), sample=True)
    params = SamplingParams(0.8, top_k=20)
    runner, seq = attach(proposer, target, params)
    prompt = prompt_ids()
    runner.forward(seq, prompt)
    drafts = proposer.propose(prompt + [7], 3)
    q = filtered_probs(proposer.block_logits[1:], params)
    assert torch.allclose(drafts.probs, q, atol=1e-6)
    assert all(q[j, d] > 0 for j, d in enumerate(drafts))  # each draft is in its kept set
    # And a whole sampled generation runs, reproducibly.
    runs = [generate(target, prompt, 24, params, stop_ids=[], seed=4,
                     speculative=DFlashProposer(load_dflash(directory, target), sample=True))
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 24


def test_a_sequence_prefilled_without_the_drafter_gets_no_drafts(tiny, tmp_path):
    target = load_target(tiny)
    proposer = DFlashProposer(load_dflash(build_dflash(tmp_path / "d"), target))
    cache = new_cache(target, MAX_LEN)
    runner = ModelRunner(target, cache)
    seq = cache.new_sequence()
    first = generate_into(runner, seq, prompt_ids(), 6, stop_ids=[])  # no proposer attached
    stats = SpecStats()
    with pytest.warns(UserWarning, match="has not seen"):
        rest = generate_into(runner, seq, [first[-1]], 10, stop_ids=[], speculative=proposer,
                             spec_stats=stats)
    assert stats.drafted == 0
    assert first + rest == generate(target, prompt_ids(), 16, stop_ids=[])


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(drop=("fc.weight",)), WeightsError, "'fc.weight' is missing"),
    (dict(drop=("layers.1.self_attn.k_norm.weight",)), WeightsError,
     "'layers.1.self_attn.k_norm.weight' is missing"),
    (dict(target_layer_ids=(0, 2)), ValueError, "layer 2 is outside the target's layers 0..1"),
    (dict(target_layer_ids=(-1, 1)), ValueError, "outside"),
    (dict(vocab=256), ValueError, "vocabulary"),
    (dict(hidden=128), ValueError, "hidden_size"),
    (dict(target_layers=36), ValueError, "target of 36 layers"),
    (dict(dflash_config={"target_layer_ids": [0, 1]}), ConfigError, "mask_token_id"),
    (dict(model_type="llama"), ConfigError, "model_type 'qwen3'"),
    (dict(layer_types=["sliding_attention", "full_attention"]), ConfigError, "sliding"),
])
def test_bad_checkpoints_are_clear_errors(tiny, tmp_path, kwargs, error, match):
    target = load_target(tiny)
    with pytest.raises(error, match=match):
        load_dflash(build_dflash(tmp_path / "drafter", **kwargs), target)


@pytest.mark.parametrize("k,match", [(0, "k"), (-1, "k"), (4, "exceeds the 3 drafts")])
def test_bad_k(tiny, tmp_path, k, match):
    drafter = load_dflash(build_dflash(tmp_path / "drafter"), load_target(tiny))
    with pytest.raises(ValueError, match=match):
        DFlashProposer(drafter, k=k)


def test_a_drafter_loaded_for_another_target_is_refused(tiny, tmp_path):
    directory = build_dflash(tmp_path / "drafter")
    proposer = DFlashProposer(load_dflash(directory, load_target(tiny)))
    other = load_target(tiny)  # the same checkpoint, another model object
    with pytest.raises(ValueError, match="another target"):
        generate(other, prompt_ids(), 4, speculative=proposer)


# --- GPU --------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_gpu_greedy_dflash_output_equals_plain_greedy(tiny, tmp_path, backend):
    target = load_target(tiny, "cuda", backend, torch.bfloat16)
    directory = build_dflash(tmp_path / "drafter", block_size=8)
    plain = generate(target, prompt_ids(), 64, stop_ids=[])
    results = []
    for graphs in (False, True):
        cache = new_cache(target, MAX_LEN)
        runner = ModelRunner(target, cache, graphs=graphs)
        seq = cache.new_sequence()
        proposer = DFlashProposer(load_dflash(directory, target), graphs=graphs)
        stats = SpecStats()
        out = generate_into(runner, seq, prompt_ids(), 64, stop_ids=[], speculative=proposer,
                            spec_stats=stats)
        assert stats.drafted > 0
        results.append((out, list(seq.tokens), proposer.block_logits.clone()))
    assert results[0][0] == results[1][0]
    assert results[1][0] == plain, divergence(target, prompt_ids(), plain, results[1][0])
    assert results[0][1] == results[1][1]
    assert torch.equal(results[0][2], results[1][2])  # the graph replays the eager block pass


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_gpu_block_pass_matches_the_plain_reading(tiny, tmp_path, backend):
    target = load_target(tiny, "cuda", backend, torch.float32)
    directory = build_dflash(tmp_path / "drafter")
    proposer = DFlashProposer(load_dflash(directory, target))
    runner, seq = attach(proposer, target)
    prompt = prompt_ids()
    runner.forward(seq, prompt)
    proposer.propose(prompt + [7], 3)
    expected = reference_block_logits(directory, tiny.model("qwen3"), prompt, 7)
    got = proposer.block_logits.cpu()
    # float32 on the GPU: TF32-free, but other summation orders than the CPU's.
    assert (got - expected).abs().max() < 1e-3 * float(expected.abs().max())
