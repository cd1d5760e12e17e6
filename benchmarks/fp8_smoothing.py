"""An experiment for FP8 quality: SmoothQuant's smoothing folded into a Llama checkpoint's weights.

Per input channel j of each linear layer, s_j = amax_x[j] ** alpha / amax_w[j] ** (1 - alpha)
(amax_x: the largest |activation| of channel j on calibration text; amax_w: the largest |weight|
of column j over the layer's output rows, clamped to [0.01, 100]); the activation is divided
by s_j where it is made and the weight column multiplied by it, which leaves the bf16 model's
function as it was (up to the rounding of the new weights) and moves the activations' outliers
into the weights, where per-channel FP8 scales absorb them:

- qkv and gate_up: the preceding RMSNorm's weight / s, the columns * s;
- down (its input silu(gate) * up is linear in up): up's rows / s, down's columns * s;
- o (its input is attention's output, linear in v): v's rows / s, o's columns * s, one s per
  key-value head and channel (the largest over the query heads that share it).

Activation maxima come from transformers in float32 over the first 2,048 tokens of Genesis
11-16 (``perplexity.py``'s calibration chapters, not the evaluated ones). The result is a
model folder for ``perplexity.py --model``.

    python benchmarks/fp8_smoothing.py --alpha 0.5 OUT_FOLDER
    python benchmarks/perplexity.py --model OUT_FOLDER --configs bf16,fp8-weights,fp32
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perplexity import DEFAULT_TEXT, chapter_range, chapters  # noqa: E402


def activation_maxima(model_dir: Path, tokens: int = 2048) -> dict[str, torch.Tensor]:
    """{"{layer}.{qkv,o,gate_up,down}": the largest |input| of each channel} on calibration text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = "".join(chapters(DEFAULT_TEXT.read_text())[c] for c in chapter_range("11-16"))
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :tokens]
    maxima: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(_module, inputs):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0)
            maxima[name] = torch.maximum(maxima[name], x) if name in maxima else x
        return hook

    for i, layer in enumerate(model.model.layers):
        layer.self_attn.q_proj.register_forward_pre_hook(record(f"{i}.qkv"))
        layer.self_attn.o_proj.register_forward_pre_hook(record(f"{i}.o"))
        layer.mlp.gate_proj.register_forward_pre_hook(record(f"{i}.gate_up"))
        layer.mlp.down_proj.register_forward_pre_hook(record(f"{i}.down"))
    with torch.no_grad():
        for start in range(0, ids.shape[1], 512):
            model(ids[:, start:start + 512])
    return maxima


def smoothing(x_max: torch.Tensor, weights, alpha: float) -> torch.Tensor:
    """s (in,) for activations of maxima x_max (in,) into the weights (out_i, in)."""
    w_max = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
    s = x_max.clamp(min=1e-5) ** alpha / w_max.clamp(min=1e-5) ** (1 - alpha)
    return s.clamp(min=1e-2, max=1e2)


def smoothed(tensors: dict, config: dict, maxima: dict, alpha: float) -> dict:
    """The checkpoint's float32 tensors with the smoothing folded in (see the docstring)."""
    w = dict(tensors)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    group = heads // kv_heads
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        q, k, v, o = (p + f"self_attn.{n}_proj.weight" for n in "qkvo")
        gate, up, down = (p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down"))
        s = smoothing(maxima[f"{i}.qkv"], [w[q], w[k], w[v]], alpha)
        w[p + "input_layernorm.weight"] = w[p + "input_layernorm.weight"] / s
        for name in (q, k, v):
            w[name] = w[name] * s[None, :]
        s = smoothing(maxima[f"{i}.gate_up"], [w[gate], w[up]], alpha)
        w[p + "post_attention_layernorm.weight"] = w[p + "post_attention_layernorm.weight"] / s
        w[gate], w[up] = w[gate] * s[None, :], w[up] * s[None, :]
        s = smoothing(maxima[f"{i}.down"], [w[down]], alpha)
        w[up], w[down] = w[up] / s[:, None], w[down] * s[None, :]
        # (heads * head_dim,) -> one per key-value head and channel: (kv_heads, head_dim)
        s = smoothing(maxima[f"{i}.o"], [w[o]], alpha).reshape(kv_heads, group, head_dim).amax(1)
        w[v] = w[v] / s.reshape(-1)[:, None]
        w[o] = w[o] * s.repeat_interleave(group, 0).reshape(-1)[None, :]
    return w


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--model", type=Path, default=None,
                   help="a Llama-family folder with one model.safetensors (default: the "
                        "embedded SmolLM2-135M-Instruct)")
    p.add_argument("--alpha", type=float, default=0.5)
    args = p.parse_args()
    from tileinfer.io.default_model import default_model_dir

    src = args.model or default_model_dir()
    config = json.loads((src / "config.json").read_text())
    tensors = {k: t.float() for k, t in load_file(str(src / "model.safetensors")).items()}
    out = smoothed(tensors, config, activation_maxima(src), args.alpha)
    args.out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, args.out / f.name)
    save_file({k: t.to(torch.bfloat16).contiguous() for k, t in out.items()},
              str(args.out / "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main()
