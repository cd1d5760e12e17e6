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


def test_a_batched_step_reads_the_weights_once_and_every_sequences_cache(tiny):
    """The bound of a static batch: the weights' bytes once a step, the KV cache per sequence
    (keys and values of every layer, kv heads x head_dim values of the model's dtype each)."""
    from tileinfer import load_model
    from tileinfer_cli.bench_measure import bytes_per_decode_token

    model = load_model(tiny.directory("llama", dtype=torch.float32), backend="ref",
                       dtype=torch.float32)
    c = model.config
    kv_per_position = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4  # float32
    one = bytes_per_decode_token(model, 10)
    assert bytes_per_decode_token(model, 10, batch=3) - one == 2 * 10 * kv_per_position
    assert one - bytes_per_decode_token(model, 0) == 10 * kv_per_position
