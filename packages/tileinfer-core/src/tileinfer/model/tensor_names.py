"""The tensors of a transformers checkpoint, by architecture: their names in layer i and their
shapes (``checkpoint_shapes``, which ``weights.check_checkpoint`` compares with the files before
anything is loaded), and which of them the loader stacks into its fused linears (``fused_parts``).

Tensor names per architecture (``model.layers.{i}.`` prefix):

=====================  ============================  ======================================
                       Llama/Mistral/Qwen/SmolLM3    Apertus
=====================  ============================  ======================================
norm before attention  input_layernorm               attention_layernorm
norm before the MLP    post_attention_layernorm      feedforward_layernorm
                       (Gemma 3: pre_feedforward_layernorm; its post_attention_layernorm and
                       post_feedforward_layernorm norm the attention and MLP outputs)
attention              self_attn.{q,k,v,o}_proj      self_attn.{q,k,v,o}_proj
q/k/v biases           self_attn.{q,k,v}_proj.bias
                       (Qwen2)
per-head q/k norm      self_attn.{q,k}_norm (Qwen3)  self_attn.{q,k}_norm
MLP                    mlp.{gate,up,down}_proj       mlp.{up,down}_proj,
                                                     mlp.act_fn.{alpha_p,alpha_n,beta,eps}
Phi-3                  self_attn.qkv_proj,
                       mlp.gate_up_proj
=====================  ============================  ======================================
"""

from __future__ import annotations

from .config import ModelConfig


def layer_tensor_names(config: ModelConfig) -> dict[str, str]:
    """Role -> tensor name suffix in layer i (``model.layers.{i}.`` + suffix)."""
    apertus = config.model_type == "apertus"
    names = {
        "attn_norm": ("attention_layernorm" if apertus else "input_layernorm") + ".weight",
        "mlp_norm": ("feedforward_layernorm" if apertus else "post_attention_layernorm")
        + ".weight",
        "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
        "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
        "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
    }
    if config.qk_norm:
        names.update(q_norm="self_attn.q_norm.weight", k_norm="self_attn.k_norm.weight")
    if config.qkv_bias:
        names.update(q_bias="self_attn.q_proj.bias", k_bias="self_attn.k_proj.bias",
                     v_bias="self_attn.v_proj.bias")
    if config.gemma is not None:
        names.update(mlp_norm="pre_feedforward_layernorm.weight",
                     post_attn_norm="post_attention_layernorm.weight",
                     post_mlp_norm="post_feedforward_layernorm.weight")
    if config.gated:
        names["gate"] = "mlp.gate_proj.weight"
    else:
        names.update({n: f"mlp.act_fn.{n}" for n in ("alpha_p", "alpha_n", "beta", "eps")})
    if config.model_type == "phi3":  # stored fused, in the order this engine fuses them
        for role in ("q", "k", "v", "gate", "up"):
            del names[role]
        names.update(qkv="self_attn.qkv_proj.weight", gate_up="mlp.gate_up_proj.weight")
    return names


def fused_parts(config: ModelConfig) -> dict[str, list[tuple[str, int]]]:
    """For the fused linears ``qkv`` and ``up``: the roles of ``layer_tensor_names`` stacked
    into each, in order, with their rows."""
    c = config
    if c.model_type == "phi3":
        return {"qkv": [("qkv", c.qkv_size)], "up": [("gate_up", 2 * c.intermediate_size)]}
    gate = [("gate", c.intermediate_size)] if c.gated else []
    return {"qkv": [("q", c.q_size), ("k", c.kv_size), ("v", c.kv_size)],
            "up": gate + [("up", c.intermediate_size)]}


def checkpoint_shapes(config: ModelConfig, lm_head: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor this engine reads from a checkpoint for config, with its shape as
    transformers saves it (xIELU scalars: ``()``, or ``(1,)`` for alpha_p/alpha_n; both are
    accepted). lm_head: include ``lm_head.weight`` (untied models)."""
    c = config
    hidden, inter = c.hidden_size, c.intermediate_size
    roles = {"attn_norm": (hidden,), "mlp_norm": (hidden,), "post_attn_norm": (hidden,),
             "post_mlp_norm": (hidden,), "q": (c.q_size, hidden),
             "k": (c.kv_size, hidden), "v": (c.kv_size, hidden), "o": (hidden, c.q_size),
             "gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter),
             "q_norm": (c.head_dim,), "k_norm": (c.head_dim,), "q_bias": (c.q_size,),
             "k_bias": (c.kv_size,), "v_bias": (c.kv_size,), "qkv": (c.qkv_size, hidden),
             "gate_up": (2 * inter, hidden), "alpha_p": (1,), "alpha_n": (1,),
             "beta": (), "eps": ()}
    shapes = {"model.embed_tokens.weight": (c.vocab_size, hidden)}
    layer_names = layer_tensor_names(c)
    for i in range(c.num_layers):
        for role, suffix in layer_names.items():
            shapes[f"model.layers.{i}.{suffix}"] = roles[role]
    shapes["model.norm.weight"] = (hidden,)
    if lm_head:
        shapes["lm_head.weight"] = (c.vocab_size, hidden)
    return shapes
