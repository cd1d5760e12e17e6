"""Write a checkpoint folder of random weights in the shape of a Llama-family model folder: its
config and tokenizer files copied, ``model.safetensors`` filled with random bf16 values (std
0.02, norms 1) under transformers' tensor names.

For timing a new process's start-up on a machine that lacks the real weights: loading, the
warm-up and the first token cost the same whatever the values (the answer runs to its length,
as no end token comes).

    python benchmarks/random_checkpoint.py CONFIG_FOLDER OUT_FOLDER
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def random_tensors(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """transformers' names -> random bf16 tensors of a LlamaForCausalLM of ``config``."""
    gen = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads

    def w(*shape):
        return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": w(config["vocab_size"], hidden),
           "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    if not config.get("tie_word_embeddings", False):
        out["lm_head.weight"] = w(config["vocab_size"], hidden)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
        })
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("config_folder", type=Path)
    p.add_argument("out_folder", type=Path)
    args = p.parse_args()
    config = json.loads((args.config_folder / "config.json").read_text())
    args.out_folder.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (args.config_folder / name).exists():
            shutil.copy(args.config_folder / name, args.out_folder / name)
    save_file(random_tensors(config), str(args.out_folder / "model.safetensors"),
              metadata={"format": "pt"})


if __name__ == "__main__":
    main()
