"""An experiment for FP8 quality: after GPTQ, tune the RMSNorm weights so that the W8A8 model's
outputs follow the bf16 model's (norm tweaking: Li et al., "Norm Tweaking: High-performance
Low-bit Quantization of Large Language Models", AAAI 2024).

With GPTQ-rounded e4m3 weights most of SmolLM2's FP8 perplexity cost is the activations'
rounding to e4m3 per token (benchmarks/RESULTS.md): noise that no weight rounding removes, but
part of what it does to a layer's output may be systematic (scales a norm's gain can correct).
Here the norms' gains (two a layer and the final one) are trained by gradient descent, as
relative changes, to minimize KL(bf16 model || W8A8 model) over the calibration text, with the
FP8 model in plain PyTorch (float32, its weights the GPTQ checkpoint's dequantized values, each
decoder linear's input rounded to e4m3 per token and back, gradients straight through the
rounding).

    tileinfer quantize --fp8 --calibration CALIB.txt --tokens 2048 GPTQ_DIR
    python benchmarks/fp8_norm_tweak.py GPTQ_DIR OUT_DIR --steps 40
    python benchmarks/perplexity.py --model OUT_DIR --configs bf16,fp8-weights

OUT_DIR is GPTQ_DIR with its norm weights replaced. The calibration text is Genesis 11-16
(``perplexity.py``'s calibration chapters), disjoint from its evaluation text (Genesis 1-10).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perplexity import DEFAULT_TEXT, chapter_range, chapters  # noqa: E402

from tileinfer import load_model, load_tokenizer  # noqa: E402
from tileinfer.io.default_model import default_model_dir  # noqa: E402
from tileinfer.model.rope import rope_tables  # noqa: E402


def fake_e4m3_rows(x: torch.Tensor) -> torch.Tensor:
    """x (tokens, k) float32 rounded to e4m3 with one scale per row (max|x| / 448) and back; the
    gradient passes straight through."""
    scale = (x.detach().abs().amax(-1, keepdim=True) / 448).clamp_min(1e-30)
    q = (x.detach() / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale
    return x + (q - x).detach()


class TorchLlama:
    """A Llama-family decoder (SwiGLU, no q/k norm) in plain float32 PyTorch over a tileinfer
    model's weights (dequantized), with the norms' gains as trainable parameters."""

    def __init__(self, model, fp8_inputs: bool):
        c = self.config = model.config
        w = model.weights
        f = lambda t: t.detach().float().clone()  # noqa: E731
        self.embed, self.lm_head = f(w.embed), f(w.lm_head)
        self.layers = [dict(qkv=f(layer.qkv), o=f(layer.o), up=f(layer.up), down=f(layer.down))
                       for layer in w.layers]
        # Each gain as its loaded value times (1 + a trained relative change).
        self.gains = [f(t) for layer in w.layers for t in (layer.attn_norm, layer.mlp_norm)]
        self.gains.append(f(w.norm))
        self.changes = [torch.nn.Parameter(torch.zeros_like(g)) for g in self.gains]
        self.fp8_inputs = fp8_inputs
        cos, sin = rope_tables(c, 4096, torch.float32)
        self.cos, self.sin = cos, sin

    def _linear(self, x, weight):
        return (fake_e4m3_rows(x) if self.fp8_inputs else x) @ weight.T

    def _norm(self, x, gain):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps) * gain

    def _rope(self, x, n):  # x (tokens, heads, head_dim): rotate halves, as transformers
        cos, sin = self.cos[:n, None, :], self.sin[:n, None, :]
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        norms = [g * (1 + d) for g, d in zip(self.gains, self.changes)]
        c = self.config
        n = ids.shape[0]
        h = self.embed[ids]
        for i, layer in enumerate(self.layers):
            x = self._norm(h, norms[2 * i])
            q, k, v = self._linear(x, layer["qkv"]).split([c.q_size, c.kv_size, c.kv_size], -1)
            q = self._rope(q.view(n, c.num_heads, c.head_dim), n)
            k = self._rope(k.view(n, c.num_kv_heads, c.head_dim), n)
            v = v.view(n, c.num_kv_heads, c.head_dim)
            group = c.num_heads // c.num_kv_heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                                 v.transpose(0, 1), is_causal=True)
            h = h + self._linear(att.transpose(0, 1).reshape(n, -1), layer["o"])
            x = self._norm(h, norms[2 * i + 1])
            gate, up = self._linear(x, layer["up"]).chunk(2, -1)
            h = h + self._linear(F.silu(gate) * up, layer["down"])
        return self._norm(h, norms[-1]) @ self.lm_head.T


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gptq_dir", type=Path, help="a checkpoint of `tileinfer quantize --fp8`")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--tokens", type=int, default=2048, help="calibration tokens")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-4)
    args = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    folder = default_model_dir()
    tokenizer = load_tokenizer(folder)
    book = chapters(DEFAULT_TEXT.read_text())
    text = "".join(book[c] + "\n" for c in chapter_range("11-16"))
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False)[: args.tokens])
    windows = [ids[s:s + args.window] for s in range(0, len(ids) - 1, args.window)]

    teacher_model = load_model(folder, dtype=torch.bfloat16, backend="ref", device="cpu")
    student_model = load_model(args.gptq_dir, dtype=torch.bfloat16, backend="ref", device="cpu")
    teacher = TorchLlama(teacher_model, fp8_inputs=False)
    student = TorchLlama(student_model, fp8_inputs=True)
    with torch.no_grad():
        targets = [F.log_softmax(teacher.logits(w), -1) for w in windows]
    nll = torch.cat([-t[:-1].gather(1, w[1:, None]) for w, t in zip(windows, targets)])
    print(f"the bf16 model's perplexity on the calibration text (this forward): "
          f"{nll.mean().exp().item():.4f}", flush=True)

    def kl(window, target):
        return F.kl_div(F.log_softmax(student.logits(window), -1), target, log_target=True,
                        reduction="batchmean")

    with torch.no_grad():
        before = sum(kl(w, t).item() for w, t in zip(windows, targets)) / len(windows)
    print(f"KL(bf16 || W8A8) on the calibration text before: {before:.5f}", flush=True)
    optimizer = torch.optim.Adam(student.changes, lr=args.lr)
    start = time.perf_counter()
    for step in range(args.steps):
        window, target = windows[step % len(windows)], targets[step % len(windows)]
        loss = kl(window, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step + 1}: KL {loss.item():.5f} ({time.perf_counter() - start:.0f} s)",
              flush=True)
    with torch.no_grad():
        after = sum(kl(w, t).item() for w, t in zip(windows, targets)) / len(windows)
    print(f"KL(bf16 || W8A8) on the calibration text after: {after:.5f}", flush=True)

    from safetensors.torch import load_file, save_file
    if args.out_dir.exists():
        shutil.rmtree(args.out_dir)
    shutil.copytree(args.gptq_dir, args.out_dir)
    path = args.out_dir / "model.safetensors"
    tensors = load_file(path)
    names = [f"model.layers.{i}.{n}.weight" for i in range(len(student.layers))
             for n in ("input_layernorm", "post_attention_layernorm")] + ["model.norm.weight"]
    for name, gain, change in zip(names, student.gains, student.changes):
        tensors[name] = (gain * (1 + change.detach())).to(tensors[name].dtype)
    save_file(tensors, path, metadata={"format": "pt"})
    print(f"wrote {args.out_dir}")


if __name__ == "__main__":
    main()
