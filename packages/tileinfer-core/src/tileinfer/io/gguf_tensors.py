"""The tensors of a GGUF file as the HF model's parameters: renamed, dequantized with the ``gguf``
package, llama's q/k rows put back in transformers' order, and checked against the shapes the
config describes."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from .gguf_reader import GGUFImportError

TESTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


class GGUFImportWarning(UserWarning):
    """Something in the file that the import went on with but that may not be what was meant."""


# GGUF tensor name (after "blk.N.") -> HF llama parameter name (after "model.layers.N.").
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",  # qwen2
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # qwen3
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# phi3 stores the projections transformers' Phi3 fuses as they are fused there.
_PHI3_TENSORS = {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}
# gemma3's norms around attention and the MLP (its ffn_norm is the MLP's input norm).
_GEMMA3_TENSORS = {"post_attention_norm.weight": "post_attention_layernorm.weight",
                   "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                   "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
_EXTRA_TENSORS = {"phi3": _PHI3_TENSORS, "gemma3_text": _GEMMA3_TENSORS}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

def _hf_name(gguf_name: str, model_type: str) -> str | None:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    layer_tensors = _LAYER_TENSORS | _EXTRA_TENSORS.get(model_type, {})
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_tensors:
        return f"model.layers.{parts[1]}.{layer_tensors[parts[2]]}"
    return None


def dequantized(tensor, path: Path) -> np.ndarray:
    """float32 array in PyTorch's (out, in) order (GGUF lists dims innermost first)."""
    qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
    try:
        values = dequantize(tensor.data, qtype)
    except NotImplementedError as e:
        raise GGUFImportError(
            f"{path}: tensor {tensor.name} has type {qtype.name}, which cannot be dequantized "
            f"(supported: the float and quantized types of the gguf package, e.g. {', '.join(TESTED_TENSOR_TYPES)})"
        ) from e
    except Exception as e:  # data cut short by a truncated file, and the like
        raise GGUFImportError(f"{path}: cannot read tensor {tensor.name} ({type(e).__name__}: {e})") from e
    shape = tuple(int(d) for d in reversed(tensor.shape))
    if values.size != math.prod(shape):
        raise GGUFImportError(f"{path}: tensor {tensor.name} holds {values.size} values, expected shape {shape}")
    return values.reshape(shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's RoPE row order of a q or k projection (out, in)."""
    out, inp = w.shape
    head_dim = out // n_head
    return w.reshape(n_head, head_dim // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def read_weights(reader, path: Path, config: dict, dtype: torch.dtype, bar=None) -> dict[str, torch.Tensor]:
    tensors = {}
    for t in reader.tensors:
        if bar is not None:
            bar.update(int(t.n_bytes))
        if t.name == "rope_freqs.weight":
            continue  # folded into config.rope_scaling
        if t.name.startswith("rope_factors_"):
            raise GGUFImportError(f"{path}: {t.name}: LongRoPE scaling (Phi-3.5, the 128k Phi-3 models) is "
                                  "not supported")
        name = _hf_name(t.name, config["model_type"])
        if name is None:
            raise GGUFImportError(f"{path}: unexpected tensor {t.name} for a "
                                  f"{config['model_type']} model")
        w = dequantized(t, path)
        if config["model_type"] == "llama" and name.endswith("q_proj.weight"):
            w = unpermute_qk(w, config["num_attention_heads"])
        elif config["model_type"] == "llama" and name.endswith("k_proj.weight"):
            w = unpermute_qk(w, config["num_key_value_heads"])
        elif config["model_type"] == "gemma3_text" and name.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp stores Gemma's norms as 1 + w, transformers as w
        if not w.flags.writeable:  # F32 tensors are read-only views of the memory-mapped file
            w = w.copy()
        if not np.issubdtype(w.dtype, np.floating):
            warnings.warn(f"{path.name}: tensor {t.name} holds {w.dtype} integers, not weights of "
                          f"a float or quantized type; cast to {str(dtype).removeprefix('torch.')}",
                          GGUFImportWarning, stacklevel=2)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(w)).to(dtype)
    return tensors


def check_shapes(tensors: dict, config: dict, path: Path) -> None:
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    q_out = config["num_attention_heads"] * config["head_dim"]
    kv_out = config["num_key_value_heads"] * config["head_dim"]
    ffn = config["intermediate_size"]
    expected = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        expected["lm_head.weight"] = (config["vocab_size"], hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        expected |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.o_proj.weight": (hidden, q_out),
            p + "mlp.down_proj.weight": (hidden, ffn),
        }
        if config["model_type"] == "gemma3_text":
            expected |= {p + "pre_feedforward_layernorm.weight": (hidden,),
                         p + "post_feedforward_layernorm.weight": (hidden,)}
        if config["model_type"] == "phi3":
            expected |= {p + "self_attn.qkv_proj.weight": (q_out + 2 * kv_out, hidden),
                         p + "mlp.gate_up_proj.weight": (2 * ffn, hidden)}
        else:
            expected |= {p + "self_attn.q_proj.weight": (q_out, hidden), p + "self_attn.k_proj.weight": (kv_out, hidden),
                         p + "self_attn.v_proj.weight": (kv_out, hidden), p + "mlp.gate_proj.weight": (ffn, hidden),
                         p + "mlp.up_proj.weight": (ffn, hidden)}
        if config["model_type"] == "qwen2":
            expected |= {p + "self_attn.q_proj.bias": (q_out,), p + "self_attn.k_proj.bias": (kv_out,),
                         p + "self_attn.v_proj.bias": (kv_out,)}
        elif config["model_type"] in ("qwen3", "gemma3_text"):
            expected |= {p + "self_attn.q_norm.weight": (config["head_dim"],),
                         p + "self_attn.k_norm.weight": (config["head_dim"],)}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise GGUFImportError(f"{path}: tensors missing for the model the metadata describes: {missing[:4]}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise GGUFImportError(f"{path}: tensors that the {config['model_type']} model of {layers} layers the "
                              f"metadata describes does not have: {extra[:4]}")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise GGUFImportError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
