"""The server's sampling defaults from generation_config.json, as vLLM takes them: temperature,
top_p, top_k, min_p and repetition_penalty, each where the file sets it (whatever its do_sample),
else OpenAI's; what a request leaves out gets them, what it gives wins."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("pydantic")

from tileinfer import SamplingParams
from tileinfer_cli.serve.defaults import SamplingDefaults
from tileinfer_cli.serve.prepare import plan_completion
from tileinfer_cli.serve.schemas import CompletionRequest

# Qwen/Qwen2.5-0.5B-Instruct's generation_config.json.
QWEN25 = {"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True,
          "eos_token_id": [151645, 151643], "repetition_penalty": 1.1, "temperature": 0.7,
          "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}


def served_with(tmp_path, generation):
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return SimpleNamespace(defaults=SamplingDefaults.of_folder(tmp_path), vocab_size=1000,
                           max_len=256, stop_ids=[2], tokenizer=None, tool_parser=None)


def sampling_of(served, **request):
    req = CompletionRequest(model="m", prompt=[1, 2, 3], max_tokens=4, **request)
    return plan_completion(served, req).sampling


def test_a_request_that_leaves_them_out_gets_the_files_values(tmp_path):
    served = served_with(tmp_path, QWEN25)
    assert served.defaults.card() == {
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.1,
        "from_generation_config": ["temperature", "top_p", "top_k", "repetition_penalty"]}
    assert "repetition_penalty 1.1 (temperature, top_p, top_k, repetition_penalty from" \
        in served.defaults.describe()
    assert sampling_of(served) == SamplingParams(0.7, top_k=20, top_p=0.8, repetition_penalty=1.1)


def test_what_the_request_gives_wins(tmp_path):
    served = served_with(tmp_path, {**QWEN25, "min_p": 0.05})
    assert sampling_of(served) == SamplingParams(0.7, top_k=20, top_p=0.8, min_p=0.05,
                                                 repetition_penalty=1.1)
    assert sampling_of(served, repetition_penalty=1.0, min_p=0.0, temperature=0.0) == \
        SamplingParams(0.0, top_k=20, top_p=0.8)


def test_an_unusable_value_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="generation_config.json.*repetition_penalty"):
        served_with(tmp_path, {"repetition_penalty": "high"})
    with pytest.raises(ValueError, match="generation_config.json: unusable sampling settings"):
        served_with(tmp_path, {"repetition_penalty": -1.0})
