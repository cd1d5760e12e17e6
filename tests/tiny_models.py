"""Random-weight tiny models of the nine architectures, built and saved with transformers.

The weights are drawn again after construction (seeded), norm weights and the xIELU parameters
included, so that a loader which ignored a norm weight or swapped two tensors would show in the
logits (transformers initializes norms to ones). Linear and embedding weights have std 0.05,
which gives logits of std ~0.8 (max ~3.5): clear greedy winners, no saturated softmax.

``TinyStore`` (the session fixture ``tiny``) builds each model once, saves it in float32 and
bfloat16, and caches transformers' reference results on a fixed prompt.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

transformers.logging.set_verbosity_error()

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "apertus", "smollm3", "granite", "phi3", "gemma3")

COMMON = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
              max_position_embeddings=256)

# llama3 scaling with a short original context, so that within the test's 60 positions the
# three frequency bands (kept, interpolated, divided by factor) all occur.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}

# YaRN (Qwen3's long-context scaling) over a short original context: within the test's positions
# pairs are kept, blended and interpolated, and the tables are scaled by 0.1 ln 8 + 1.
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 8.0,
             "original_max_position_embeddings": 32}

PROMPT_LEN = 20  # crosses a page boundary with page_size 16
SEED_OF_ARCH = {"llama": 0, "mistral": 1, "qwen3": 2, "apertus": 3, "qwen2": 4, "smollm3": 5,
                "granite": 6, "phi3": 7, "gemma3": 8}

_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "apertus": ("ApertusConfig", "ApertusForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}

# Gemma 3 (gemma3_text): a local layer whose window (16) the tests' prompts and answers pass, then
# a global one; the local and global RoPE bases, linear scaling on the global one, and an
# attention scale that is not head_dim ** -0.5.
GEMMA3 = dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"],
              query_pre_attn_scalar=48, rope_parameters={
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                  "full_attention": {"rope_type": "linear", "factor": 2.0,
                                     "rope_theta": 100000.0}})


def tiny_config(arch: str, tie: bool = False, rope=None, **overrides):
    kwargs = dict(COMMON, tie_word_embeddings=tie)
    if rope is not None:
        kwargs["rope_parameters"] = dict(rope)
    if arch == "mistral":
        # transformers' default window; above the max_len the tests load with, so it has no
        # effect and plain causal attention is exact (see tileinfer.config.check_max_len).
        kwargs["sliding_window"] = 4096
    if arch == "smollm3":
        kwargs["no_rope_layers"] = [1, 0]  # the second layer without RoPE
        kwargs.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)  # in the tiny vocabulary
    if arch == "phi3":
        kwargs.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)  # in the tiny vocabulary
    if arch == "gemma3":
        kwargs.update(GEMMA3)
    if arch == "granite":  # none of them 1, and the attention's not head_dim ** -0.5
        kwargs.update(embedding_multiplier=3.0, residual_multiplier=0.5,
                      attention_multiplier=0.2, logits_scaling=4.0)
    # Apertus keeps its default RoPE: llama3 scaling with rope_theta 12e6.
    return getattr(transformers, _CLASSES[arch][0])(**kwargs | overrides)


@torch.no_grad()
def build_tiny(arch: str, tie: bool = False, seed: int | None = None, rope=None, std=0.05,
               **overrides):
    """A float32 transformers model with seeded random weights, in eval mode (overrides: config
    fields)."""
    seed = SEED_OF_ARCH[arch] if seed is None else seed
    config = tiny_config(arch, tie, rope, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, _CLASSES[arch][1])(config).eval()
    redraw_weights(model, seed, std, norm_base=0.0 if arch == "gemma3" else 1.0)
    _fixed_length_generation(model)
    return model


@torch.no_grad()
def redraw_weights(model, seed: int, std: float = 0.05, norm_base: float = 1.0):
    """Draw every parameter of a transformers model again from one seeded generator: norm
    weights norm_base + 0.2 * noise (Gemma's norms scale by 1 + w: norm_base 0 gives the same
    scales), linear and embedding weights std * noise."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        if name.endswith("norm.weight"):
            param.copy_(norm_base + 0.2 * noise)
        elif ".act_fn." in name:  # xIELU alpha_p / alpha_n (before softplus)
            param.copy_(param + 0.3 * noise)
        elif name.endswith(".bias"):  # Qwen2's q/k/v biases: as large as the products they shift
            param.copy_(0.5 * noise)
        else:
            param.copy_(std * noise)


def _fixed_length_generation(model):
    model.generation_config.eos_token_id = None  # greedy runs of a fixed length
    model.generation_config.pad_token_id = 0


def save_tiny(model, directory, dtype=torch.float32, **kwargs) -> Path:
    """save_pretrained in dtype (of a copy: model stays float32)."""
    copy.deepcopy(model).to(dtype).save_pretrained(directory, **kwargs)
    return Path(directory)


def load_reference(directory, dtype):
    """The saved model loaded back by transformers in dtype: the reference to compare with."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    _fixed_length_generation(model)
    return model


def prompt_ids(n: int = PROMPT_LEN, seed: int = 1, vocab: int = COMMON["vocab_size"]):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@dataclass
class Reference:
    """transformers' results on a saved tiny model: prefill logits (all prompt positions), and
    a greedy generate's tokens with the logits each step saw."""

    directory: Path
    prompt: list[int]
    prefill_logits: torch.Tensor  # (len(prompt), vocab) float32
    tokens: list[int]
    step_logits: torch.Tensor  # (steps, vocab) float32; row i chose tokens[i]


@torch.no_grad()
def reference_run(directory, dtype, prompt, steps) -> Reference:
    model = load_reference(directory, dtype)
    ids = torch.tensor([prompt])
    prefill = model(ids).logits[0].float()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                         do_sample=False, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    return Reference(Path(directory), list(prompt), prefill, tokens, torch.cat(out.logits).float())


def _rope_name(rope) -> str | None:
    """The saved folders' and references' key of a RoPE dict: one of each type per model."""
    return None if rope is None else rope["rope_type"]


class TinyStore:
    """Tiny models saved once per session, and transformers' results on them."""

    def __init__(self, root: Path):
        self.root = root
        self._models, self._dirs, self._refs = {}, {}, {}

    def model(self, arch, tie=False, rope=None):
        key = (arch, tie, None if rope is None else tuple(sorted(rope.items())))
        if key not in self._models:
            self._models[key] = build_tiny(arch, tie, rope=rope)
        return self._models[key]

    def directory(self, arch, tie=False, dtype=torch.float32, rope=None) -> Path:
        key = (arch, tie, dtype, _rope_name(rope))
        if key not in self._dirs:
            name = "-".join([arch, "tied" if tie else "untied", str(dtype).removeprefix("torch.")]
                            + ([_rope_name(rope)] if rope else []))
            self._dirs[key] = save_tiny(self.model(arch, tie, rope), self.root / name, dtype)
        return self._dirs[key]

    def reference(self, arch, tie=False, dtype=torch.float32, rope=None, steps=40) -> Reference:
        key = (arch, tie, dtype, _rope_name(rope), steps)
        if key not in self._refs:
            self._refs[key] = reference_run(self.directory(arch, tie, dtype, rope), dtype,
                                            prompt_ids(), steps)
        return self._refs[key]


class WordTokenizer:
    """What a ChatSession asks of a tokenizer (encode and decode) for a tiny vocabulary: words
    to ids by a hash into it, ids back to "w<id>"."""

    def encode(self, text, add_special_tokens=False):
        return [sum(map(ord, word)) % 90 + 2 for word in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids)


@pytest.fixture(autouse=True)
def single_torch_thread():
    """Run each test of a module that imports this fixture on one torch thread.

    Tiny models gain nothing from more, and on a machine whose cores are shared with other
    jobs torch's worker threads spin waiting for each other: a 40-step decode measured 50x
    slower with 2 threads than with 1 under load.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyStore:
    return TinyStore(tmp_path_factory.mktemp("tiny_models"))


def bf16_logit_tolerance(reference_logits: torch.Tensor) -> float:
    """8 bf16 ulps at the scale of the logits: 2**-5 * max|logit|.

    bf16 keeps 8 significant bits, so one rounding of a value near the largest logit s moves it
    by up to 2**-9 s, one ulp is 2**-8 s. Each logit comes out of a chain of ~10 bf16 roundings
    per layer (norms, projections, RoPE, attention, activation, residual adds) in which this
    engine and transformers round at slightly different places (the op contract rounds RoPE and
    attention once, in float32, where transformers' CPU path rounds several times), and the
    differences propagate through the layers. Measured on these models: up to 3 ulps
    (0.047 at s = 3.3); the tolerance leaves a margin of over 2x.
    """
    return 2.0 ** -5 * float(reference_logits.abs().max())
