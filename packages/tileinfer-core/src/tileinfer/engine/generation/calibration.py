"""Key smoothing for INT8 KV caches: per-channel factors calibrated on the model's own keys.

Keys after RoPE have a few channels much larger than the rest; one scale per cached vector then
washes out the small channels. Dividing each channel by a factor before quantizing (and
multiplying back when reading) evens them out. The factors come from running a calibration text
through the model, so this module sits above the model and the cache.
"""

from __future__ import annotations

import math
from importlib import resources

import torch

from ...io.tokenizer import load_tokenizer
from ..kv.cache import PagedKVCache
from .forward import forward


def key_smoothing_from_calibration(per_layer_keys, alpha: float = 0.5, floor: float = 1e-2):
    """Per-layer key smoothing factors (kv_heads, head_dim) from calibration keys.

    per_layer_keys: one (tokens, kv_heads, head_dim) tensor per layer, the keys as the cache
    stores them (after the k norm and RoPE). Procedure, per layer and kv head:

    1. ``amax[c] = max over tokens |key[c]|``, the range of channel c;
    2. clamped from below to ``floor * max_c amax[c]``, so that a channel nearly silent during
       calibration is not blown up by a tiny divisor should it carry more later;
    3. ``s[c] = amax[c] ** alpha``: with alpha = 0.5 (as SmoothQuant's default migration
       strength) a channel's range after division is sqrt(amax), which halves the dynamic range
       between channels (in log terms) that one per-vector scale has to cover;
    4. normalized so that the factors' mean is 1 (the smoothed keys keep their overall size).

    A head whose keys were all zero gets factors of 1.
    """
    factors = []
    for keys in per_layer_keys:
        amax = keys.float().abs().amax(dim=0)  # (kv_heads, head_dim)
        head_max = amax.amax(dim=-1, keepdim=True)
        amax = torch.where(head_max > 0, torch.maximum(amax, floor * head_max),
                           torch.ones_like(amax))
        s = amax ** alpha
        factors.append((s / s.mean(dim=-1, keepdim=True)).contiguous())
    return factors


def calibrate_key_smoothing(model, ids=None, alpha: float = 0.5, floor: float = 1e-2,
                            chunk: int = 512):
    """Key smoothing factors (``key_smoothing_from_calibration``) of model's keys on a
    calibration text.

    ids: the calibration token ids; by default the model's tokenizer encodes
    ``calibration_text()`` (a short public-domain English text). Ids longer than the model's
    max_len are cut into consecutive sequences of max_len tokens, each run from position 0; each
    sequence is prefilled ``chunk`` tokens at a time (the keys do not depend on the chunking), in
    a fresh cache in the model dtype.
    """
    if ids is None:
        ids = default_calibration_ids(model)
    ids = list(ids.tolist() if torch.is_tensor(ids) else ids)
    if not ids:
        raise ValueError("calibrate_key_smoothing needs at least one calibration token")
    span = min(len(ids), model.max_len)
    cache = PagedKVCache(model.config, math.ceil(span / 16), page_size=16, dtype=model.dtype,
                         device=model.device)
    keys = [[] for _ in range(model.config.num_layers)]
    for begin in range(0, len(ids), span):
        seq = cache.new_sequence()
        part = ids[begin:begin + span]
        for start in range(0, len(part), chunk):
            forward(model, cache, seq, part[start:start + chunk])
        for layer in range(model.config.num_layers):
            keys[layer].append(cache.sequence_keys(layer, seq))
        cache.release(seq)
    return key_smoothing_from_calibration([torch.cat(k) for k in keys], alpha=alpha, floor=floor)


def calibration_text() -> str:
    """The default calibration text: public-domain English prose (the United States Declaration
    of Independence, 1776, its opening paragraphs)."""
    return resources.files(__package__).joinpath("calibration_text.txt").read_text(encoding="utf-8")


def default_calibration_ids(model) -> list[int]:
    """``calibration_text()`` encoded by the tokenizer of model's folder."""
    folder = getattr(model, "model_dir", None)
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise ValueError("the model has no tokenizer.json to encode the calibration text with; "
                         "pass the calibration token ids to calibrate_key_smoothing")
    return load_tokenizer(folder).encode(calibration_text(), add_special_tokens=False)
