"""DFlash drafters (z-lab's block diffusion drafters): a whole block of drafts in one pass.

The checkpoint format (../shared/fixtures/DFLASH_FORMAT.md, z-lab/dflash ``dflash/model.py``):
a Qwen3 config.json with ``block_size``, ``num_target_layers`` and ``dflash_config =
{mask_token_id, target_layer_ids}``, and the tensors ``layers.{i}.*`` (Qwen3 decoder layers),
``fc.weight`` (hidden, len(target_layer_ids) * hidden), ``hidden_norm.weight`` and
``norm.weight``. The drafter has no embedding table and no lm_head: it uses the target's.

How it drafts. The context of the drafter is the target's own hidden states: for each position
the target ran, the outputs of layers ``target_layer_ids`` (transformers' ``hidden_states[id +
1]``: the last layer's is taken after the target's final norm, as transformers reports it),
concatenated and projected, ``context = hidden_norm(fc(concat))``. Every drafter layer turns the
context into keys and values of those positions (``k_norm(k_proj(context))`` with RoPE at the
position, ``v_proj(context)``) in the drafter's own paged KV cache. A block is ``[last token,
mask x (block_size - 1)]`` at the positions after the context, embedded with the target's table;
it goes through the layers like a Qwen3 decoder whose attention is NOT causal (every block row
sees the whole context and the whole block), and the target's lm_head turns rows 1.. into the
distributions of the next block_size - 1 tokens. The block's own keys and values are dropped
afterwards: the next step's context overwrites those positions.

Here the context keys and values are written as soon as the target's step ran (the runner calls
the proposer with the step's hidden states), for all its rows; the rows the target rejects are
overwritten later (the context is cut back to the tokens the target kept, compared by id), which
gives the same keys and values as computing them with the next block as the reference does.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ....backend.sampling import SamplingParams
from ....io.model_dir import resolve_model_dir
from ....model.config import ConfigError, ModelConfig, check_max_len, config_from_dict
from ....model.decoder import Model
from ....model.quant import linear_operands
from ....model.tensor_names import layer_tensor_names
from ....model.weights import Checkpoint, LayerWeights, ModelWeights, stacked_tensor
from ...kv.cache import ContextLengthError, OutOfPagesError, common_prefix_len, new_cache
from ...runtime.graphs import capture_graph
from ...kv.step import prepare_step, static_metadata
from .proposer import Draft, Proposer, check_k, draft_seed


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default choice of target layers: evenly spaced from 1 to num_target_layers - 3
    (the middle layer for a one-layer drafter)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1)))
            for i in range(num_draft_layers)]


@dataclass
class DFlashDrafter:
    """A DFlash drafter bound to its target.

    model: the drafter's layers as a ``Model`` (the drafter's config, RoPE tables and layers, its
    final ``norm``; the target's embedding table and lm_head, shared, not copied). fc,
    hidden_norm: the context projection. target_layer_ids: 0-based target layers read.
    target_norm, target_eps: the target's final norm (for a target layer that is its last).
    """

    model: Model
    fc: torch.Tensor
    hidden_norm: torch.Tensor
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    target_config: ModelConfig
    target_norm: torch.Tensor
    target_eps: float

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def max_len(self) -> int:
        return self.model.max_len

    def __repr__(self):
        c = self.config
        return (f"DFlashDrafter(layers={c.num_layers}, hidden={c.hidden_size}, "
                f"block_size={self.block_size}, target_layer_ids={list(self.target_layer_ids)}, "
                f"backend={self.model.backend!r}, dtype={self.model.dtype})")

    def store_context(self, meta, hidden_out: dict, cache):
        """Write the context keys and values of the target rows ``hidden_out`` (layer -> (n,
        hidden)) at the positions and slots of ``meta`` (a step of n tokens on the drafter's
        cache). Eager: allocates its scratch."""
        m, c, ops = self.model, self.config, self.model.ops
        n = meta.num_tokens
        last = self.target_config.num_layers - 1
        parts = []
        for layer in self.target_layer_ids:
            rows = hidden_out[layer]
            if layer == last:  # transformers' last hidden state is after the final norm
                normed = torch.empty_like(rows)
                ops.rmsnorm(normed, rows, self.target_norm, self.target_eps)
                rows = normed
            parts.append(rows)
        features = torch.cat(parts, dim=-1)  # (n, len(target_layer_ids) * hidden)
        projected = torch.empty(n, c.hidden_size, dtype=m.dtype, device=m.device)
        ops.linear(projected, features, self.fc, None, True)
        context = torch.empty_like(projected)
        ops.rmsnorm(context, projected, self.hidden_norm, c.rms_norm_eps)
        qkv = torch.empty(n, c.qkv_size, dtype=m.dtype, device=m.device)
        q = torch.empty(n, c.num_heads, c.head_dim, dtype=m.dtype, device=m.device)
        for i, layer in enumerate(m.weights.layers):
            # Keys and values of the context (no input norm: the context enters k_proj/v_proj
            # as it is); the queries are computed and not used.
            ops.linear(qkv, context, *linear_operands(layer.qkv), True)
            ops.attention_inputs(q, cache.layer(i), qkv, m.qk[i], meta.attention)

    def forward_block(self, meta, buffers, cache) -> torch.Tensor:
        """The block pass: ``meta`` is a step of block_size tokens on the drafter's cache (its
        context already stored), ``buffers`` its ``StepBuffers`` (block_size logit rows). Returns
        the logits (block_size, vocab) float32; row j + 1 drafts the token j + 1 places after the
        block's first. It is the decoder's step with the target's embedding and lm_head, and
        attention that is not causal: the block sees itself whole. Graph-capturable."""
        return self.model.forward_step(meta, buffers, cache, causal=False)


# Keys of later DFlash variants that change the computation; this reader refuses them.
_UNSUPPORTED = {"input_embedding_scale": 1.0, "output_multiplier": 1.0,
                "final_logit_softcapping": None}


def _read_config(directory: Path) -> dict:
    path = directory / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no config.json in {directory}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return raw


def _dflash_settings(raw: dict, config: ModelConfig, target: ModelConfig):
    """(block_size, mask_token_id, target_layer_ids) from the drafter's config, checked."""
    extra = raw.get("dflash_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("config field 'dflash_config' must be an object")

    def value(name, default=None):  # dflash_config wins over the top level, as in z-lab's code
        return extra.get(name, raw.get(name, default))

    for name, neutral in _UNSUPPORTED.items():
        if value(name, neutral) != neutral:
            raise ConfigError(f"DFlash config field {name!r} = {value(name)!r} is not supported "
                              "(only the original DFlash drafters are)")
    layer_types = raw.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ConfigError(f"DFlash config field 'layer_types' lists {sorted(set(layer_types))}: "
                          "drafter layers with sliding-window attention are not supported")
    block_size = value("block_size", 16)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"DFlash config field 'block_size' must be an integer >= 1, got "
                          f"{block_size!r}")
    mask = value("mask_token_id")
    if mask is None:
        raise ConfigError("DFlash config field 'dflash_config.mask_token_id' is missing")
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < target.vocab_size:
        raise ConfigError(f"DFlash mask_token_id {mask!r} is not a row of the target's embedding "
                          f"table (0..{target.vocab_size - 1})")
    num_target_layers = value("num_target_layers")
    if num_target_layers is not None and num_target_layers != target.num_layers:
        raise ValueError(f"the DFlash drafter was made for a target of {num_target_layers} "
                         f"layers; this target has {target.num_layers}")
    layer_ids = value("target_layer_ids")
    if layer_ids is None:
        layer_ids = build_target_layer_ids(target.num_layers, config.num_layers)
    if not isinstance(layer_ids, list) or not layer_ids:
        raise ConfigError(f"DFlash config field 'target_layer_ids' must be a non-empty list, got "
                          f"{layer_ids!r}")
    for layer in layer_ids:
        if isinstance(layer, bool) or not isinstance(layer, int) or \
                not 0 <= layer < target.num_layers:
            raise ValueError(f"DFlash target_layer_ids {layer_ids}: layer {layer!r} is outside "
                             f"the target's layers 0..{target.num_layers - 1}")
    return block_size, mask, tuple(layer_ids)


def load_dflash(drafter, target: Model, max_len: int | None = None) -> DFlashDrafter:
    """Load a DFlash drafter (a directory or pulled repo id, in z-lab's format) for ``target``,
    in the target's dtype, device and backend. max_len: the longest sequence it drafts for
    (default the target's max_len)."""
    directory = resolve_model_dir(drafter)
    raw = _read_config(directory)
    if raw.get("model_type") != "qwen3":
        raise ConfigError(f"a DFlash drafter's config has model_type 'qwen3', got "
                          f"{raw.get('model_type')!r} in {directory}")
    config = config_from_dict(raw)
    t = target.config
    if config.vocab_size != t.vocab_size:
        raise ValueError(f"the DFlash drafter's vocabulary ({config.vocab_size} tokens) differs "
                         f"from the target's ({t.vocab_size})")
    if config.hidden_size != t.hidden_size:
        raise ValueError(f"the DFlash drafter's hidden_size {config.hidden_size} differs from "
                         f"the target's {t.hidden_size}: it shares the target's embedding and "
                         "lm_head")
    block_size, mask, layer_ids = _dflash_settings(raw, config, t)
    max_len = target.max_len if max_len is None else max_len
    check_max_len(config, max_len)
    dtype, device = target.dtype, target.device
    hidden = config.hidden_size
    names = layer_tensor_names(config)
    roles = {"attn_norm": (hidden,), "mlp_norm": (hidden,), "q_norm": (config.head_dim,),
             "k_norm": (config.head_dim,), "o": (hidden, config.q_size),
             "down": (hidden, config.intermediate_size)}
    with Checkpoint(directory, causal_lm_names=False) as ckpt:
        def load(name, shape):
            return ckpt.get(name, shape).to(device=device, dtype=dtype)

        layers = []
        for i in range(config.num_layers):
            n = {role: f"layers.{i}.{suffix}" for role, suffix in names.items()}
            layers.append(LayerWeights(
                attn_norm=load(n["attn_norm"], roles["attn_norm"]),
                qkv=stacked_tensor(ckpt, [(n["q"], config.q_size), (n["k"], config.kv_size),
                                          (n["v"], config.kv_size)], hidden, dtype, device),
                q_norm=load(n["q_norm"], roles["q_norm"]),
                k_norm=load(n["k_norm"], roles["k_norm"]),
                o=load(n["o"], roles["o"]),
                mlp_norm=load(n["mlp_norm"], roles["mlp_norm"]),
                up=stacked_tensor(ckpt, [(n["gate"], config.intermediate_size),
                                         (n["up"], config.intermediate_size)], hidden, dtype,
                                  device),
                down=load(n["down"], roles["down"]),
            ))
        fc = load("fc.weight", (hidden, len(layer_ids) * hidden))
        hidden_norm = load("hidden_norm.weight", (hidden,))
        norm = load("norm.weight", (hidden,))
    weights = ModelWeights(embed=target.weights.embed, layers=layers, norm=norm,
                           lm_head=target.weights.lm_head)
    model = Model(config, weights, target.ops, dtype, device, max_len, model_dir=directory)
    return DFlashDrafter(model, fc, hidden_norm, layer_ids, block_size, mask, t,
                         target.weights.norm, t.rms_norm_eps)


class DFlashProposer(Proposer):
    """The first k of the block_size - 1 tokens a DFlash drafter drafts in one pass (default
    all of them), on a KV cache of its own for up to ``max_tokens`` positions (default the
    drafter's max_len): the argmax at each block position, or with ``sample=True`` and a target
    that samples, a sample with the target's parameters from the drafter's own stream (each
    position independently: the block's rows do not see each other's drafts, so q of draft j is
    the drafter's distribution at row j + 1).

    ``begin`` attaches it to the target's runner, which from then on writes the hidden states
    the drafter reads after every step (and calls the proposer with them). The context follows
    one target sequence at a time; positions computed before it was attached are not known to
    it, and it drafts nothing where they are missing. adaptive: as ``DraftProposer``'s.
    """

    def __init__(self, drafter: DFlashDrafter, k: int | None = None, sample: bool = False,
                 max_tokens: int | None = None, graphs: bool | None = None, page_size: int = 16,
                 adaptive: bool = True):
        bs = drafter.block_size
        self.k = check_k(bs - 1 if k is None else k)
        self.adaptive = bool(adaptive)
        if self.k > bs - 1:
            raise ValueError(f"k = {self.k} exceeds the {bs - 1} drafts of a DFlash block "
                             f"(block_size {bs})")
        self.drafter, self.sample = drafter, bool(sample)
        model = drafter.model
        max_tokens = drafter.max_len if max_tokens is None else max_tokens
        self.cache = new_cache(model, max_tokens, page_size=page_size)
        self.capacity = min(model.max_len, self.cache.max_seq_len,
                            self.cache.num_pages * page_size)
        self.seq = self.cache.new_sequence()  # the context: target token ids by position
        on_cuda = model.device.type == "cuda"
        self.graphs = (on_cuda and model.ops.graph_safe) if graphs is None else graphs
        if self.graphs and not (on_cuda and model.ops.graph_safe):
            raise ValueError("CUDA graphs need a drafter on a CUDA device with a graph-safe "
                             "backend")
        self.meta = static_metadata(model, bs, self.cache, n_logits=bs)
        self.buffers = model.new_buffers(bs, bs)
        self._graph = None
        self._target_seq = None
        self.sampling = SamplingParams()
        self.seed = torch.zeros(1, dtype=torch.int64, device=model.device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=model.device)
        self._drafts = torch.empty(bs - 1, dtype=torch.int32, device=model.device)
        self._probs = None

    def __repr__(self):
        return f"DFlashProposer({self.drafter!r}, k={self.k}, sample={self.sample})"

    @property
    def block_logits(self) -> torch.Tensor:
        """The logits (block_size, vocab) of the latest block pass."""
        return self.buffers.logits

    def begin(self, runner, seq, sampling, seed):
        target = runner.model
        if target.weights.embed is not self.drafter.model.weights.embed:
            raise ValueError("this DFlash drafter was loaded for another target model: load it "
                             "with load_dflash(drafter, target) for the model that generates")
        runner.capture_hidden_states(self.drafter.target_layer_ids, self._observe)
        if seq is not self._target_seq:
            self.cache.release(self.seq)
            self._target_seq = seq
        self.cache.truncate(self.seq, common_prefix_len(self.seq.tokens, seq.tokens))
        if len(self.seq) < len(seq):
            warnings.warn("the DFlash proposer was attached to a sequence whose first "
                          f"{len(seq)} positions it has not seen; it drafts nothing for it",
                          stacklevel=3)
        self.sampling = sampling if self.sample else SamplingParams()
        if not self.sampling.greedy and self._probs is None:
            self._probs = torch.empty(self.drafter.block_size - 1, target.config.vocab_size,
                                      dtype=torch.float32, device=target.device)
        self.seed.fill_(draft_seed(seed))

    def _observe(self, seq, start, ids, hidden_out):
        """After each target step: store the context of its rows (see the module docstring)."""
        if seq is not self._target_seq:
            return
        context = self.seq
        if len(context) > start:
            self.cache.truncate(context, start)
        if len(context) < start:
            return  # a gap: the positions before start were never seen
        try:
            meta = prepare_step(self.cache, [context], [[0] * len(ids)],
                                max_len=self.drafter.max_len)
        except (ContextLengthError, OutOfPagesError):
            return  # past the drafter's cache: no context, and so no drafts, from here on
        self.drafter.store_context(meta, hidden_out, self.cache)
        context.tokens.extend(ids)

    def _run_block(self) -> torch.Tensor:
        def block():
            self.drafter.forward_block(self.meta, self.buffers, self.cache)

        if not self.graphs:
            block()
        else:
            if self._graph is None:
                self._graph = capture_graph(block)
            self._graph.replay()
        return self.buffers.logits

    def propose(self, tokens, k: int) -> Draft:
        tokens = [int(t) for t in tokens]
        k = min(k, self.k)
        last = len(tokens) - 1  # the block starts at the last token's position
        bs = self.drafter.block_size
        if k < 1 or last < 0 or self._target_seq is None or last + bs > self.capacity:
            return Draft()
        context = self.seq
        if not (len(context) >= last and context.tokens[:last] == tokens[:last]):
            self.cache.truncate(context, common_prefix_len(context.tokens, tokens[:last]))
            if len(context) < last:
                return Draft()  # the context lacks positions the target ran without us
        self.cache.truncate(context, last)
        block = [tokens[-1]] + [self.drafter.mask_token_id] * (bs - 1)
        prepare_step(self.cache, [context], [block], all_logits=True,
                     max_len=self.drafter.max_len, out=self.meta)
        try:
            logits = self._run_block()
            params = self.sampling
            probs = None if params.greedy else self._probs[:k]
            self.counter.fill_(last + 1)  # row j + 1 drafts position last + 1 + j
            self.drafter.model.ops.sample_tokens(self._drafts[:k], logits[1:k + 1],
                                                 params.temperature, params.top_k, params.top_p,
                                                 self.seed, self.counter, probs)
            ids = self._drafts[:k].tolist()
        finally:
            self.cache.truncate(context, last)  # the block's pages go back
        return Draft(ids, probs)
