"""Where SmolLM2's FP8 perplexity goes: the weights' rounding against the activations', per-row
scales against scales per group of 64 input channels, and which layers matter most.

The embedded SmolLM2-135M-Instruct on the ref backend (CPU, bf16), perplexity over the first
``--tokens`` tokens of ``perplexity.py``'s evaluation text (windows of 512), for:

- ``fp8``: the model of ``quantize="fp8"`` (e4m3 weights per output row, inputs per token);
- ``fp8 except NAME`` / ``except layer i``: the same with those weights back in bf16;
- ``weights ... activations ...``: the bf16 model with its linear weights rounded to e4m3 and
  back (per row, or per group of 64 input channels), and/or each linear input rounded to e4m3
  and back (per token, or per token and group of 64 channels), the LM head left out.

Rounding and back ("fake quantization") computes what an FP8 kernel with those scales would,
up to the order of the float32 sums.

    python benchmarks/fp8_error_sources.py --tokens 4096
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perplexity import (DEFAULT_TEXT, chapter_range, chapters,  # noqa: E402
                        window_log_probs, windows)

import tileinfer_backend_ref  # noqa: E402
from tileinfer import load_model, load_tokenizer  # noqa: E402
from tileinfer.engine.kv.cache import new_cache  # noqa: E402
from tileinfer.io.default_model import default_model_dir  # noqa: E402

LINEARS = ("qkv", "o", "up", "down")  # LayerWeights' names (up: gate rows over up rows)


def fake_e4m3(t: torch.Tensor, group: int) -> torch.Tensor:
    """t (rows, k) rounded to e4m3 with one scale per row (group 0) or per group of ``group``
    columns, and back, in t's dtype."""
    rows, k = t.shape
    g = t.float().reshape(rows, k // group if group else 1, group or k)
    scale = (g.abs().amax(-1, keepdim=True) / 448).clamp_min(1e-30)
    q = (g / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale
    return q.reshape(rows, k).to(t.dtype)


def with_layers(model, source, pairs):
    """A shallow copy of model whose (layer, name) weights in pairs are source's."""
    m = copy.copy(model)
    m.weights = copy.copy(model.weights)
    m.weights.layers = [copy.copy(layer) for layer in model.weights.layers]
    for i, name in pairs:
        setattr(m.weights.layers[i], name, getattr(source.weights.layers[i], name))
    return m


def with_rounded_weights(model, group):
    m = with_layers(model, model, [])
    for layer in m.weights.layers:
        for name in LINEARS:
            setattr(layer, name, fake_e4m3(getattr(layer, name), group))
    return m


def perplexity(model, ids, act_group=None, before=None) -> float:
    """model's perplexity over ids (windows of 512) on the ref backend. act_group: each decoder
    linear's input rounded to e4m3 and back first (0: per token, n: per token and n channels;
    None: not). before(x, weight): called with each decoder linear's input, unrounded."""
    vocab = model.config.vocab_size
    matmul = tileinfer_backend_ref.matmul

    def product(x, weight, weight_scale, out_dtype=None):
        if weight.shape[0] != vocab:  # not the LM head
            if before is not None:
                before(x, weight)
            if act_group is not None:
                x = fake_e4m3(x, act_group)
        return matmul(x, weight, weight_scale, out_dtype)

    tileinfer_backend_ref.matmul = product
    try:
        cache = new_cache(model, 512, page_size=16)
        nll, n = 0.0, 0
        with torch.no_grad():
            for begin, end, first in windows(len(ids), 512, 512):
                lp = window_log_probs(model, cache, ids, begin, end, first)
                nll -= lp.gather(1, torch.tensor(ids[first:end])[:, None]).sum().item()
                n += end - first
        return math.exp(nll / n)
    finally:
        tileinfer_backend_ref.matmul = matmul


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    args = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    folder = default_model_dir()
    tokenizer = load_tokenizer(folder)
    book = chapters(DEFAULT_TEXT.read_text())
    ids = tokenizer.encode("".join(book[c] + "\n" for c in chapter_range("1-10")),
                           add_special_tokens=False)[:args.tokens]
    load = dict(dtype=torch.bfloat16, backend="ref", device="cpu", max_len=512)
    base = load_model(folder, **load)
    fp8 = load_model(folder, quantize="fp8", **load)
    bf16 = perplexity(base, ids)
    print(f"bf16: {bf16:.4f} ({len(ids)} tokens)", flush=True)

    def show(name, value):
        print(f"{name}: {value:.4f} ({100 * (value / bf16 - 1):+.2f}%)", flush=True)

    show("fp8", perplexity(fp8, ids))
    layers = len(base.weights.layers)
    for name in LINEARS:
        show(f"fp8 except {name}", perplexity(with_layers(fp8, base, [(i, name) for i in
                                                                      range(layers)]), ids))
    for i in (0, 1, layers - 2, layers - 1):
        show(f"fp8 except layer {i}",
             perplexity(with_layers(fp8, base, [(i, n) for n in LINEARS]), ids))
    for w_group in (None, 0, 64):
        model = base if w_group is None else with_rounded_weights(base, w_group)
        for a_group in (None, 0, 64):
            if w_group is None and a_group is None:
                continue
            weights = {None: "bf16", 0: "per row", 64: "group 64"}[w_group]
            activations = {None: "bf16", 0: "per token", 64: "group 64"}[a_group]
            show(f"weights {weights}, activations {activations}", perplexity(model, ids, a_group))


if __name__ == "__main__":
    main()
