"""Models of random weights in a named or given shape: for speed measurements (decode speed does
not depend on the values) and for serving benchmarks without a checkpoint."""

from __future__ import annotations

import torch

from ..backend import get_backend
from .config import config_from_dict
from .decoder import Model
from .loader import check_batch_invariant, check_fp8
from .quant import check_quantize, quantize_linear
from .weights import LayerWeights, ModelWeights

GEMMA3 = dict(model_type="gemma3_text", head_dim=256, sliding_window=512,
              sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
              query_pre_attn_scalar=256, rms_norm_eps=1e-6, eos_token_id=1)

SHAPES = {
    "llama3-8b": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14336, vocab_size=128256),
    "llama3.2-1b": dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32,
                        num_key_value_heads=8, intermediate_size=8192, vocab_size=128256),
    "llama3.2-3b": dict(num_hidden_layers=28, hidden_size=3072, num_attention_heads=24,
                        num_key_value_heads=8, intermediate_size=8192, vocab_size=128256),
    # SmolLM2-135M (the embedded default model; tied embeddings are read as a separate lm_head
    # here, which costs the same)
    "smollm2-135m": dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152),
    # Gemma 3 270M and 1B (gemma3_text: five local layers of a 512-position window to one global)
    "gemma3-270m": dict(num_hidden_layers=18, hidden_size=640, num_attention_heads=4,
                        num_key_value_heads=1, intermediate_size=2048, vocab_size=262144,
                        **GEMMA3),
    "gemma3-1b": dict(num_hidden_layers=26, hidden_size=1152, num_attention_heads=4,
                      num_key_value_heads=1, intermediate_size=6912, vocab_size=262144,
                      **GEMMA3),
}


def shape_config(name: str):
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    return config_from_dict(dict(dict(model_type="llama", rms_norm_eps=1e-5,
                                      rope_theta=500000.0, max_position_embeddings=131072,
                                      tie_word_embeddings=False, eos_token_id=128001),
                                 **SHAPES[name]))


def random_model(config, dtype=torch.bfloat16, backend="ref", device="cuda", quantize=None,
                 max_len: int = 4096, seed: int = 0, batch_invariant: bool = False) -> Model:
    """A model of ``config`` with random weights (std 0.02), every layer's tensors distinct;
    batch_invariant as ``load_model``'s."""
    ops = get_backend(backend)
    check_batch_invariant(ops, batch_invariant)
    check_quantize(quantize)
    check_fp8(ops, quantize)
    gen = torch.Generator(device=device).manual_seed(seed)
    c = config

    def w(*shape):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dtype)

    def linear(*shape, head=False):
        return quantize_linear(w(*shape), quantize, head)

    def ones(n):  # a norm's weight: Gemma's is float32 (gemma.gemma_rmsnorm)
        return torch.ones(n, dtype=torch.float32 if c.gemma is not None else dtype,
                          device=device)

    up_rows = 2 * c.intermediate_size if c.gated else c.intermediate_size
    post = c.gemma is not None  # Gemma 3's norms of the attention and MLP outputs
    layers = [LayerWeights(attn_norm=ones(c.hidden_size), qkv=linear(c.qkv_size, c.hidden_size),
                           q_norm=ones(c.head_dim) if c.qk_norm else None,
                           k_norm=ones(c.head_dim) if c.qk_norm else None,
                           o=linear(c.hidden_size, c.q_size), mlp_norm=ones(c.hidden_size),
                           up=linear(up_rows, c.hidden_size),
                           down=linear(c.hidden_size, c.intermediate_size),
                           qkv_bias=w(c.qkv_size) if c.qkv_bias else None,
                           post_attn_norm=ones(c.hidden_size) if post else None,
                           post_mlp_norm=ones(c.hidden_size) if post else None)
              for _ in range(c.num_layers)]
    weights = ModelWeights(embed=w(c.vocab_size, c.hidden_size), layers=layers,
                           norm=ones(c.hidden_size),
                           lm_head=linear(c.vocab_size, c.hidden_size, head=True))
    return Model(c, weights, ops, dtype, device, max_len, quantize=quantize,
                 batch_invariant=batch_invariant)
