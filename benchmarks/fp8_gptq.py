"""An experiment for FP8 quality: SmolLM2's linear weights rounded to e4m3 with GPTQ's error
compensation instead of to the nearest value, per-row scales kept
(``tileinfer.engine.generation.gptq.gptq_e4m3``; ``write_gptq_fp8`` writes such a checkpoint).

GPTQ (Frantar et al., 2022): the columns of a weight are rounded in order, and each column's
error is spread over the columns not rounded yet through the inverse of the layer's input
Hessian ``H = X^T X`` (damped by 1% of its mean diagonal; blocks of 128 columns), so that the
layer's outputs on inputs like X move as little as possible. Here X is each decoder linear's
input over 2,048 tokens of Genesis 11-16 (``perplexity.py``'s calibration chapters) in the bf16
model on the ref backend; with ``--hessian-inputs fp8`` each input is rounded to e4m3 per token
for its Hessian (what the FP8 product sees; the model itself runs on the unrounded inputs).
The rounded weights go back to bf16 (``fp8_error_sources.py``'s fake quantization), and the
perplexity over the first ``--tokens`` tokens of Genesis 1-10 is printed with the linear inputs
in bf16, rounded per token, or per token and 64 channels.

    python benchmarks/fp8_gptq.py --hessian-inputs fp8 --activations bf16,token
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_error_sources import LINEARS, fake_e4m3, perplexity, with_layers  # noqa: E402
from perplexity import DEFAULT_TEXT, chapter_range, chapters  # noqa: E402

from tileinfer import load_model, load_tokenizer  # noqa: E402
from tileinfer.engine.generation.gptq import gptq_e4m3  # noqa: E402
from tileinfer.io.default_model import default_model_dir  # noqa: E402

ACTIVATION_GROUPS = {"bf16": None, "token": 0, "group64": 64}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hessian-inputs", choices=["bf16", "fp8"], default="fp8")
    p.add_argument("--activations", default="bf16,token", help="comma list of bf16, token, group64")
    args = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    folder = default_model_dir()
    tokenizer = load_tokenizer(folder)
    book = chapters(DEFAULT_TEXT.read_text())

    def text(spec, n):
        return tokenizer.encode("".join(book[c] + "\n" for c in chapter_range(spec)),
                                add_special_tokens=False)[:n]

    ids, calib = text("1-10", args.tokens), text("11-16", 2048)
    base = load_model(folder, dtype=torch.bfloat16, backend="ref", device="cpu", max_len=512)
    hessians = {}
    rounding = 0 if args.hessian_inputs == "fp8" else None

    def record(x, weight):  # X^T X of each decoder linear's input (rounded as asked)
        xf = (x if rounding is None else fake_e4m3(x, rounding)).float()
        hessians[id(weight)] = hessians.get(id(weight), 0) + xf.T @ xf

    perplexity(base, calib, before=record)
    model = with_layers(base, base, [])
    for layer in model.weights.layers:
        for name in LINEARS:
            w = getattr(layer, name)
            q, scale = gptq_e4m3(w, hessians[id(w)])
            setattr(layer, name, (q.float() * scale[:, None]).to(w.dtype))
    bf16 = perplexity(base, ids)
    print(f"bf16: {bf16:.4f} ({len(ids)} tokens)", flush=True)
    for name in args.activations.split(","):
        value = perplexity(model, ids, ACTIVATION_GROUPS[name])
        print(f"weights GPTQ e4m3 per row (Hessian of {args.hessian_inputs} inputs), activations "
              f"{name}: {value:.4f} ({100 * (value / bf16 - 1):+.2f}%)", flush=True)


if __name__ == "__main__":
    main()
