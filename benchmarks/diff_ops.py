"""Find the first op where a backend departs from ref inside a real model's forward pass.

Every op call of the backend is mirrored: the ref op runs on copies of the same inputs, and the
outputs are compared (bf16 tolerance). Prints one JSON line per op kind with its worst error and
the first call that exceeded the tolerance.

    python benchmarks/diff_ops.py --backend cuda --model PATH     (a model folder or .gguf)
    python benchmarks/diff_ops.py --backend cuda --shape smollm2  (random weights of that shape)
"""

from __future__ import annotations

import argparse
import json

import torch

from tileinfer import forward, get_backend, load_model
from tileinfer.backend.registry import OP_NAMES, OpTable
from tileinfer.model.random_weights import random_model
from tileinfer.model.config import config_from_dict
from tileinfer.engine.cache import new_cache

SMOLLM2 = dict(model_type="llama", num_hidden_layers=4, hidden_size=576, num_attention_heads=9,
               num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
               rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
               tie_word_embeddings=True, eos_token_id=2)
# Arguments each op writes (the rest are inputs).
WRITES = {"add_rmsnorm": ("residual", "out"), "store_kv": ("k_cache", "v_cache", "k_scale", "v_scale"),
          "attention_inputs": ("q_out", "k_cache", "v_cache", "k_scale", "v_scale")}
SKIP = {"attention_workspace"}


def mirrored(table: OpTable, ref: OpTable, report: dict) -> OpTable:
    import inspect

    from tileinfer.backend import hookspecs

    ops = {}
    for name in OP_NAMES:
        fn, ref_fn = getattr(table, name), getattr(ref, name)
        if name in SKIP:
            ops[name] = fn
            continue
        params = list(inspect.signature(getattr(hookspecs, name)).parameters)
        writes = WRITES.get(name, ("out",))

        def call(*args, _fn=fn, _ref=ref_fn, _name=name, _params=params, _writes=writes):
            copies = [a.clone() if torch.is_tensor(a) else a for a in args]
            if _name == "attention":
                copies[-1] = None  # ref needs no workspace
            _fn(*args)
            _ref(*copies)
            entry = report.setdefault(_name, {"calls": 0, "max_err": 0.0, "first_bad": None})
            entry["calls"] += 1
            for i, p in enumerate(_params):
                if p in _writes and torch.is_tensor(args[i]) and args[i].dtype.is_floating_point:
                    a, e = args[i].float(), copies[i].float()
                    err = float((a - e).abs().max()) if a.numel() else 0.0
                    bad = (a - e).abs() > 2e-2 + 2e-2 * e.abs()
                    entry["max_err"] = max(entry["max_err"], err)
                    if bad.any() and entry["first_bad"] is None:
                        entry["first_bad"] = {"call": entry["calls"], "arg": p,
                                              "shape": list(a.shape), "err": err,
                                              "bad": int(bad.sum())}
            return None
        ops[name] = call
    return OpTable(table.backend, ops, table.fallbacks)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="cuda")
    p.add_argument("--model")
    p.add_argument("--shape", default="smollm2")
    p.add_argument("--prompt-len", type=int, default=37)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    if args.model:
        path = args.model
        if path.endswith(".gguf"):
            from tileinfer import import_gguf
            path = import_gguf(path)
        model = load_model(path, backend=args.backend, max_len=4096, device=args.device)
    else:
        model = random_model(config_from_dict(SMOLLM2), backend=args.backend,
                             device=args.device, max_len=4096)
    report: dict = {}
    model.ops = mirrored(model.ops, get_backend("ref"), report)
    cache = new_cache(model, 512)
    seq = cache.new_sequence()
    ids = torch.randint(0, model.config.vocab_size, (args.prompt_len,)).tolist()
    logits = forward(model, cache, seq, ids)
    for _ in range(args.steps):
        logits = forward(model, cache, seq, [int(logits[-1].argmax())])
    for name, entry in report.items():
        print(json.dumps({"op": name, **entry}))


if __name__ == "__main__":
    main()
