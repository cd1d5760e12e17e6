"""The decoder: a forward step built from the op table's in-place ops on preallocated buffers.

Per layer (hidden states x of the step's n tokens, (n, hidden)):

    h = rmsnorm(x)                     (layer 0)  or  x += delta; h = rmsnorm(x)  (add_rmsnorm)
    qkv = h @ W_qkv.T                   (n, (heads + 2 kv_heads) head_dim); Qwen2: + b_qkv,
                                        added to the float32 sums and rounded once, as a
                                        biased product rounds in transformers
    q = rope(qnorm(q)); cache <- rope(knorm(k)), v          (attention_inputs)
    a = attention(q, cache)             causal, grouped-query, over the paged cache
                                        (both in one op, attention_with_inputs, where the
                                        backend implements it itself)
    delta = a @ W_o.T
    x += delta; h = rmsnorm(x)          (add_rmsnorm)
    m = silu(h @ W_gate.T) * (h @ W_up.T)      (linear_swiglu; Apertus: xielu(h @ W_up.T))
    delta = m @ W_down.T

Granite scales the embeddings and every delta before it joins x, and divides the logits
(``ModelConfig.multipliers``: in-place torch ops, the same on every backend, rounded where
transformers rounds them). Gemma 3 (``gemma.py``) scales the embeddings, runs its norms on
the optional ``gemma_rmsnorm`` ops, or torch ops where a backend has none (float32, ``1 + w``,
one rounding, where the rmsnorm ops round twice), norms each delta before it joins x, takes
``m = gelu_tanh(h @ W_gate.T) * (h @ W_up.T)`` (the product by ``linear``, then torch's gelu
and multiply, as transformers rounds them), and on its local layers runs ``attention_window``
(when the window is shorter than max_len: below it, plain causal attention sees the same
positions).

An FP8 model (e4m3 weights and inputs, ``tileinfer.backend.fp8``) on a backend with the optional
e4m3-input ops quantizes h in the add_rmsnorm before the qkv and gate/up projections
(``add_rmsnorm_e4m3``), which then take its e4m3 rows (``linear_e4m3_input``,
``linear_swiglu_e4m3_input``) instead of quantizing h themselves: the same bits, fewer launches.

Then the rows that get logits are gathered, ``x += delta`` and the final norm run on them only,
and ``logits = h @ W_lm_head.T`` is written as float32 straight from the product's float32
accumulation (the ``linear`` contract with a float32 out), on every backend. transformers rounds
a bf16 model's logits to bf16 before ``.float()``; at the logits' scale (e.g. 0.125 near 25) that
rounding turns near ties into exact ties, which backends that sum in different orders then break
differently, so TileInfer keeps the unrounded sums.

``Model.forward_step`` never synchronizes with the host (no ``.item()``, no ``.tolist()``) and
allocates nothing but Gemma's norms' float32 temporaries (from the graph's pool when captured):
only op-table calls, views, torch's out= forms of a row gather (``index_select``) and copies
(``hidden_out``), Qwen2's bias add, Granite's in-place scalings and Gemma's torch ops, so a
runner can capture it in a CUDA graph with static step metadata and ``StepBuffers`` and replay
it (whether the ops themselves are capturable is the backend's ``graph_safe``).

The model layer knows nothing of the engine: a step (``tileinfer.engine.kv.step.StepMetadata``) and
the KV cache (``tileinfer.engine.kv.cache.PagedKVCache``) reach ``forward_step`` as arguments, read
through ``meta.ids``, ``meta.logit_rows``, ``meta.attention`` and ``cache.layer(i)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backend import Invariance, OpTable, QKTransform
from ..backend.fp8 import E4M3
from .config import ModelConfig
from .gemma import gemma_qk_norms, gemma_rmsnorm
from .quant import linear_operands
from .rope import rope_tables
from .weights import ModelWeights


@dataclass
class StepBuffers:
    """Preallocated activations of steps of n tokens with m logit rows (``Model.new_buffers``).

    hidden_out: layer index -> (n, hidden) tensor receiving that layer's output hidden states
    (the residual stream after the layer, transformers' ``hidden_states[layer + 1]``), for the
    layers asked for; a speculative drafter (DFlash) reads them.
    """

    hidden: torch.Tensor  # (n, hidden) residual stream
    normed: torch.Tensor  # (n, hidden) normalized input of the next projection
    qkv: torch.Tensor  # (n, qkv_size)
    q: torch.Tensor  # (n, heads, head_dim) queries after norm + RoPE
    attn: torch.Tensor  # (n, heads, head_dim) attention output
    delta: torch.Tensor  # (n, hidden) output of o_proj / down_proj, added to the residual
    act: torch.Tensor  # (n, intermediate) MLP activation
    gate_up: torch.Tensor | None  # (n, 2 * intermediate) scratch of linear_swiglu
    logit_hidden: torch.Tensor  # (m, hidden) gathered residual rows
    logit_delta: torch.Tensor  # (m, hidden) gathered last delta rows
    logit_normed: torch.Tensor  # (m, hidden)
    logits: torch.Tensor  # (m, vocab) float32
    workspace: object  # the attention op's scratch, or None
    max_context_len: int  # the longest context the workspace is sized for
    hidden_out: dict[int, torch.Tensor] = field(default_factory=dict)
    qkv_sums: torch.Tensor | None = None  # (n, qkv_size) float32, models with a qkv bias
    post: torch.Tensor | None = None  # (n, hidden) a delta before Gemma's norm of it
    # normed's e4m3 rows (n, hidden) and scales (n,), where the norms quantize (e4m3_norms)
    normed_q: torch.Tensor | None = None
    normed_scale: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.hidden.shape[0]

    @property
    def num_logits(self) -> int:
        return self.logits.shape[0]


class Model:
    """A loaded model: config, weights, the op table, RoPE tables, dtype, device, max_len."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, ops: OpTable,
                 dtype: torch.dtype, device, max_len: int, model_dir: Path | None = None,
                 quantize: str | None = None, batch_invariant: bool = False):
        self.config, self.weights, self.ops = config, weights, ops
        # Every step's rows the same bits whatever else the step holds (docs/determinism.md).
        self.batch_invariant = batch_invariant
        self.dtype, self.device, self.max_len = dtype, torch.device(device), max_len
        self.model_dir, self.quantize = model_dir, quantize
        self.cos, self.sin = rope_tables(config, max_len, dtype, self.device)
        # Per layer: the q/k norms and RoPE tables between the qkv projection and attention. A
        # layer without RoPE (SmolLM3) gets the tables of no rotation (cos 1, sin 0: x c - y s
        # is x exactly), so every backend's op runs it unchanged; Gemma's local layers get the
        # tables of the local base.
        rotated = config.rope_layers or (True,) * config.num_layers
        tables = [(self.cos, self.sin) if rope else None for rope in rotated]
        if not all(rotated):
            still = (torch.ones_like(self.cos), torch.zeros_like(self.sin))
            tables = [t or still for t in tables]
        # Per layer: its attention window where it can hide a position (None: plain attention).
        windows = config.layer_windows or (None,) * config.num_layers
        self.windows = [w if w is not None and w < max_len else None for w in windows]
        self.embed_scale = None  # Gemma: the embeddings' scale, rounded to dtype as transformers
        if config.gemma is not None:
            g = config.gemma
            local = rope_tables(dataclasses.replace(config, rope_theta=g.local_rope_theta,
                                                    rope_scaling=None), max_len, dtype,
                                self.device)
            tables = [local if window is not None else t
                      for t, window in zip(tables, g.layer_windows)]
            self.embed_scale = float(torch.tensor(config.hidden_size ** 0.5).to(dtype))
        # Gemma's q/k norms run in the model (gemma_rmsnorm), not in attention_inputs.
        gemma = config.gemma is not None
        self.qk = [QKTransform(*table, None if gemma else layer.q_norm,
                               None if gemma else layer.k_norm, config.rms_norm_eps)
                   for layer, table in zip(weights.layers, tables)]
        # FP8 weights (W8A8) in every layer's qkv and gate/up projections, which the norms
        # before them may quantize for (e4m3_norms)
        self._e4m3_inputs = config.gemma is None and all(
            linear_operands(w)[0].dtype == E4M3 for layer in weights.layers
            for w in (layer.qkv, layer.up))
        # What the layers above keep for this model while it is loaded (the engine's runtime:
        # KV pool, static steps, CUDA graphs), each with a close() that ``close`` calls.
        self.attachments: dict = {}

    def close(self):
        """Give back what the model holds beyond its weights (its runtime's KV pool, static
        steps and CUDA graphs); the model stays usable and makes them again if used."""
        attachments, self.attachments = self.attachments, {}
        for part in attachments.values():
            part.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def backend(self) -> str:
        return self.ops.name

    @property
    def fused_attention(self) -> bool:
        """Whether the backend runs attention_inputs + attention as one op of its own."""
        return self.ops.attention_with_inputs is not None

    @property
    def e4m3_norms(self) -> bool:
        """Whether the norms before the qkv and gate/up projections write their rows in e4m3
        for them (add_rmsnorm_e4m3), where the projections would each quantize their input: an
        FP8 model on a backend with the optional e4m3-input ops. The same bits either way."""
        ops = self.ops
        return self._e4m3_inputs and None not in (ops.add_rmsnorm_e4m3, ops.linear_e4m3_input,
                                                  ops.linear_swiglu_e4m3_input)

    def __repr__(self):
        c = self.config
        return (f"Model({c.model_type}, layers={c.num_layers}, hidden={c.hidden_size}, "
                f"backend={self.backend!r}, dtype={self.dtype}, device={self.device}, "
                f"max_len={self.max_len}, quantize={self.quantize!r})")

    def new_buffers(self, n_tokens: int, n_logits: int, hidden_layers=(),
                    max_context_len: int | None = None) -> StepBuffers:
        """Buffers for steps of n_tokens tokens and n_logits logit rows.

        hidden_layers: layers whose output hidden states the step writes to ``hidden_out``.
        max_context_len: the longest context the attention workspace must serve (default
        max_len, which covers every step ``prepare_step`` builds for this model).
        """
        c, dt, dev = self.config, self.dtype, self.device
        max_context_len = max_context_len or self.max_len

        def unwritten(*shape, dtype=dt):
            # NaN until an op writes it: an op that leaves its output unwritten (or returns a
            # new tensor instead of writing) then shows as non-finite logits, never as
            # plausible garbage (engine/runtime/finite.py).
            return torch.full(shape, float("nan"), dtype=dtype, device=dev)

        for layer in hidden_layers:
            if not 0 <= layer < c.num_layers:
                raise ValueError(f"hidden_layers: layer {layer} is not in 0..{c.num_layers - 1}")
        self.ops.reserve_scratch(dev)
        e4m3 = self.e4m3_norms
        return StepBuffers(
            hidden=unwritten(n_tokens, c.hidden_size),
            normed=unwritten(n_tokens, c.hidden_size),
            qkv=unwritten(n_tokens, c.qkv_size),
            q=unwritten(n_tokens, c.num_heads, c.head_dim),
            attn=unwritten(n_tokens, c.num_heads, c.head_dim),
            delta=unwritten(n_tokens, c.hidden_size),
            act=unwritten(n_tokens, c.intermediate_size),
            gate_up=unwritten(n_tokens, 2 * c.intermediate_size) if c.gated else None,
            logit_hidden=unwritten(n_logits, c.hidden_size),
            logit_delta=unwritten(n_logits, c.hidden_size),
            logit_normed=unwritten(n_logits, c.hidden_size),
            logits=unwritten(n_logits, c.vocab_size, dtype=torch.float32),
            workspace=self.ops.attention_workspace(n_tokens, c.num_heads, c.head_dim,
                                                   max_context_len, dev),
            max_context_len=max_context_len,
            hidden_out={layer: unwritten(n_tokens, c.hidden_size) for layer in hidden_layers},
            qkv_sums=(unwritten(n_tokens, c.qkv_size, dtype=torch.float32) if c.qkv_bias
                      else None),
            post=unwritten(n_tokens, c.hidden_size) if c.gemma is not None else None,
            normed_q=unwritten(n_tokens, c.hidden_size, dtype=E4M3) if e4m3 else None,
            normed_scale=unwritten(n_tokens, dtype=torch.float32) if e4m3 else None,
        )

    def forward_step(self, meta, buffers: StepBuffers, cache, causal: bool = True,
                     batch_invariant: bool = True) -> torch.Tensor:
        """Run one step; returns ``buffers.logits`` (m, vocab) float32 for meta.logit_rows.

        meta: the step (``StepMetadata``); cache: the KV cache it was prepared on, which already
        holds pages for the step; the step writes the keys and values of its tokens at its slots.
        causal=False: every row sees the whole context of its sequence (a DFlash block).
        batch_invariant: the linear ops' flag (hookspecs.linear). True for one sequence's steps
        (a verify row must equal the 1-token step's); the batched engine passes False, since its
        rows are separate sequences and the fastest kernel for n rows may sum in another order.
        A model loaded with ``batch_invariant=True`` ignores it: every step runs
        ``Invariance.BATCH`` linears and batch-invariant attention.
        Graph-capturable: see the module docstring.
        """
        if (buffers.num_tokens, buffers.num_logits) != (meta.num_tokens, meta.num_logits):
            raise ValueError(f"buffers for {buffers.num_tokens} tokens / {buffers.num_logits} "
                             f"logit rows do not fit a step of {meta.num_tokens} / "
                             f"{meta.num_logits}")
        if meta.max_context_len > buffers.max_context_len:
            raise ValueError(f"the step's max_context_len {meta.max_context_len} exceeds the "
                             f"buffers' {buffers.max_context_len}")
        ops, c, w, b = self.ops, self.config, self.weights, buffers
        n, step, inv = meta.num_tokens, meta.attention, batch_invariant
        if self.batch_invariant:
            step, inv = dataclasses.replace(step, batch_invariant=True), Invariance.BATCH
        scales = c.multipliers
        # the norms write normed's e4m3 rows for the projections after them (all but layer 0's)
        e4m3 = self.e4m3_norms and b.normed_q is not None
        ops.embed(b.hidden, w.embed, meta.ids)
        if scales is not None:
            b.hidden.mul_(scales.embedding)
        if self.embed_scale is not None:
            b.hidden.mul_(self.embed_scale)
        for i, layer in enumerate(w.layers):
            if i == 0:
                self._norm(b.normed, b.hidden, layer.attn_norm)
            else:
                self._add_norm(b.hidden, b.normed, b.delta, layer.attn_norm, b if e4m3 else None)
                if i - 1 in b.hidden_out:  # b.hidden is now layer i - 1's output
                    b.hidden_out[i - 1].copy_(b.hidden)
            kv = cache.layer(i)
            if layer.qkv_bias is None and e4m3 and i > 0:
                ops.linear_e4m3_input(b.qkv, b.normed_q, b.normed_scale,
                                      *linear_operands(layer.qkv), inv)
            elif layer.qkv_bias is None:
                ops.linear(b.qkv, b.normed, *linear_operands(layer.qkv), inv)
            else:  # the float32 sums (linear's float32 out), plus the bias, rounded once
                ops.linear(b.qkv_sums, b.normed, *linear_operands(layer.qkv), inv)
                torch.add(b.qkv_sums, layer.qkv_bias, out=b.qkv)
            if c.gemma is not None:
                gemma_qk_norms(b.qkv, layer.q_norm, layer.k_norm, c, self.batch_invariant, ops)
            window = self.windows[i]
            if self.fused_attention and window is None:
                ops.attention_with_inputs(b.attn, b.q, kv, b.qkv, self.qk[i], step,
                                          c.attention_scale, causal, b.workspace)
            else:
                ops.attention_inputs(b.q, kv, b.qkv, self.qk[i], step)
                if window is None:
                    ops.attention(b.attn, b.q, kv, step, c.attention_scale, causal, b.workspace)
                else:
                    ops.attention_window(b.attn, b.q, kv, step, c.attention_scale, window,
                                         b.workspace)
            self._delta(b, b.attn.view(n, c.q_size), layer.o, layer.post_attn_norm, inv)
            self._add_norm(b.hidden, b.normed, b.delta, layer.mlp_norm, b if e4m3 else None)
            if layer.xielu is not None:
                ops.linear_xielu(b.act, b.normed, *linear_operands(layer.up), layer.xielu, inv)
            elif c.mlp == "geglu":
                ops.linear(b.gate_up, b.normed, *linear_operands(layer.up), inv)
                gate, up = b.gate_up.split(c.intermediate_size, dim=1)
                torch.ops.aten.gelu.out(gate, approximate="tanh", out=b.act)
                b.act.mul_(up)
            elif e4m3:
                ops.linear_swiglu_e4m3_input(b.act, b.normed_q, b.normed_scale,
                                             *linear_operands(layer.up), b.gate_up, inv)
            else:
                ops.linear_swiglu(b.act, b.normed, *linear_operands(layer.up), b.gate_up, inv)
            self._delta(b, b.act, layer.down, layer.post_mlp_norm, inv)
        last = c.num_layers - 1
        if last in b.hidden_out:
            torch.add(b.hidden, b.delta, out=b.hidden_out[last])
        return self._logits(meta, b, inv)

    def _norm(self, out, x, weight):
        """The rmsnorm op; Gemma's the gemma_rmsnorm op where the backend has it, else the
        model's torch ops (gemma.gemma_rmsnorm)."""
        if self.config.gemma is None:
            self.ops.rmsnorm(out, x, weight, self.config.rms_norm_eps)
        else:
            gemma_rmsnorm(out, x, weight, self.config.rms_norm_eps, self.batch_invariant,
                          self.ops)

    def _add_norm(self, residual, out, delta, weight, e4m3: StepBuffers | None = None):
        """The add_rmsnorm op (residual += delta, then its norm); with e4m3, add_rmsnorm_e4m3,
        out's e4m3 rows into e4m3.normed_q and normed_scale as well; Gemma's add_gemma_rmsnorm
        where the backend has it, else the add and the model's norm."""
        eps = self.config.rms_norm_eps
        if e4m3 is not None:
            self.ops.add_rmsnorm_e4m3(residual, out, e4m3.normed_q, e4m3.normed_scale, delta,
                                      weight, eps)
        elif self.config.gemma is None:
            self.ops.add_rmsnorm(residual, out, delta, weight, eps)
        elif self.ops.add_gemma_rmsnorm is not None:
            self.ops.add_gemma_rmsnorm(residual, out, delta, weight, eps)
        else:
            residual.add_(delta)
            gemma_rmsnorm(out, residual, weight, eps, self.batch_invariant, self.ops)

    def _delta(self, b: StepBuffers, x: torch.Tensor, weight, post_norm, inv):
        """b.delta = x @ W.T as it joins the residual stream: Gemma's normed by post_norm,
        Granite's scaled."""
        if post_norm is None:
            self.ops.linear(b.delta, x, *linear_operands(weight), inv)
        else:
            self.ops.linear(b.post, x, *linear_operands(weight), inv)
            self._norm(b.delta, b.post, post_norm)
        if self.config.multipliers is not None:
            b.delta.mul_(self.config.multipliers.residual)

    def _logits(self, meta, b: StepBuffers, batch_invariant: bool = True) -> torch.Tensor:
        """The last residual add, the final norm and the lm_head, on the logit rows only."""
        w = self.weights
        # A step with a logit row per token (decode, verify) has them all, in order: no gather.
        if meta.num_logits == meta.num_tokens:
            hidden, delta = b.hidden, b.delta
        else:
            hidden, delta = b.logit_hidden, b.logit_delta
            torch.index_select(b.hidden, 0, meta.logit_rows, out=hidden)
            torch.index_select(b.delta, 0, meta.logit_rows, out=delta)
        self._add_norm(hidden, b.logit_normed, delta, w.norm)
        # float32 out: the float32 sums, unrounded (float and INT8 heads alike).
        self.ops.linear(b.logits, b.logit_normed, *linear_operands(w.lm_head), batch_invariant)
        if self.config.multipliers is not None:
            b.logits.div_(self.config.multipliers.logits)
        return b.logits


def max_length(model: Model) -> int:
    """The longest sequence model can process: the positions its RoPE tables cover."""
    return model.max_len
