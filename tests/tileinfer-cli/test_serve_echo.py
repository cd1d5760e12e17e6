"""Completions with ``echo`` (what evaluation harnesses send to score texts): the answer starts
with the prompt and its logprobs with the prompt tokens' (the first null), equal to the
log-softmax of a plain forward of the prompt (float32, ref backend: exactly, as every step here
holds at most 32 tokens, which that backend computes row by row); ``max_tokens: 0`` answers the
prompt only; lists of prompts, streaming; chat does not take echo. With lm-eval installed, its
``local-completions`` model scores a tiny local task through the server (slow)."""

from __future__ import annotations

import json

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
import torch

from serve_fixtures import MAX_LEN, client, http, offline  # noqa: F401 (fixtures)
from test_serve_helpers import ServerProcess, tiny_folder
from tileinfer import forward, new_cache

MODEL = "tiny-smollm2-shape"


@pytest.fixture(scope="module")
def folder(smollm2_dir, tmp_path_factory):
    return tiny_folder(smollm2_dir, tmp_path_factory.mktemp("serve-echo"))


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-echo-log") / "server.log"
    s = ServerProcess(["-m", folder, "--load-format", "dummy", "--kv-tokens", "4096",
                       "--max-running", "4"], log)
    try:
        yield s.wait_ready()
    finally:
        rc = s.stop()
    assert rc == 0, s.output()




def prompt_logprobs(offline, ids, k):
    """[(logprob, {token text: logprob} of the k most likely)] per prompt token after the
    first, from a forward of the prompt in chunks of 16 (each computed row by row)."""
    model, tok = offline
    cache = new_cache(model, num_pages=16, page_size=16)
    seq = cache.new_sequence()
    logits = torch.cat([forward(model, cache, seq, ids[i:i + 16], all_logits=True).clone()
                        for i in range(0, len(ids), 16)])
    lp = torch.log_softmax(logits, dim=-1)
    out = []
    for p in range(len(ids) - 1):
        v, i = lp[p].topk(k)
        out.append((lp[p, ids[p + 1]].item(),
                    {tok.decode_bytes([t]).decode("utf-8", "replace"): x
                     for t, x in zip(i.tolist(), v.tolist())}))
    return out


def check_prompt_part(offline, ids, logprobs, k):
    want = prompt_logprobs(offline, ids, k)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    got = list(zip(logprobs["token_logprobs"][1:len(ids)], logprobs["top_logprobs"][1:len(ids)]))
    assert got == want
    offsets = logprobs["text_offset"]
    assert offsets == [sum(map(len, logprobs["tokens"][:i])) for i in range(len(offsets))]


def test_echo_max_tokens_0_scores_a_list_of_prompts(http, offline):
    _, tok = offline
    prompts = [tok.encode("The quick brown fox jumps over the lazy dog"), tok.encode("Hello")]
    prompts.append(list(range(40, 54)))
    assert sum(map(len, prompts)) <= 32
    r = http.post("/v1/completions", json=dict(model=MODEL, prompt=prompts, echo=True,
                                               logprobs=3, max_tokens=0, temperature=0))
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    for ids, c in zip(prompts, choices):
        assert c["text"] == tok.decode(ids) and c["finish_reason"] == "length"
        assert len(c["logprobs"]["tokens"]) == len(ids)
        check_prompt_part(offline, ids, c["logprobs"], 3)
    assert r.json()["usage"]["completion_tokens"] == 0


def test_the_request_lm_eval_sends(client, offline):
    """echo, logprobs 1, max_tokens 1, temperature 0, token ids: the prompt's entries, then the
    generated token's."""
    _, tok = offline
    ids = tok.encode("Question: what is two plus two? Answer: four")
    out = client.completions.create(model=MODEL, prompt=[ids], echo=True, logprobs=1,
                                    max_tokens=1, temperature=0, seed=1234)
    c = out.choices[0]
    lps = c.logprobs.model_dump()
    assert c.text.startswith(tok.decode(ids))
    check_prompt_part(offline, ids, lps, 1)
    generated = len(lps["tokens"]) - len(ids)
    assert generated == out.usage.completion_tokens == (1 if c.finish_reason == "length" else 0)


def test_echo_of_a_text_prompt_without_logprobs(client):
    out = client.completions.create(model=MODEL, prompt="Once upon a time", echo=True,
                                    max_tokens=0)
    assert out.choices[0].text == "Once upon a time" and out.choices[0].logprobs is None
    out = client.completions.create(model=MODEL, prompt="Once upon a time", echo=True,
                                    max_tokens=3, temperature=0)
    assert out.choices[0].text.startswith("Once upon a time")


def test_streamed_echo_equals_the_whole_answer(client):
    args = dict(model=MODEL, prompt=["One two three", "Four"], echo=True, logprobs=2,
                max_tokens=4, temperature=0)
    whole = client.completions.create(**args)
    texts, tokens, lps = ["", ""], [[], []], [[], []]
    for chunk in client.completions.create(stream=True, **args):
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.logprobs is not None:
                tokens[c.index] += c.logprobs.tokens
                lps[c.index] += c.logprobs.token_logprobs
    for c in whole.choices:
        assert texts[c.index] == c.text
        assert tokens[c.index] == c.logprobs.tokens
        assert lps[c.index] == c.logprobs.token_logprobs


def test_chat_does_not_take_echo(http):
    r = http.post("/v1/chat/completions", json=dict(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], echo=True))
    assert r.status_code == 400 and "echo" in r.text


TASK = """\
task: tiny_echo_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
DOCS = [dict(question="The sky is", choices=["blue", "green", "loud"], answer=0),
        dict(question="Two plus two is", choices=["four", "five"], answer=0)]


@pytest.mark.slow
def test_lm_eval_local_completions_scores_a_tiny_task(server, folder, offline, tmp_path):
    """lm-eval's own client against the server: each choice's loglikelihood is the sum of the
    continuation tokens' log-probabilities of a plain forward (each request is one prompt of
    at most 32 tokens: exact)."""
    for module in ("lm_eval", "transformers", "tenacity", "aiohttp"):  # lm-eval[api]
        pytest.importorskip(module)
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_echo_choice.yaml").write_text(TASK.format(data=data))
    lm = LocalCompletionsAPI(base_url=server.url + "/v1/completions", model=MODEL,
                             tokenizer_backend="huggingface", tokenizer=str(folder),
                             max_length=MAX_LEN, num_concurrent=1, max_retries=1)
    out = simple_evaluate(model=lm, tasks=["tiny_echo_choice"], log_samples=True,
                          task_manager=TaskManager(include_path=str(tasks)))
    samples = out["samples"]["tiny_echo_choice"]
    assert len(samples) == len(DOCS)
    model, _ = offline
    for s in samples:
        for (context, continuation), resp in zip(s["arguments"], s["resps"]):
            context_enc, continuation_enc = lm._encode_pair(context, continuation)
            ids = context_enc + continuation_enc
            assert len(ids) <= 32
            entries = prompt_logprobs(offline, ids, 1)  # entry p - 1: token p
            want = sum(entries[p - 1][0] for p in range(len(context_enc), len(ids)))
            got = resp[0][0] if isinstance(resp[0], (list, tuple)) else resp[0]
            assert got == want
    assert "acc,none" in out["results"]["tiny_echo_choice"]
