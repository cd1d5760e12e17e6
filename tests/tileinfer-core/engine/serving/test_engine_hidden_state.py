"""An engine request for its prompt's last final hidden state (``hidden_state=True``: what an
embedding model's last-token pooling reads) against transformers' ``last_hidden_state`` of the
base model, float32 on ref: alone and among other requests, through chunked prefill and a
prefix-cache hit (the same bits there in batch-invariant mode), and from a base model's
checkpoint (tensors without the ``model.`` prefix, as Qwen3-Embedding ships them)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tileinfer import LLMEngine, RequestError, SamplingParams, load_model
from tiny_models import prompt_ids, single_torch_thread, tiny  # noqa: F401

transformers = pytest.importorskip("transformers")
MAX_LEN = 128


def hidden_states(engine, prompts, **others) -> list[torch.Tensor]:
    """Each prompt's hidden state, requested beside ``others`` (add_request arguments)."""
    ids = [engine.add_request(p, max_new_tokens=0, hidden_state=True) for p in prompts]
    extra = [engine.add_request(**o) for o in others.get("requests", [])]
    found = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id in ids:
                assert out.finished and out.finish_reason == "length" and not out.new_tokens
                found[out.request_id] = torch.tensor(out.hidden_state)
            else:
                assert out.request_id in extra and out.hidden_state is None
    return [found[i] for i in ids]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_the_hidden_state_is_transformers_last_hidden_state(tiny, arch):
    folder = tiny.directory(arch, dtype=torch.float32)
    prompts = [prompt_ids(n, seed=70 + n) for n in (5, 23, 40)]
    base = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = [base(torch.tensor([p])).last_hidden_state[0, -1] for p in prompts]
    model = load_model(folder, dtype=torch.float32, backend="ref", max_len=MAX_LEN)
    alone = [hidden_states(LLMEngine(model, num_pages=40), [p])[0] for p in prompts]
    for got, want in zip(alone, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Together, beside generating requests, in chunks of 16 tokens, then again from the cache.
    engine = LLMEngine(model, num_pages=40, max_step_tokens=16)
    others = [dict(prompt_ids=prompt_ids(9, seed=3), max_new_tokens=6, stop_ids=[],
                   sampling=SamplingParams(0.0))]
    for _ in range(2):
        for got, want in zip(hidden_states(engine, prompts, requests=others), expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert engine.stats()["prefix_hit_tokens"] > 0


def test_the_same_bits_in_any_batch_in_batch_invariant_mode(tiny):
    model = load_model(tiny.directory("qwen3", dtype=torch.float32), dtype=torch.float32,
                       backend="ref", max_len=MAX_LEN, batch_invariant=True)
    prompts = [prompt_ids(n, seed=80 + n) for n in (7, 30)]
    alone = [hidden_states(LLMEngine(model, num_pages=40), [p])[0] for p in prompts]
    engine = LLMEngine(model, num_pages=40, max_step_tokens=16)
    others = [dict(prompt_ids=prompt_ids(11, seed=4), max_new_tokens=5, stop_ids=[],
                   sampling=SamplingParams(0.0))]
    for _ in range(2):  # the second time from the prefix cache
        together = hidden_states(engine, prompts, requests=others)
        assert all(torch.equal(a, b) for a, b in zip(together, alone))


def test_a_base_models_checkpoint_reads_as_the_causal_lm(tiny, tmp_path):
    folder = tiny.directory("qwen3", dtype=torch.float32)
    base = tmp_path / "base"
    shutil.copytree(folder, base)
    tensors = load_file(base / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in tensors.items() if k != "lm_head.weight"}
              | {"lm_head.weight": tensors["lm_head.weight"]}, base / "model.safetensors")
    prompt = prompt_ids(12, seed=9)
    got = [hidden_states(LLMEngine(load_model(f, dtype=torch.float32, backend="ref",
                                              max_len=MAX_LEN), num_pages=40), [prompt])[0]
           for f in (folder, base)]
    assert torch.equal(got[0], got[1])


def test_a_hidden_state_request_runs_only_its_prompt(tiny):
    engine = LLMEngine(load_model(tiny.directory("llama", dtype=torch.float32),
                                  dtype=torch.float32, backend="ref", max_len=MAX_LEN),
                       num_pages=40)
    with pytest.raises(RequestError, match="max_new_tokens must be 0"):
        engine.add_request([1, 2, 3], max_new_tokens=4, hidden_state=True)
