"""Rotary position embedding tables, computed the way transformers computes them.

transformers (5.17, ``LlamaRotaryEmbedding``, ``_compute_llama3_parameters`` and
``_compute_yarn_parameters``; the scaling dicts are ``rope_config.py``'s):

    inv_freq[i] = 1 / theta ** (2i / head_dim)                 float32, i < head_dim / 2
    linear: inv_freq / factor (Gemma 3's full-attention layers)
    llama3: wavelen = 2 pi / inv_freq; wavelengths above original_len / low_freq_factor are
            divided by factor, those below original_len / high_freq_factor are kept, and the
            ones between are interpolated: with
            smooth = (original_len / wavelen - low) / (high - low),
            (1 - smooth) * inv_freq / factor + smooth * inv_freq
    yarn:   extrapolated = inv_freq, interpolated = 1 / (factor * theta ** (2i / head_dim));
            pair(r) = head_dim * ln(original_len / (2 pi r)) / (2 ln theta), the (fractional)
            pair turning r times over the original context; low = pair(beta_fast),
            high = pair(beta_slow), floored and ceiled if truncate, clamped to
            [0, head_dim - 1]; ramp = clamp((i - low) / (high - low), 0, 1), kept = 1 - ramp:
            interpolated * (1 - kept) + extrapolated * kept (fast pairs keep their frequency,
            slow ones are divided by factor). attention_scaling: attention_factor, else
            mscale(factor, mscale) / mscale(factor, mscale_all_dim) where both are nonzero,
            else mscale(factor, 1), with mscale(s, m) = 0.1 m ln(s) + 1 (1 where s <= 1)
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
    periods = config.rope_theta ** exponents  # pair i turns once every 2 pi * periods[i]
    inv_freq = 1.0 / periods
    # default, linear and llama3 RoPE leave the magnitudes alone; yarn scales them.
    attention_scaling = 1.0
    scaling = config.rope_scaling
    if scaling is not None and scaling["rope_type"] == "yarn":
        return _yarn(config, scaling, periods)
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


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for positions stretched by factor (none without a stretch)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(config: ModelConfig, scaling: dict, periods: torch.Tensor) -> tuple[torch.Tensor, float]:
    """YaRN's inv_freq and attention_scaling from plain RoPE's periods (the formulas: the module
    docstring), each operation in transformers' order and dtype so that the float32 values are
    the same."""
    dim, base = config.head_dim, config.rope_theta
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    extrapolated = 1.0 / periods  # plain RoPE
    interpolated = 1.0 / (factor * periods)  # positions divided by factor

    def pair_turning(rotations):
        # Solve original_len / (2 pi base ** (2i / dim)) = rotations for i.
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = pair_turning(scaling["beta_fast"]), pair_turning(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a step rather than a division by zero
    # 0 up to pair low (turning often over the original context: kept as they are), 1 from
    # pair high on (turning less than beta_slow times: interpolated), linear in between.
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp
    inv_freq = interpolated * (1 - kept) + extrapolated * kept

    attention_scaling = scaling["attention_factor"]
    if attention_scaling is None:
        mscale, mscale_all_dim = scaling["mscale"], scaling["mscale_all_dim"]
        if mscale and mscale_all_dim:  # (DeepSeek's form; a zero counts as absent)
            attention_scaling = _yarn_mscale(factor, mscale) / _yarn_mscale(factor,
                                                                           mscale_all_dim)
        else:
            attention_scaling = _yarn_mscale(factor)
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
