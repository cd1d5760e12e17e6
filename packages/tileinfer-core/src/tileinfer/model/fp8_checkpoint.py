"""Checkpoints whose linear weights are stored in FP8: read as their dequantized values.

Two formats, told apart by config.json's ``quantization_config``:

- compressed-tensors (llm-compressor's, ``quant_method: "compressed-tensors"``, ``format:
  "float-quantized"``): each quantized layer's ``weight`` is float8_e4m3fn and its
  ``weight_scale`` is one value per output row (``strategy: "channel"``, shape (out, 1)), one
  for the tensor (``"tensor"``, shape (1,) or ()) or one per block (``"block"``, of the group's
  ``block_structure`` [bn, bk]: shape (ceil(out / bn), ceil(in / bk))); ``input_scale``
  (static activation scales) may be present; ``ignore`` lists the layers kept unquantized
  (usually ``lm_head``);
- ``quant_method: "fp8"`` (vLLM's and AutoFP8's): the same tensors, a per-tensor weight scale;
  or, with ``weight_block_size: [bn, bk]`` (DeepSeek-V3's and Qwen3's FP8 checkpoints), one
  scale per block of bn rows and bk columns, ``weight_scale_inv`` of shape
  (ceil(out / bn), ceil(in / bk)) (a multiplier despite its name).

``W[j, :] = weight[j, :] * weight_scale[j]`` (or the one scale; with blocks, each element times
its block's scale). This module gives each weight's values in float32, which the loader
converts to the model's dtype (and INT8 with ``quantize="int8"``), and activations stay in the
model's dtype (input scales are not used).
With ``quantize="fp8"`` the loader keeps e4m3 weights as stored instead (``stored_e4m3``: the
values and one scale per row, the layout of ``tileinfer.backend.fp8``), so they are not rounded
a second time; the activations are then quantized per token as that product does. Block-scaled
weights have no per-row form: with ``quantize="fp8"`` they are dequantized and quantized again
per row. Other quantization methods are refused with one clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class QuantizationError(ValueError):
    """A checkpoint quantized in a way the loader does not read."""


def _quantization_config(model_dir) -> dict | None:
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # the config loader reports a missing or bad config.json
    q = config.get("quantization_config") if isinstance(config, dict) else None
    return q if isinstance(q, dict) and q else None


def block_scaling(model_dir) -> tuple[tuple[int, int], str] | None:
    """((rows, cols) of a block, the scale tensors' suffix) of a checkpoint whose FP8 weights have
    one scale per block: quant_method "fp8" with weight_block_size ("_scale_inv"), or
    compressed-tensors groups of strategy "block" with their block_structure ("_scale"); else
    None. QuantizationError for a block size that is not two positive integers, or groups that
    do not all have the same blocks."""
    q = _quantization_config(model_dir)
    method = q.get("quant_method") if q else None
    if method == "fp8":
        block = q.get("weight_block_size")  # absent or null: per-tensor scales
        blocks, suffix = ([] if block is None else [block]), "_scale_inv"
    elif method == "compressed-tensors":
        groups = [group.get("weights") or {} for group in (q.get("config_groups") or {}).values()]
        blocks = [w.get("block_structure") for w in groups if w.get("strategy") == "block"]
        suffix = "_scale"
        if blocks and len(blocks) != len(groups):
            raise QuantizationError("compressed-tensors groups mix block scales with others")
    else:
        return None
    for block in blocks:
        if not (isinstance(block, list) and len(block) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise QuantizationError(f"weight block size {block!r} is not two positive integers")
    if any(block != blocks[0] for block in blocks):
        raise QuantizationError(f"compressed-tensors groups have different blocks: {blocks}")
    return ((blocks[0][0], blocks[0][1]), suffix) if blocks else None


def check_quantization(model_dir) -> str | None:
    """The FP8 format of model_dir's config.json ("compressed-tensors" or "fp8"), None for an
    unquantized checkpoint; QuantizationError for any other quantization."""
    q = _quantization_config(model_dir)
    if not q:
        return None
    method = q.get("quant_method")
    if method == "fp8":
        block_scaling(model_dir)  # well formed, if given
        return "fp8"
    if method == "compressed-tensors":
        if q.get("format") != "float-quantized":
            raise QuantizationError(f"compressed-tensors format {q.get('format')!r} is not "
                                    "supported (only 'float-quantized', FP8 weights)")
        for name, group in (q.get("config_groups") or {}).items():
            w = group.get("weights") or {}
            if w.get("type") != "float" or w.get("num_bits") != 8:
                raise QuantizationError(f"compressed-tensors group {name!r}: only 8-bit float "
                                        "weights are supported")
            if w.get("strategy") not in ("channel", "tensor", "block"):
                raise QuantizationError(f"compressed-tensors group {name!r}: weight strategy "
                                        f"{w.get('strategy')!r} is not supported (channel, "
                                        "tensor or block)")
        block_scaling(model_dir)  # well formed, if any
        return "compressed-tensors"
    raise QuantizationError(f"quantization method {method!r} is not supported (FP8 checkpoints: "
                            "compressed-tensors float-quantized, or 'fp8')")


def stored_scheme(model_dir) -> str | None:
    """The quantize mode that runs model_dir's FP8 weights as its config asks: "fp8" where it
    quantizes the activations too (compressed-tensors ``input_activations``, or the "fp8"
    method's activation scheme), "fp8-weight-only" where it does not (no ``input_activations``
    in any group); None for an unquantized checkpoint or block scales (no per-row form).
    QuantizationError as check_quantization."""
    method = check_quantization(model_dir)
    if method is None or block_scaling(model_dir) is not None:
        return None
    if method == "fp8":
        return "fp8"
    groups = (_quantization_config(model_dir).get("config_groups") or {}).values()
    return "fp8" if any(group.get("input_activations") for group in groups) else "fp8-weight-only"


def stored_row_scales(scale: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    """A stored weight scale, (rows, 1), (rows,), (1,) or (), as float32 (rows,)."""
    if scale.numel() == rows and scale.dim() >= 1 and (scale.dim() == 1 or scale.shape[1:] == (1,)):
        s = scale.float().reshape(rows)
    elif scale.numel() == 1:
        s = scale.float().reshape(1).expand(rows)
    else:
        raise QuantizationError(f"{name}_scale has shape {list(scale.shape)}: expected one scale "
                                f"per output row ({rows}) or one for the tensor")
    if not bool(torch.isfinite(s).all()):
        raise QuantizationError(f"{name}_scale holds NaN or infinite values")
    return s


def block_scales(scale: torch.Tensor, shape, block: tuple[int, int], name: str) -> torch.Tensor:
    """A weight's block scales (ceil(out / bn), ceil(in / bk)) spread over its elements: float32
    (out, in)."""
    (rows, cols), (bn, bk) = shape, block
    want = (-(-rows // bn), -(-cols // bk))
    if tuple(scale.shape) != want:
        raise QuantizationError(f"{name}'s block scales have shape {list(scale.shape)}: "
                                f"expected {list(want)}, one per {bn} x {bk} block")
    s = scale.float()
    if not bool(torch.isfinite(s).all()):
        raise QuantizationError(f"{name}'s block scales hold NaN or infinite values")
    return s.repeat_interleave(bn, 0)[:rows].repeat_interleave(bk, 1)[:, :cols]


def dequantized(weight: torch.Tensor, scale: torch.Tensor, name: str,
                block: tuple[int, int] | None = None) -> torch.Tensor:
    """weight (out, in) FP8 times its scale: (out, 1), (out,), (1,) or (), or with ``block`` one
    per block (block_scales) -> float32 (out, in)."""
    if block is not None:
        return weight.float() * block_scales(scale, weight.shape, block, name)
    return weight.float() * stored_row_scales(scale, weight.shape[0], name)[:, None]


def stored_e4m3(ckpt, parts, cols: int):
    """(values, scales): the e4m3 weights of parts (name, rows), stacked along rows as stored,
    (sum rows, cols), and their float32 scales, one per row; None unless every part is stored in
    float8_e4m3fn with a scale per row or tensor (the loader then dequantizes, and quantizes
    again). ckpt: the loader's ``Checkpoint``."""
    if ckpt.fp8_blocks:  # block scales have no per-row form
        return None
    values, scales = [], []
    for name, rows in parts:
        if not ckpt.has(name + "_scale"):
            return None
        q = ckpt.get(name, (rows, cols), dequantize=False)
        if q.dtype != torch.float8_e4m3fn:
            return None
        if bool(((q.view(torch.uint8) & 0x7F) == 0x7F).any()):  # e4m3fn's NaN codes
            raise QuantizationError(f"tensor {name!r} holds NaN values")
        scale = ckpt.get(name + "_scale", ckpt.shape(name + "_scale"))
        values.append(q)
        scales.append(stored_row_scales(scale, rows, name))
    return torch.cat(values), torch.cat(scales).contiguous()
