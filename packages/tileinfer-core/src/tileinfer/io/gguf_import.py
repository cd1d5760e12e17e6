"""Import a llama.cpp GGUF file as an HF-style model folder that the rest of TileInfer loads.

The ``gguf`` package (llama.cpp's own reader) reads the file and dequantizes its tensors. Three
of llama.cpp's architectures are read: ``llama``, ``qwen2`` (Qwen2, Qwen2.5: the same tensors
plus the q/k/v biases) and ``qwen3`` (plus the per-head q/k norms). The folder gets config.json
(the model_type of the same name, from the GGUF metadata), model.safetensors (bf16 by default), tokenizer.json (built with ``tokenizers`` from
the GGUF vocabulary, merges and token types), tokenizer_config.json (chat template, BOS/EOS),
generation_config.json and import.json (where it came from, its license, name and tensor types,
and the importer version, so a stale import can be redone).

An import writes into a hidden staging folder ``.NAME.importing-PID`` beside the target and
renames it into place when complete. One that was killed (SIGKILL, a power cut) leaves that
folder behind; the next import into the same models home, and ``tileinfer rm``, remove every
staging folder whose process is gone (``clean_interrupted_imports``). A progress bar on standard
error (tqdm; shown when it is a terminal, or with ``progress=True``) follows the import: reading
the metadata, converting the tensors, writing the folder.

llama.cpp stores a llama model's q and k projections with the rows of each head reordered for its
RoPE (``permute`` in llama.cpp's convert_hf_to_gguf.py: ``(heads, 2, head_dim/2, in)`` swapped to
``(heads, head_dim/2, 2, in)``); the import swaps them back, with n_head = kv heads for k. Qwen
models' are stored as in transformers (their RoPE pairs the halves of a head, as transformers
does).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import threading
import warnings
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm import tqdm

from .gguf_reader import GGUFImportError, GGUFMetadata, open_gguf, source_summary
from .gguf_tokenizer import build_tokenizer, generation_config_from
from .import_record import IMPORTER_VERSION, is_current_import  # noqa: F401
from .import_room import check_room, output_bytes
from .import_staging import clean_interrupted_imports, staging_dir
from .paths import models_home

# Bump when the importer's output changes, so cached imports are redone.

TESTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
# general.architecture -> (config.json's model_type, its architectures entry)
ARCHITECTURES = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
                 "qwen3": ("qwen3", "Qwen3ForCausalLM")}


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
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# --- config ------------------------------------------------------------------------------------


def _llama3_rope_factors(head_dim, theta, factor, low_freq_factor, high_freq_factor, original_max_positions):
    """The per-frequency divisors llama.cpp stores as rope_freqs.weight for llama3 RoPE scaling
    (convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    low_freq_wavelen = original_max_positions / low_freq_factor
    high_freq_wavelen = original_max_positions / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1.0)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def _rope_scaling(meta: GGUFMetadata, arch: str, head_dim: int, theta: float, rope_freqs: np.ndarray | None):
    kind = meta.get(f"{arch}.rope.scaling.type")
    if rope_freqs is not None:
        # llama3 scaling leaves only the divisors in the file. Llama 3.1-3.3 all use low/high
        # frequency factors 1 and 4 over 8192 original positions; take the factor from the divisors
        # and accept only if the recomputed divisors match the file's.
        params = {
            "factor": float(rope_freqs.max()),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
        expected = _llama3_rope_factors(head_dim, theta, *params.values())
        if expected.shape != rope_freqs.shape or not np.allclose(expected, rope_freqs, rtol=1e-3):
            raise GGUFImportError(
                f"{meta.path}: rope_freqs.weight holds RoPE scaling factors that are not Llama 3's "
                "(low/high frequency factors 1 and 4 over 8192 positions); not supported"
            )
        return {"rope_type": "llama3", **params}
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta.require(f"{arch}.rope.scaling.factor"))}
    raise GGUFImportError(f"{meta.path}: RoPE scaling {kind!r} is not supported (only none, linear and llama3)")


def _config(meta: GGUFMetadata, arch: str, vocab_size: int, tied: bool, rope_freqs, dtype: torch.dtype) -> dict:
    hidden = int(meta.require(f"{arch}.embedding_length"))
    heads = int(meta.require(f"{arch}.attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rotary_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise GGUFImportError(f"{meta.path}: partial RoPE ({rotary_dim} of {head_dim} dims) is not supported")
    theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    model_type, architecture = ARCHITECTURES[arch]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(meta.require(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(meta.require(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta.require(f"{arch}.context_length")),
        "rms_norm_eps": float(meta.require(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(meta, arch, head_dim, theta, rope_freqs),
        # Qwen2's projections always have q/k/v biases; transformers' Qwen2 reads no bias field.
        **({"use_sliding_window": False} if arch == "qwen2"
           else {"attention_bias": False, "mlp_bias": False}),
        "tie_word_embeddings": tied,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    for name in ("bos", "eos", "padding"):
        token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(token_id)
    return config


# --- weights -----------------------------------------------------------------------------------


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}"
    return None


def _dequantized(tensor, path: Path) -> np.ndarray:
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


def _weights(reader, path: Path, config: dict, dtype: torch.dtype, bar=None) -> dict[str, torch.Tensor]:
    tensors = {}
    for t in reader.tensors:
        if bar is not None:
            bar.update(int(t.n_bytes))
        if t.name == "rope_freqs.weight":
            continue  # folded into config.rope_scaling
        name = _hf_name(t.name)
        if name is None:
            raise GGUFImportError(f"{path}: unexpected tensor {t.name} for a "
                                  f"{config['model_type']} model")
        w = _dequantized(t, path)
        if config["model_type"] == "llama" and name.endswith("q_proj.weight"):
            w = unpermute_qk(w, config["num_attention_heads"])
        elif config["model_type"] == "llama" and name.endswith("k_proj.weight"):
            w = unpermute_qk(w, config["num_key_value_heads"])
        if not w.flags.writeable:  # F32 tensors are read-only views of the memory-mapped file
            w = w.copy()
        if not np.issubdtype(w.dtype, np.floating):
            warnings.warn(f"{path.name}: tensor {t.name} holds {w.dtype} integers, not weights of "
                          f"a float or quantized type; cast to {str(dtype).removeprefix('torch.')}",
                          GGUFImportWarning, stacklevel=2)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(w)).to(dtype)
    return tensors


def _check_shapes(tensors: dict, config: dict, path: Path) -> None:
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
            p + "self_attn.q_proj.weight": (q_out, hidden),
            p + "self_attn.k_proj.weight": (kv_out, hidden),
            p + "self_attn.v_proj.weight": (kv_out, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_out),
            p + "mlp.gate_proj.weight": (ffn, hidden),
            p + "mlp.up_proj.weight": (ffn, hidden),
            p + "mlp.down_proj.weight": (hidden, ffn),
        }
        if config["model_type"] == "qwen2":
            expected |= {p + "self_attn.q_proj.bias": (q_out,), p + "self_attn.k_proj.bias": (kv_out,),
                         p + "self_attn.v_proj.bias": (kv_out,)}
        elif config["model_type"] == "qwen3":
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


@contextlib.contextmanager
def _progress(path: Path, enabled: bool | None):
    """A tqdm bar over the file's bytes (metadata, then tensors), redrawn every half second so
    that its clock runs while the gguf reader parses the metadata, which reports nothing."""
    bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, unit_divisor=1024,
               desc=f"importing {path.name}: reading metadata", disable=None if enabled is None else not enabled,
               leave=False, dynamic_ncols=True)
    stop = threading.Event()

    def tick():
        while not stop.wait(0.5):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True) if not bar.disable else None
    if ticker is not None:
        ticker.start()
    try:
        yield bar
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
        bar.close()


# --- the import --------------------------------------------------------------------------------


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _readable_like_the_others(file: Path) -> None:
    """safetensors writes its file 0600; give it the mode the umask gives new files (0644 under
    umask 022), like the JSON files beside it."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(file, 0o666 & ~mask)


def import_gguf(
    path: str | Path,
    out_dir: str | Path | None = None,
    name: str | None = None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool | None = None,
) -> Path:
    """Write the model of the GGUF file at ``path`` as an HF-style folder and return the folder.

    The folder is ``out_dir``, else ``<models home>/<name>`` (name defaults to the file's stem; the
    models home is $TILEINFER_HOME/models or ~/.cache/tileinfer/models). An existing folder there is
    replaced. The folder appears whole or not at all: it is written beside and renamed into place;
    staging folders of killed imports there are removed first. progress: a bar on standard error
    (None: only when it is a terminal).
    """
    path = Path(path).expanduser()
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {dtype}")
    if name is not None and (not name or "/" in name or "\\" in name or name.startswith(".")):
        raise ValueError(f"an imported model's name must be a plain folder name, got {name!r}")
    if not path.is_file():
        raise GGUFImportError(f"no such GGUF file: {path}")
    with _progress(path, progress) as bar:
        return _import(path, out_dir, name, dtype, bar)


def _import(path: Path, out_dir, name, dtype, bar) -> Path:
    reader = open_gguf(path)
    bar.update(path.stat().st_size - sum(int(t.n_bytes) for t in reader.tensors))
    bar.set_description(f"importing {path.name}: converting tensors")
    meta = GGUFMetadata(reader, path)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(f"{path}: architecture {arch!r} is not supported (supported: "
                              f"{', '.join(ARCHITECTURES)})")

    tokenizer, token_strings = build_tokenizer(meta)
    rope = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    rope_freqs = _dequantized(rope, path).astype(np.float64) if rope is not None else None
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    vocab_size = int(meta.get(f"{arch}.vocab_size", tokenizer.get_vocab_size(with_added_tokens=True)))
    config = _config(meta, arch, vocab_size, tied, rope_freqs, dtype)
    out_dir = Path(out_dir).expanduser() if out_dir is not None else models_home() / (name or path.stem)
    clean_interrupted_imports(out_dir.parent)
    check_room(out_dir.parent, output_bytes(reader, dtype.itemsize), path.name)
    tensors = _weights(reader, path, config, dtype, bar)
    _check_shapes(tensors, config, path)
    bar.set_description(f"importing {path.name}: writing the model folder")

    staging = staging_dir(out_dir)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        _readable_like_the_others(staging / "model.safetensors")
        tokenizer.save(str(staging / "tokenizer.json"))
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": config["max_position_embeddings"],
            "clean_up_tokenization_spaces": False,
            **token_strings,
        }
        template = meta.get("tokenizer.chat_template")
        if template is not None:
            tokenizer_config["chat_template"] = template
        _write_json(staging / "tokenizer_config.json", tokenizer_config)
        _write_json(staging / "generation_config.json", generation_config_from(meta, config))
        _write_json(staging / "config.json", config)
        stat = path.stat()
        _write_json(
            staging / "import.json",
            {"source": str(path.resolve()), "source_size": stat.st_size, "importer_version": IMPORTER_VERSION,
             **source_summary(reader, path)},
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except OSError as e:  # a disk that filled up meanwhile, a folder made read-only
        shutil.rmtree(staging, ignore_errors=True)
        raise GGUFImportError(f"writing {out_dir} failed ({e.strerror or e}); the import "
                              "did not complete") from e
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


