"""Non-finite logits end a request with a clear error naming the token and the backend, in every
path; in the engine only the request they come from fails. NaN enters through one embedding
row, so only a sequence holding that token computes NaN (the rows of a batched step and the
keys of other sequences never mix with it); or through a plugin op that writes NaN, writes
nothing, or returns its result instead of writing it; or through weights whose activations
overflow."""

from __future__ import annotations

import pytest
import torch

from tileinfer import (LLMEngine, NgramProposer, NonFiniteLogitsError, generate, load_model,
                       runtime_of)
from tileinfer.backend import BackendInfo, hookimpl, registry
from tiny_models import prompt_ids, tiny  # noqa: F401

POISON = 7  # the token whose embedding is NaN


@pytest.fixture
def model(tiny):
    model = load_model(tiny.directory("llama"), dtype=torch.float32, max_len=96)
    model.weights.embed[POISON] = float("nan")  # after loading, which refuses NaN weights
    return model


def clean_prompt(n, seed):
    return [t if t != POISON else POISON + 1 for t in prompt_ids(n, seed=seed)]


@pytest.mark.parametrize("speculative", [None, NgramProposer()])
def test_generate_raises_naming_the_token_and_leaves_the_pool_as_it_was(model, speculative):
    with pytest.raises(NonFiniteLogitsError, match="generated token 0 on backend 'ref'"):
        generate(model, clean_prompt(9, 1) + [POISON], 5, stop_ids=[],
                 speculative=speculative)
    assert runtime_of(model).live_pages() == 0
    out = generate(model, clean_prompt(9, 1), 5, stop_ids=[])  # the model still answers
    assert len(out) == 5


def test_only_the_request_with_nan_fails_in_the_engine(model):
    engine = LLMEngine(model, cpu_tokens=2048, max_running=4)
    good = [engine.add_request(clean_prompt(8 + i, i), max_new_tokens=6, stop_ids=[], seed=i)
            for i in range(3)]
    bad = engine.add_request(clean_prompt(8, 9) + [POISON], max_new_tokens=6, stop_ids=[])
    tokens, finished = {rid: [] for rid in good}, {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.get(out.request_id, []).extend(out.new_tokens)
            if out.finished:
                finished[out.request_id] = out
    assert finished[bad].finish_reason == "error"
    assert "non-finite logits" in finished[bad].error and "'ref'" in finished[bad].error
    for i, rid in enumerate(good):
        assert finished[rid].finish_reason == "length"
        assert tokens[rid] == generate(model, clean_prompt(8 + i, i), 6, stop_ids=[], seed=i)
    assert engine.check_accounting()["pages_used"] == 0


class _Silent:
    """A plugin whose linear op writes nothing (its output keeps what the buffer held)."""

    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="silent", available=True, devices=("cpu",))

    @hookimpl
    def linear(self, out, x, weight, weight_scale, batch_invariant):
        pass


class _WrongDtype:
    """A plugin whose rmsnorm returns a float64 result instead of writing its output."""

    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="wrongdtype", available=True, devices=("cpu",))

    @hookimpl
    def rmsnorm(self, out, x, weight, eps):
        return (x.double() * weight.double()).to(torch.float64)


@pytest.mark.parametrize("plugin", [_Silent, _WrongDtype])
def test_a_plugin_op_that_does_not_write_its_output_is_caught(tiny, plugin):
    backend = registry().register(plugin())
    try:
        model = load_model(tiny.directory("llama"), dtype=torch.float32, max_len=96,
                           backend=backend.name)
        with pytest.raises(NonFiniteLogitsError, match=f"backend '{backend.name}'"):
            generate(model, clean_prompt(6, 3), 4, stop_ids=[])
        model.close()
    finally:
        registry().unregister(backend.name)


def test_an_overflowing_checkpoint_is_caught(tiny):
    model = load_model(tiny.directory("llama"), dtype=torch.float32, max_len=96)
    # Weights near float32's largest: the first layer's output sums overflow to infinity.
    model.weights.layers[0].down.fill_(1e38)
    with pytest.raises(NonFiniteLogitsError, match="generated token 0"):
        generate(model, clean_prompt(6, 3), 4, stop_ids=[])
