"""FP8 checkpoints whose weights are rounded with GPTQ's error compensation.

``quantize="fp8"`` rounds each weight to the nearest e4m3 value (times its row's scale). GPTQ
(Frantar et al., 2022) rounds the columns of a weight W (out, in) one after another and spreads
each column's rounding error over the columns not rounded yet, weighted by the inverse of the
layer's input Hessian ``H = X^T X`` (X: the layer's inputs on calibration text), so that the
layer's outputs ``X W^T`` on such inputs move as little as possible. With the upper Cholesky
factor U of ``H^-1`` (H damped by a fraction of its mean diagonal):

    for each column i:  q_i = round(w_i);  e = (w_i - q_i) / U[i, i];  w_j -= e * U[i, j] (j > i)

done in blocks of columns (the updates of a block reach the later columns in one product). The
scales stay those of nearest rounding (``max|W[r]| / 448`` per row), so the result is an
ordinary per-channel FP8 checkpoint. X is each decoder linear's input as the FP8 product sees
it: quantized per token (``tileinfer.backend.fp8``), or as it is for a weight-only checkpoint
(``quantize="fp8-weight-only"`` leaves the activations unrounded).

``write_gptq_fp8`` writes it in the compressed-tensors format that ``load_model`` reads (FP8
weights with per-row scales, activations quantized per token at run time, the LM head kept).
benchmarks/RESULTS.md has what it does to SmolLM2's perplexity.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import torch

from ...backend.fp8 import E4M3, E4M3_MAX, quantize_rows, row_scales
from ...io.import_staging import staging_dir
from ...model.tensor_names import fused_parts, layer_tensor_names
from ..kv.cache import new_cache
from .forward import forward

LINEAR_ROLES = ("qkv", "o", "up", "down")  # LayerWeights' names


def gptq_e4m3(weight: torch.Tensor, hessian: torch.Tensor, damp: float = 0.01,
              block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (out, in) e4m3, scales (out,) float32) of weight rounded with GPTQ's error
    compensation under hessian (in, in), so that ``weight ~= values * scales[:, None]``."""
    w = weight.float().clone()
    k = w.shape[1]
    scale = row_scales(w)  # nearest rounding's: max|W[r]| / 448
    h = hessian.float().clone()
    dead = torch.diag(h) == 0  # inputs that never reached the layer: any value will do
    h[dead, dead] = 1
    w[:, dead] = 0
    h += damp * torch.mean(torch.diag(h)) * torch.eye(k)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.empty(w.shape, dtype=E4M3)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        part, errors = w[:, b0:b1].clone(), torch.empty(w.shape[0], b1 - b0)
        for i in range(b1 - b0):
            col = part[:, i]
            q[:, b0 + i] = torch.clamp(col / scale, -E4M3_MAX, E4M3_MAX).to(E4M3)
            errors[:, i] = (col - q[:, b0 + i].float() * scale) / u[b0 + i, b0 + i]
            part[:, i:] -= errors[:, i:i + 1] * u[b0 + i, b0 + i:b1][None, :]
        w[:, b1:] -= errors @ u[b0:b1, b1:]
    return q, scale


class _RecordingOps:
    """An op table that adds each recorded linear's input (quantized per token, as the FP8
    product sees it, unless weight_only) to its Hessian before running the op."""

    def __init__(self, ops, hessians: dict, weight_only: bool = False):
        self._ops, self._hessians, self._weight_only = ops, hessians, weight_only

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def _record(self, x, weight):
        h = self._hessians.get(id(weight))
        if h is not None:
            if self._weight_only:
                xf = x.float().cpu()
            else:
                q, scale = quantize_rows(x)
                xf = (q.float() * scale[:, None]).cpu()
            h += xf.T @ xf

    def linear(self, out, x, weight, weight_scale, *args):
        self._record(x, weight)
        return self._ops.linear(out, x, weight, weight_scale, *args)

    def linear_swiglu(self, out, x, weight, weight_scale, *args):
        self._record(x, weight)
        return self._ops.linear_swiglu(out, x, weight, weight_scale, *args)

    def linear_xielu(self, out, x, weight, weight_scale, *args):
        self._record(x, weight)
        return self._ops.linear_xielu(out, x, weight, weight_scale, *args)


def input_hessians(model, token_ids: list[int], window: int = 512,
                   weight_only: bool = False) -> list[dict]:
    """Per layer, {role: X^T X (in, in) float32} of each decoder linear's inputs over token_ids
    (windows of ``window`` tokens), as the FP8 product quantizes them (weight_only: as they
    are). model: unquantized."""
    hessians = {}
    per_layer = []
    for layer in model.weights.layers:
        roles = {}
        for role in LINEAR_ROLES:
            w = getattr(layer, role)
            roles[role] = hessians[id(w)] = torch.zeros(w.shape[1], w.shape[1])
        per_layer.append(roles)
    recording = copy.copy(model)
    recording.ops = _RecordingOps(model.ops, hessians, weight_only)
    window = min(window, model.max_len)
    cache = new_cache(model, window)
    with torch.no_grad():
        for start in range(0, len(token_ids), window):
            seq = cache.new_sequence()
            try:
                forward(recording, cache, seq, token_ids[start:start + window])
            finally:
                cache.release(seq)
    return per_layer


def write_gptq_fp8(model, out_dir, calibration_ids: list[int], damp: float = 0.01,
                   weight_only: bool = False) -> Path:
    """Write model (loaded unquantized from its folder) as a compressed-tensors FP8 checkpoint in
    out_dir: every decoder linear rounded by ``gptq_e4m3`` under its inputs' Hessian over
    calibration_ids, every other tensor and file as in the model's folder. weight_only: the
    Hessians of the unrounded inputs, and a config without activation quantization (FP8
    weights, 16-bit activations: for ``quantize="fp8-weight-only"``). Returns out_dir.

    Written whole or not at all: into a hidden staging folder beside out_dir (the one imports
    use), renamed onto out_dir (absent, or an empty folder) once complete; on an error nothing
    is left behind."""
    from safetensors.torch import load_file, save_file

    if model.quantize is not None:
        raise ValueError("write_gptq_fp8 needs a model loaded without quantize")
    src, out = Path(model.model_dir), Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    c = model.config
    names = layer_tensor_names(c)
    parts = {**fused_parts(c), "o": [("o", c.hidden_size)], "down": [("down", c.hidden_size)]}
    tensors = {}
    for path in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(path))
    for i, (layer, hessians) in enumerate(zip(model.weights.layers,
                                              input_hessians(model, calibration_ids,
                                                             weight_only=weight_only))):
        for role in LINEAR_ROLES:
            q, scale = gptq_e4m3(getattr(layer, role).cpu(), hessians[role], damp)
            row = 0
            for part, rows in parts[role]:
                name = f"model.layers.{i}.{names[part]}"
                tensors[name] = q[row:row + rows].contiguous()
                tensors[name + "_scale"] = scale[row:row + rows, None].contiguous()
                row += rows
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(out)
    try:
        staging.mkdir()
        _write(src, staging, tensors, save_file, weight_only)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _write(src: Path, out: Path, tensors: dict, save_file, weight_only: bool):
    """The checkpoint's files in out: the folder's other files, the tensors, config.json with
    its quantization_config (no input_activations when weight_only)."""
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and not path.name.endswith(
                ".safetensors.index.json"):
            shutil.copy2(path, out / path.name)
    save_file(tensors, out / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                        "symmetric": True, "dynamic": False, "observer": "gptq"},
            "input_activations": None if weight_only else {
                "num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
                "symmetric": True}}}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
