"""Import a llama.cpp GGUF file as an HF-style model folder that the rest of TileInfer loads.

The ``gguf`` package (llama.cpp's own reader) reads the file and dequantizes its tensors. The
folder gets config.json (model_type llama, from the GGUF metadata), model.safetensors (bf16 by
default), tokenizer.json (built with ``tokenizers`` from the GGUF vocabulary, merges and token
types), tokenizer_config.json (chat template, BOS/EOS), generation_config.json and import.json
(where it came from, and the importer version, so a stale import can be redone).

llama.cpp stores the q and k projections with the rows of each head reordered for its RoPE
(``permute`` in llama.cpp's convert_hf_to_gguf.py: ``(heads, 2, head_dim/2, in)`` swapped to
``(heads, head_dim/2, 2, in)``); the import swaps them back, with n_head = kv heads for k.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import dequantize
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from .paths import models_home

# Bump when the importer's output changes, so cached imports are redone.
IMPORTER_VERSION = 1

TESTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


class GGUFImportError(ValueError):
    """The file is not a readable GGUF, or holds something the importer does not support."""


# GGUF tensor name (after "blk.N.") -> HF llama parameter name (after "model.layers.N.").
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
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

# Pre-tokenizers of byte-level BPE vocabularies, by tokenizer.ggml.pre (the names llama.cpp gives
# them in llama-vocab.cpp), written the way those models' own tokenizer.json files write them.
_GPT2 = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
# SmolLM, StarCoder: every digit on its own, then the GPT-2 split.
_DIGITS_THEN_GPT2 = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _GPT2])
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = pre_tokenizers.Sequence(
    [
        pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ]
)
# name -> (pre-tokenizer, BPE ignore_merges as llama.cpp sets it for that name)
_PRE_TOKENIZERS = {
    "gpt-2": (_GPT2, False),
    "gpt2": (_GPT2, False),
    "smollm": (_DIGITS_THEN_GPT2, False),
    "starcoder": (_DIGITS_THEN_GPT2, False),
    "llama-bpe": (_LLAMA3, True),
    "llama3": (_LLAMA3, True),
}

# GGUF token types (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4


class _Metadata:
    """Typed access to a GGUF file's key/value metadata."""

    def __init__(self, reader: gguf.GGUFReader, path: Path):
        self.reader = reader
        self.path = path

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as e:
            raise GGUFImportError(f"{self.path}: cannot read metadata {key}: {e}") from e

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise GGUFImportError(f"{self.path}: the metadata key {key} is missing")
        return value


def _open(path: Path) -> gguf.GGUFReader:
    if not path.is_file():
        raise GGUFImportError(f"no such GGUF file: {path}")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # truncated or not a GGUF: the reader raises ValueError, IndexError, ...
        raise GGUFImportError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from e


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


def _rope_scaling(meta: _Metadata, arch: str, head_dim: int, theta: float, rope_freqs: np.ndarray | None):
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


def _config(meta: _Metadata, arch: str, vocab_size: int, tied: bool, rope_freqs, dtype: torch.dtype) -> dict:
    hidden = int(meta.require(f"{arch}.embedding_length"))
    heads = int(meta.require(f"{arch}.attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rotary_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise GGUFImportError(f"{meta.path}: partial RoPE ({rotary_dim} of {head_dim} dims) is not supported")
    theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
        "attention_bias": False,
        "mlp_bias": False,
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


def _weights(reader, path: Path, config: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    tensors = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue  # folded into config.rope_scaling
        name = _hf_name(t.name)
        if name is None:
            raise GGUFImportError(f"{path}: unexpected tensor {t.name} for a llama model")
        w = _dequantized(t, path)
        if name.endswith("q_proj.weight"):
            w = unpermute_qk(w, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute_qk(w, config["num_key_value_heads"])
        if not w.flags.writeable:  # F32 tensors are read-only views of the memory-mapped file
            w = w.copy()
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
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise GGUFImportError(f"{path}: tensors missing for the model the metadata describes: {missing[:4]}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise GGUFImportError(f"{path}: tensors beyond the {layers} layers the metadata describes: {extra[:4]}")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise GGUFImportError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, expected {shape}")


# --- tokenizer ---------------------------------------------------------------------------------


def _tokenizer(meta: _Metadata) -> tuple[Tokenizer, dict]:
    """tokenizer.json content from the GGUF vocabulary, and the special token strings."""
    kind = meta.require("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFImportError(
            f"{meta.path}: tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'; "
            "SentencePiece vocabularies are not)"
        )
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFImportError(
            f"{meta.path}: pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    pre_tokenizer, ignore_merges = _PRE_TOKENIZERS[pre]
    tokens = list(meta.require("tokenizer.ggml.tokens"))
    merges = []
    for merge in meta.require("tokenizer.ggml.merges"):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise GGUFImportError(f"{meta.path}: malformed merge {merge!r}")
        merges.append(tuple(pair))
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    if len(types) != len(tokens):
        raise GGUFImportError(f"{meta.path}: {len(tokens)} tokens but {len(types)} token types")

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if i is None:
            return None
        if not 0 <= int(i) < len(tokens):
            raise GGUFImportError(f"{meta.path}: tokenizer.ggml.{key}_token_id {i} is outside the vocabulary")
        return tokens[int(i)]

    named = {"bos_token": token("bos"), "eos_token": token("eos"), "unk_token": token("unknown"), "pad_token": token("padding")}
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFImportError(f"{meta.path}: the vocabulary repeats tokens")
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=named["unk_token"], ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    # Control tokens are special (skipped by skip_special_tokens); user-defined ones are plain
    # added tokens. Both match whole in the text before BPE runs.
    tok.add_tokens(
        [AddedToken(t, special=ty == _CONTROL, normalized=False) for t, ty in zip(tokens, types) if ty in (_CONTROL, _USER_DEFINED)]
    )
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    for flag, key in ((add_bos, "bos_token"), (add_eos, "eos_token")):
        if flag and named[key] is None:
            raise GGUFImportError(f"{meta.path}: the file asks to add a {key} but names none")
    if add_bos or add_eos:
        bos, eos = named["bos_token"], named["eos_token"]
        single = ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
        pair = single + ([f"{bos}:1"] if add_bos else []) + ["$B:1"] + ([f"{eos}:1"] if add_eos else [])
        specials = {t: vocab[t] for t, on in ((bos, add_bos), (eos, add_eos)) if on}
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(specials.items()))
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    flags = {"add_bos_token": add_bos, "add_eos_token": add_eos}
    return tok, {**{k: v for k, v in named.items() if v is not None}, **flags}


def _generation_config(meta: _Metadata, config: dict) -> dict:
    out = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    # Sampling settings some GGUF files carry (general.sampling.*), in generation_config terms.
    temp = meta.get("general.sampling.temp")
    top_k = meta.get("general.sampling.top_k")
    top_p = meta.get("general.sampling.top_p")
    if temp is not None or top_k is not None or top_p is not None:
        out["do_sample"] = temp is None or float(temp) > 0
        if temp is not None:
            out["temperature"] = float(temp)
        if top_k is not None:
            out["top_k"] = int(top_k)
        if top_p is not None:
            out["top_p"] = float(top_p)
    return out


# --- the import --------------------------------------------------------------------------------


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def import_gguf(
    path: str | Path, out_dir: str | Path | None = None, name: str | None = None, *, dtype: torch.dtype = torch.bfloat16
) -> Path:
    """Write the model of the GGUF file at ``path`` as an HF-style folder and return the folder.

    The folder is ``out_dir``, else ``<models home>/<name>`` (name defaults to the file's stem; the
    models home is $TILEINFER_HOME/models or ~/.cache/tileinfer/models). An existing folder there is
    replaced. The folder appears whole or not at all: it is written beside and renamed into place.
    """
    path = Path(path).expanduser()
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {dtype}")
    reader = _open(path)
    meta = _Metadata(reader, path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GGUFImportError(f"{path}: architecture {arch!r} is not supported (only 'llama')")

    tokenizer, token_strings = _tokenizer(meta)
    rope = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    rope_freqs = _dequantized(rope, path).astype(np.float64) if rope is not None else None
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    vocab_size = int(meta.get("llama.vocab_size", tokenizer.get_vocab_size(with_added_tokens=True)))
    config = _config(meta, arch, vocab_size, tied, rope_freqs, dtype)
    tensors = _weights(reader, path, config, dtype)
    _check_shapes(tensors, config, path)

    out_dir = Path(out_dir).expanduser() if out_dir is not None else models_home() / (name or path.stem)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.importing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
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
        _write_json(staging / "generation_config.json", _generation_config(meta, config))
        _write_json(staging / "config.json", config)
        stat = path.stat()
        _write_json(
            staging / "import.json",
            {"source": str(path.resolve()), "source_size": stat.st_size, "importer_version": IMPORTER_VERSION},
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def is_current_import(folder: Path, source: Path) -> bool:
    """Whether ``folder`` holds a complete import of ``source`` by this importer version."""
    try:
        info = json.loads((folder / "import.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        info.get("importer_version") == IMPORTER_VERSION
        and info.get("source_size") == source.stat().st_size
        and (folder / "config.json").is_file()
    )
