"""Weights of a model directory: safetensors files read with ``safetensors.safe_open``.

``safe_open`` memory-maps each file and reads only the tensors asked for. A sharded checkpoint
lists its tensors' files in ``model.safetensors.index.json`` (``weight_map``); otherwise every
``*.safetensors`` file in the directory is opened.

At load, the per-projection tensors of transformers' checkpoints are fused so that one ``linear``
op computes them together:

- ``qkv`` ((heads + 2 * kv_heads) * head_dim, hidden): q_proj rows, then k_proj, then v_proj;
- ``gate_up`` (2 * intermediate, hidden): gate_proj rows over up_proj rows (SwiGLU models), or
  ``up`` (intermediate, hidden) for Apertus' ungated xIELU MLP;
- ``qkv_bias`` (Qwen2's q/k/v biases, (heads + 2 * kv_heads) * head_dim): the same order.

Phi-3 checkpoints hold both already fused in this order (``self_attn.qkv_proj``,
``mlp.gate_up_proj``); ``fused_parts`` says which tensors make each.

Before anything is allocated, ``check_checkpoint`` compares the config with the files (the layer
count, then every tensor's shape from the safetensors headers), so that a config whose sizes do
not match its weights (``num_hidden_layers: 100000000``) is refused at once, naming the field or
the tensor. Every tensor is checked for NaN and infinite values as it is loaded (``check_finite``:
one ``aminmax`` pass, far cheaper than the copy the load makes anyway; on a GPU read back once
at the end, or once per layer when quantizing, ``finite_weights.py``), so that a corrupt file is
refused with the tensor's name instead of generating garbage.

A checkpoint whose linear weights are stored in FP8 (compressed-tensors or vLLM's "fp8", with a
``weight_scale`` beside each) is read as the dequantized values (``fp8_checkpoint.py``); other
quantized checkpoints are refused.

Which tensors each architecture names, and their shapes: ``tensor_names.py``.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open

from ..backend.types import XIELUScalars
from .config import ModelConfig
from .errors import WeightsError
from .finite_weights import FiniteCheck, check_finite
from .fp8_checkpoint import (FP8_DTYPES, QuantizationError, check_quantization, dequantized,
                             stored_e4m3, block_scaling)
from .quant import (E4M3_MODES, Fp8Weight, QuantizedWeight, check_quantize, fp8_weight_only,
                    quantize_linear)
from .tensor_names import checkpoint_shapes, fused_parts, layer_tensor_names

INDEX_FILE = "model.safetensors.index.json"


@dataclass
class LayerWeights:
    """One decoder layer. Linear weights are tensors (out, in) or ``QuantizedWeight``s."""

    attn_norm: torch.Tensor  # (hidden,)
    qkv: torch.Tensor | QuantizedWeight  # (qkv_size, hidden)
    q_norm: torch.Tensor | None  # (head_dim,) or None
    k_norm: torch.Tensor | None
    o: torch.Tensor | QuantizedWeight  # (hidden, heads * head_dim)
    mlp_norm: torch.Tensor  # (hidden,)
    # SwiGLU: gate_up (2 * inter, hidden), gate rows over up rows; xIELU: up (inter, hidden)
    up: torch.Tensor | QuantizedWeight
    down: torch.Tensor | QuantizedWeight  # (hidden, inter)
    xielu: XIELUScalars | None = None
    qkv_bias: torch.Tensor | None = None  # (qkv_size,) in the model dtype, or None
    # Gemma 3's norms of the attention and MLP outputs (hidden,), None for the others.
    post_attn_norm: torch.Tensor | None = None
    post_mlp_norm: torch.Tensor | None = None


@dataclass
class ModelWeights:
    embed: torch.Tensor  # (vocab, hidden), always in the model dtype
    layers: list[LayerWeights]
    norm: torch.Tensor  # (hidden,)
    lm_head: torch.Tensor | QuantizedWeight  # (vocab, hidden); the embed tensor itself when tied

    def tensors(self):
        """Every distinct weight tensor (a tied lm_head is counted once)."""
        seen = {}
        items = [self.embed, self.norm, self.lm_head]
        for layer in self.layers:
            items += [layer.attn_norm, layer.qkv, layer.qkv_bias, layer.q_norm, layer.k_norm,
                      layer.o, layer.mlp_norm, layer.up, layer.down, layer.post_attn_norm,
                      layer.post_mlp_norm]
        for item in items:
            parts = (item.q, item.scale) if isinstance(item, QuantizedWeight) else (item,)
            for t in parts:
                if t is not None:
                    seen[id(t)] = t
        return list(seen.values())


# Where a causal LM's tensors sit inside a multimodal checkpoint (Gemma 3's 4B-27B: its text
# model, beside the vision tower that a text-only engine leaves unread), in the two layouts
# transformers has saved.
_LANGUAGE_MODEL_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.",
                            "language_model.lm_head.": "lm_head."}


def causal_lm_renames(names) -> dict[str, str]:
    """{stored name: a causal LM's name} for the tensors stored under other names: a base
    model's (transformers' Qwen3Model, MistralModel: what embedding models such as
    Qwen3-Embedding ship), named without the "model." prefix; a multimodal model's text part."""
    renames = {}
    for name in names:
        for prefix, ours in _LANGUAGE_MODEL_PREFIXES.items():
            if name.startswith(prefix):
                renames[name] = ours + name[len(prefix):]
    if renames:
        return renames
    if any(n.startswith("layers.") for n in names) and not any(n.startswith("model.")
                                                               for n in names):
        return {n: f"model.{n}" for n in names if not n.startswith("lm_head.")}
    return {}


class Checkpoint:
    """The tensors of a model directory's safetensors files, by name (use as a context manager)."""

    def __init__(self, model_dir, causal_lm_names: bool = True):
        """causal_lm_names: read a base model's tensors (no "model." prefix), or a multimodal
        model's text part, under a causal LM's names (``causal_lm_renames``; False: the names as
        stored)."""
        self.model_dir = Path(model_dir)
        try:
            self.fp8_blocks = block_scaling(model_dir)  # FP8 block scales: (block, suffix)
        except QuantizationError as exc:
            raise WeightsError(str(exc)) from None
        self._stack = contextlib.ExitStack()
        self._handles = {}  # file name -> open safe_open handle
        index = self.model_dir / INDEX_FILE
        if index.is_file():
            try:
                self.weight_map = dict(json.loads(index.read_text())["weight_map"])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise WeightsError(f"{index} is not a valid safetensors index: {exc!r}") from None
        else:
            files = sorted(p.name for p in self.model_dir.glob("*.safetensors"))
            if not files:
                raise WeightsError(f"no *.safetensors files in {self.model_dir}")
            self.weight_map = {}
            for file in files:
                for name in self._handle(file).keys():
                    self.weight_map.setdefault(name, file)
        self.stored: dict[str, str] = {}  # a name as read here -> as stored, where they differ
        if causal_lm_names:
            renamed = causal_lm_renames(self.weight_map)
            self.stored = {new: old for old, new in renamed.items()}
            self.weight_map = {renamed.get(n, n): f for n, f in self.weight_map.items()}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def _handle(self, file):
        if file not in self._handles:
            path = self.model_dir / file
            if not path.is_file():
                raise WeightsError(f"{path} (listed in {INDEX_FILE}) does not exist")
            try:
                self._handles[file] = self._stack.enter_context(
                    safe_open(str(path), framework="pt", device="cpu"))
            except (SafetensorError, OSError) as exc:
                raise WeightsError(f"{path} is truncated or corrupt and cannot be read as "
                                   f"safetensors: {exc}") from None
        return self._handles[file]

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def _file(self, name):
        if name not in self.weight_map:
            raise WeightsError(f"tensor {name!r} is missing from the checkpoint in "
                               f"{self.model_dir}")
        return self.weight_map[name]

    def shape(self, name: str) -> tuple[int, ...]:
        handle = self._handle(self._file(name))
        try:
            return tuple(handle.get_slice(self.stored.get(name, name)).get_shape())
        except SafetensorError as exc:
            raise WeightsError(f"tensor {name!r} cannot be read: {exc}") from None

    def get(self, name: str, shape: tuple[int, ...], dequantize: bool = True) -> torch.Tensor:
        """The tensor ``name`` (on the CPU, memory-mapped), checked to have ``shape``; an FP8
        weight as its dequantized values unless dequantize is False."""
        got = self.shape(name)
        if got != tuple(shape):
            raise WeightsError(f"tensor {name!r} has shape {list(got)}, expected {list(shape)}")
        try:
            t = self._handle(self._file(name)).get_tensor(self.stored.get(name, name))
        except SafetensorError as exc:
            raise WeightsError(f"tensor {name!r} cannot be read: {exc}") from None
        if t.dtype in FP8_DTYPES and dequantize:  # its values (fp8_checkpoint.py)
            block, suffix = self.fp8_blocks or (None, "_scale")
            scale = name + suffix
            if not self.has(scale):
                raise WeightsError(f"tensor {name!r} is stored in {t.dtype} without a "
                                   f"{scale!r}")
            try:
                return dequantized(t, self.get(scale, self.shape(scale)), name, block)
            except QuantizationError as exc:
                raise WeightsError(str(exc)) from None
        return t


def stacked_tensor(ckpt: Checkpoint, parts, cols, dtype, device,
                   finite: FiniteCheck | None = None) -> torch.Tensor:
    """Tensors (rows_i, cols) stacked along rows into one new (sum rows_i, cols) tensor, each
    part checked for NaN and infinite values (by ``finite``, else at once)."""
    for name, rows in parts:  # every shape before the allocation
        got = ckpt.shape(name)
        if got != (rows, cols):
            raise WeightsError(f"tensor {name!r} has shape {list(got)}, expected {[rows, cols]}")
    total = sum(rows for _, rows in parts)
    out = torch.empty(total, cols, dtype=dtype, device=device)
    start = 0
    for name, rows in parts:
        part = out[start:start + rows]
        part.copy_(ckpt.get(name, (rows, cols)))  # converts dtype and device
        if finite is None:
            check_finite(part, name)
        else:
            finite.add(part, name)
        start += rows
    return out


def _xielu_scalars(ckpt: Checkpoint, prefix: str, dtype) -> XIELUScalars:
    def scalar(name):
        full = prefix + name
        shape = ckpt.shape(full)
        if shape not in ((), (1,)):
            raise WeightsError(f"tensor {full!r} has shape {list(shape)}, expected a scalar "
                               "([] or [1])")
        return check_finite(ckpt.get(full, shape).reshape(()).to(dtype), full)

    alpha_p, alpha_n, beta, eps = (scalar(n) for n in ("alpha_p", "alpha_n", "beta", "eps"))
    # Rounded to the model dtype at each step, as XIELUActivation._xielu_python computes them.
    return XIELUScalars(
        alpha_p=float(F.softplus(alpha_p)),
        alpha_n=float(beta + F.softplus(alpha_n)),
        beta=float(beta),
        eps=float(eps),
    )


_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def check_checkpoint(config: ModelConfig, ckpt: Checkpoint):
    """Compare config with the checkpoint's headers before anything is allocated: the number of
    layers first (so that an absurd ``num_hidden_layers`` is refused without listing its
    tensors), then the shape of every tensor the model reads."""
    layers = {int(m.group(1)) for name in ckpt.weight_map if (m := _LAYER.match(name))}
    if config.num_layers > len(layers) or (layers and config.num_layers - 1 not in layers):
        held = f"layers 0..{max(layers)}" if layers else "no layers"
        raise WeightsError(f"config field 'num_hidden_layers' is {config.num_layers}, but the "
                           f"checkpoint in {ckpt.model_dir} holds {held}")
    shapes = checkpoint_shapes(config, lm_head=not config.tie_word_embeddings
                               and ckpt.has("lm_head.weight"))
    for name, shape in shapes.items():
        if ".act_fn." in name:
            continue  # xIELU scalars: () or (1,), checked when read
        got = ckpt.shape(name)
        if got != tuple(shape):
            raise WeightsError(f"tensor {name!r} has shape {list(got)}, expected {list(shape)} "
                               "from config.json's sizes")


def load_weights(config: ModelConfig, model_dir, dtype=torch.bfloat16, device="cpu",
                 quantize: str | None = None) -> ModelWeights:
    """Read, check, fuse and convert the weights of ``model_dir`` for ``config``.

    quantize: None, "int8" to store every linear weight (qkv, o, gate_up/up, down, lm_head) as
    an ``Int8Weight``, "fp8" to store them as ``Fp8Weight``s but the lm_head, or
    "fp8-weight-only" as ``Fp8WeightOnly``s but the lm_head (model/quant.py).
    The embedding table stays in ``dtype``, so a tied lm_head gets its own INT8 copy.
    """
    check_quantize(quantize)
    c = config
    try:
        check_quantization(model_dir)  # FP8 checkpoints load dequantized; others are refused
    except QuantizationError as exc:
        raise WeightsError(str(exc)) from None
    finite = FiniteCheck()
    with Checkpoint(model_dir) as ckpt:
        check_checkpoint(c, ckpt)
        shapes = checkpoint_shapes(c)
        names = layer_tensor_names(c)

        def load(name):
            return finite.add(ckpt.get(name, shapes[name]).to(device=device, dtype=dtype), name)

        def load_norm(name):
            """An RMSNorm's weight; Gemma's is 1 + w in float32 (its norm computes in float32:
            gemma.gemma_rmsnorm)."""
            if c.gemma is None:
                return load(name)
            one_plus = 1.0 + ckpt.get(name, shapes[name]).float()
            return finite.add(one_plus.to(device=device), name)

        def stacked(*names_):
            return stacked_tensor(ckpt, [(n, shapes[n][0]) for n in names_], c.hidden_size, dtype,
                                  device, finite)

        def linear(weight, head=False):
            return quantize_linear(weight, quantize, head)

        def linear_of(*names_):
            """The parts stacked: e4m3 as stored with the FP8 modes, else linear(...)."""
            if quantize in E4M3_MODES:
                try:
                    stored = stored_e4m3(ckpt, [(n, shapes[n][0]) for n in names_],
                                         shapes[names_[0]][1])
                except QuantizationError as exc:
                    raise WeightsError(str(exc)) from None
                if stored is not None:
                    weight = Fp8Weight(stored[0].to(device), stored[1].to(device))
                    return fp8_weight_only(weight) if quantize == "fp8-weight-only" else weight
            return linear(stacked(*names_) if len(names_) > 1 else load(names_[0]))

        embed = load("model.embed_tokens.weight")
        parts = fused_parts(c)
        layers = []
        for i in range(c.num_layers):
            n = {role: f"model.layers.{i}.{suffix}" for role, suffix in names.items()}
            layers.append(LayerWeights(
                attn_norm=load_norm(n["attn_norm"]),
                qkv=linear_of(*(n[role] for role, _ in parts["qkv"])),
                q_norm=load_norm(n["q_norm"]) if c.qk_norm else None,
                k_norm=load_norm(n["k_norm"]) if c.qk_norm else None,
                o=linear_of(n["o"]),
                mlp_norm=load_norm(n["mlp_norm"]),
                up=linear_of(*(n[role] for role, _ in parts["up"])),
                down=linear_of(n["down"]),
                xielu=(_xielu_scalars(ckpt, f"model.layers.{i}.mlp.act_fn.", dtype)
                       if c.mlp == "xielu" else None),
                qkv_bias=(torch.cat([load(n["q_bias"]), load(n["k_bias"]), load(n["v_bias"])])
                          if c.qkv_bias else None),
                post_attn_norm=load_norm(n["post_attn_norm"]) if "post_attn_norm" in n else None,
                post_mlp_norm=load_norm(n["post_mlp_norm"]) if "post_mlp_norm" in n else None,
            ))
            if quantize is not None:  # the pending checks hold the layer's unquantized tensors
                finite.flush()
        norm = load_norm("model.norm.weight")
        # transformers ties lm_head to the embedding when tie_word_embeddings is set, and then
        # does not save it; a checkpoint without lm_head.weight is read the same way.
        if c.tie_word_embeddings or not ckpt.has("lm_head.weight"):
            lm_head = embed
        else:
            lm_head = load("lm_head.weight")
        # The embedding table stays in dtype: a tied lm_head gets its own INT8 copy.
        lm_head = linear(lm_head, head=True)
        finite.flush()
    return ModelWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head)


def weight_bytes(model) -> int:
    """Bytes of a model's weights (a Model or ModelWeights), a tied lm_head counted once."""
    weights = getattr(model, "weights", model)
    return sum(t.numel() * t.element_size() for t in weights.tensors())


def expected_weight_bytes(config: ModelConfig, dtype=torch.bfloat16,
                          quantize: str | None = None) -> int:
    """Bytes ``load_weights`` will allocate for config, computed from the sizes alone (INT8 or
    FP8: one byte per linear weight plus a float32 scale per output row; the embedding table
    stays in dtype, a tied lm_head gets its own INT8 copy, FP8 leaves the lm_head in dtype)."""
    c = config
    size = torch.empty((), dtype=dtype).element_size()
    hidden, inter = c.hidden_size, c.intermediate_size
    up_rows = 2 * inter if c.gated else inter

    def linear(rows, cols, head=False):
        one_byte = quantize == "int8" or (quantize in E4M3_MODES and not head)
        return rows * cols + 4 * rows if one_byte else rows * cols * size

    norms, norm_size = (4, 4) if c.gemma is not None else (2, size)  # Gemma's: float32
    per_layer = (norms * hidden * norm_size + (2 * c.head_dim * norm_size if c.qk_norm else 0)
                 + (c.qkv_size * size if c.qkv_bias else 0)
                 + linear(c.qkv_size, hidden) + linear(hidden, c.q_size)
                 + linear(up_rows, hidden) + linear(hidden, inter))
    head = (0 if c.tie_word_embeddings and quantize != "int8"
            else linear(c.vocab_size, hidden, head=True))
    return c.vocab_size * hidden * size + c.num_layers * per_layer + hidden * norm_size + head
