"""Rotary position embedding tables, computed the way transformers computes them.

transformers (5.17, ``LlamaRotaryEmbedding`` and ``_compute_llama3_parameters``):

    inv_freq[i] = 1 / theta ** (2i / head_dim)                 float32, i < head_dim / 2
    linear: inv_freq / factor (Gemma 3's full-attention layers)
    llama3: wavelen = 2 pi / inv_freq; wavelengths above original_len / low_freq_factor are
            divided by factor, those below original_len / high_freq_factor are kept, and the
            ones between are interpolated: with
            smooth = (original_len / wavelen - low) / (high - low),
            (1 - smooth) * inv_freq / factor + smooth * inv_freq
    freqs[p, i] = p * inv_freq[i]                              float32
    cos, sin = cos(freqs) * attention_scaling, sin(...)        then rounded to the model dtype

The tables here are float32 tensors (max_len, head_dim // 2) holding exactly those values after
the rounding to the model dtype (bf16 values stored in float32), so a kernel that applies them in
float32 multiplies by the same numbers transformers does. (transformers' tables have head_dim
columns, the two halves equal; the ``rope`` op reads column i for both elements of a pair.)
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim // 2,) float32, attention_scaling) as transformers computes them."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    # default, linear and llama3 RoPE leave the magnitudes alone; yarn/longrope (unsupported)
    # would not.
    attention_scaling = 1.0
    scaling = config.rope_scaling
    if scaling is not None and scaling["rope_type"] == "linear":
        inv_freq = inv_freq / scaling["factor"]
    if scaling is not None and scaling["rope_type"] == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return inv_freq, attention_scaling


def rope_tables(config: ModelConfig, max_len: int, dtype: torch.dtype = torch.bfloat16,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: (max_len, head_dim // 2) float32, row p for position p, rounded to ``dtype``.

    Computed on the CPU (deterministic, and the same numbers for every device), then moved.
    """
    inv_freq, attention_scaling = inverse_frequencies(config)
    positions = torch.arange(max_len, dtype=torch.int64).float()
    freqs = positions[:, None] * inv_freq[None, :]  # one float32 product each, as the matmul
    cos = (freqs.cos() * attention_scaling).to(dtype).float()
    sin = (freqs.sin() * attention_scaling).to(dtype).float()
    return cos.contiguous().to(device), sin.contiguous().to(device)
