"""``tileinfer bench --batch N``: a static batch on the serving engine (a tiny model, the ref
backend on the CPU): every request runs to its length, the figures are consistent with the wall
time, and the KV pool is reported."""

from __future__ import annotations

import json

import torch

from tileinfer_cli.main import main
from tiny_models import single_torch_thread, tiny  # noqa: F401


def test_bench_batch_reports_throughput_and_the_pool(tiny, capsys):
    directory = tiny.directory("llama", dtype=torch.float32)
    assert main(["bench", "--model", str(directory), "--backend", "ref", "--dtype", "fp32",
                 "--batch", "3", "--prompt-len", "4", "--new-tokens", "5", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    r = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert (r["batch"], r["prompt_len"], r["new_tokens"], r["backend"]) == (3, 4, 5, "ref")
    assert abs(r["tok_s"] - 3 * 5 / r["wall_s"]) < 1e-6 * r["tok_s"]
    assert r["decode_tok_s"] > 0 and r["pool_pages"] > 0
    assert r["pool_bytes"] > 0 and f"KV pool: {r['pool_pages']:,} pages of 16 positions" in out
