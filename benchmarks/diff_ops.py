"""Find the first op where a backend departs from ref inside a real model's forward pass.

Every op call of the backend is mirrored: the ref op runs on copies of the same inputs, and the
outputs are compared (bf16 tolerance). Prints one JSON line per op kind with its worst error and
the first call that exceeded the tolerance.

    python benchmarks/diff_ops.py --backend cuda --model PATH     (a model folder or .gguf)
    python benchmarks/diff_ops.py --backend cuda --shape smollm2  (random weights of that shape)
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json

import torch
from tileinfer import config_from_dict, forward, get_backend, load_model, new_cache
from tileinfer.backend import hookspecs
from tileinfer.backend.registry import OP_NAMES, OpTable
from tileinfer.backend.types import LayerKV
from tileinfer.model.random_weights import random_model

SMOLLM2 = dict(model_type="llama", num_hidden_layers=4, hidden_size=576, num_attention_heads=9,
               num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
               rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
               tie_word_embeddings=True, eos_token_id=2)
# Arguments each op writes (the rest are inputs); a LayerKV's tensors are compared one by one.
WRITES = {"add_rmsnorm": ("residual", "out"), "attention_inputs": ("q_out", "kv"),
          "attention_with_inputs": ("out", "kv")}
SKIP = {"attention_workspace", "reserve_scratch"}


def _clone(value):
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, LayerKV):
        return dataclasses.replace(value, **{f.name: _clone(getattr(value, f.name))
                                             for f in dataclasses.fields(value)})
    return value


def _written(value) -> dict:
    """name -> floating tensor of an argument an op writes."""
    if isinstance(value, LayerKV):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                if torch.is_tensor(getattr(value, f.name))
                and getattr(value, f.name).dtype.is_floating_point}
    return {"": value} if torch.is_tensor(value) and value.dtype.is_floating_point else {}


def _ref_call(ref: OpTable, name: str):
    """ref's version of an op; ref leaves out the optional fused attention: its two ops."""
    if name != "attention_with_inputs":
        return getattr(ref, name)

    def fused(out, q_out, kv, qkv, qk, step, scale, causal, workspace):
        ref.attention_inputs(q_out, kv, qkv, qk, step)
        ref.attention(out, q_out, kv, step, scale, causal, None)
    return fused


def mirrored(table: OpTable, ref: OpTable, report: dict) -> OpTable:
    ops = {}
    for name in OP_NAMES:
        fn = getattr(table, name)
        if name in SKIP or fn is None:
            ops[name] = fn
            continue
        params = list(inspect.signature(getattr(hookspecs, name)).parameters)
        writes = WRITES.get(name, ("out",))

        def call(*args, _fn=fn, _ref=_ref_call(ref, name), _name=name, _params=params,
                 _writes=writes):
            copies = [_clone(a) for a in args]
            if _name in ("attention", "attention_with_inputs"):
                copies[-1] = None  # ref needs no workspace
            _fn(*args)
            _ref(*copies)
            entry = report.setdefault(_name, {"calls": 0, "max_err": 0.0, "first_bad": None})
            entry["calls"] += 1
            for i, p in enumerate(_params):
                if p not in _writes:
                    continue
                mine, theirs = _written(args[i]), _written(copies[i])
                for field, a in mine.items():
                    a, e = a.float(), theirs[field].float()
                    err = float((a - e).abs().max()) if a.numel() else 0.0
                    bad = (a - e).abs() > 2e-2 + 2e-2 * e.abs()
                    entry["max_err"] = max(entry["max_err"], err)
                    if bad.any() and entry["first_bad"] is None:
                        entry["first_bad"] = {"call": entry["calls"], "arg": f"{p}.{field}".strip("."),
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
