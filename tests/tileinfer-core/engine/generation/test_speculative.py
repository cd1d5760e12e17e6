"""Speculative decoding: the n-gram proposer against a brute-force reading, greedy speculative
output equal to plain greedy output token for token (n-gram, a random draft model, the target as
its own draft), stop ids / max_new_tokens / the sequence afterwards, sampled runs, chat sessions,
bad input; the same on the GPU with CUDA graphs."""

from __future__ import annotations

import math
import random

import pytest
import torch

from speculative_helpers import divergence, gpu_backends, one_cpu_thread  # noqa: F401
from tileinfer import (ChatSession, DraftProposer, NgramProposer, SamplingParams, SpecStats,
                       load_model, load_tokenizer)
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.generate import generate, generate_into
from tileinfer.engine.generation.runner import ModelRunner
from tileinfer.engine.generation.speculative.proposer import Draft, Proposer
from tiny_models import prompt_ids, tiny  # noqa: F401

MAX_LEN = 160
STEPS = 64


def load(tiny, arch="llama", backend="ref", dtype=torch.float32, device=None):
    return load_model(tiny.directory(arch, dtype=dtype), dtype=dtype, backend=backend,
                      max_len=MAX_LEN, device=device)


# A prompt that repeats itself, so that prompt lookup finds matches from the start.
def repetitive_prompt():
    return prompt_ids(12) * 2 + prompt_ids(6)


# --- the n-gram proposer ---------------------------------------------------------------------


def brute_force_lookup(tokens, k, max_ngram, min_ngram):
    """The definition, read literally: for n from max_ngram down, the latest start i < len - n
    with tokens[i:i+n] == the last n tokens; propose what follows it."""
    end = len(tokens)
    for n in range(min(max_ngram, end - 1), min_ngram - 1, -1):
        suffix = tokens[end - n:]
        for i in range(end - n - 1, -1, -1):
            if tokens[i:i + n] == suffix:
                return tokens[i + n:i + n + k]
    return []


def test_ngram_prefers_the_longest_match_and_the_latest_occurrence():
    tokens = [1, 2, 8, 3, 2, 9, 1, 2]
    # The 2-gram [1, 2] occurred at 0 (followed by 8); the 1-gram [2] last occurred at 4.
    assert NgramProposer(k=4).propose(tokens, 4) == [8, 3, 2, 9]
    assert NgramProposer(k=4, max_ngram=1).propose(tokens, 3) == [9, 1, 2]
    assert NgramProposer().propose([5, 6, 5, 7, 5], 2) == [7, 5]  # latest of two occurrences
    assert NgramProposer().propose([1, 2, 3], 4) == []  # no earlier occurrence
    assert NgramProposer(min_ngram=2).propose([4, 1, 4], 4) == []  # 1-grams not allowed
    assert NgramProposer().propose([7], 4) == []


def test_ngram_index_follows_growing_and_rewritten_sequences():
    rng = random.Random(0)
    proposer = NgramProposer(k=5, max_ngram=3, min_ngram=1)
    tokens: list[int] = []
    for _ in range(400):
        if tokens and rng.random() < 0.1:  # a rewritten end (a new chat turn)
            tokens = tokens[:rng.randrange(len(tokens))]
        tokens = tokens + [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        k = rng.randrange(1, 6)
        assert proposer.propose(tokens, k) == brute_force_lookup(tokens, k, 3, 1), tokens


@pytest.mark.parametrize("kwargs,match", [
    (dict(k=0), "k"), (dict(k=-1), "k"), (dict(k=2.0), "k"),
    (dict(max_ngram=0), "max_ngram"), (dict(min_ngram=3, max_ngram=2), "min_ngram"),
])
def test_ngram_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NgramProposer(**kwargs)


def test_spec_stats():
    stats = SpecStats()
    assert math.isnan(stats.acceptance_rate) and math.isnan(stats.mean_accepted_length)
    stats.record(4, 3)
    stats.record(0, 0)
    stats.record(4, 0)
    assert (stats.verify_steps, stats.plain_steps, stats.drafted, stats.accepted) == (2, 1, 8, 3)
    assert stats.acceptance_rate == 3 / 8 and stats.mean_accepted_length == 1.5
    assert "3/8" in stats.summary()


def test_draft_budget_backs_off_and_comes_back():
    from tileinfer.engine.generation.speculative.proposer import DraftBudget

    budget = DraftBudget(6)
    assert budget.next() == 6
    budget.record(6, 6)
    assert budget.next() == 6
    budget.record(6, 2)  # partly accepted: one more than were
    assert budget.next() == 3
    budget.record(3, 0)  # all rejected: none for 1 step, then a probe of 1
    assert [budget.next() for _ in range(2)] == [0, 1]
    budget.record(1, 0)  # rejected again: none for 2 steps
    assert [budget.next() for _ in range(3)] == [0, 0, 1]
    budget.record(1, 1)  # the probe is accepted: twice as many
    assert budget.next() == 2
    for _ in range(10):
        budget.record(1, 0)
        while budget.next() == 0:
            pass
    budget.record(1, 0)
    assert budget.misses == 11 and budget.wait == DraftBudget.MAX_WAIT  # waits are capped
    assert DraftBudget(4, adaptive=False).next() == 4


def test_synchronous_loop_drafts_less_while_drafts_are_rejected(tiny):
    target = load(tiny)
    prompt = prompt_ids()
    free = generate(target, prompt, 40, stop_ids=[])
    counts = {}
    for adaptive in (True, False):
        stats = SpecStats()
        proposer = FixedDrafts([1, 2, 3, 4], k=4)
        proposer.adaptive = adaptive
        out = generate(target, prompt, 40, stop_ids=[], speculative=proposer, spec_stats=stats)
        assert out == free
        counts[adaptive] = stats.drafted
    assert counts[False] > 4 * counts[True]


# --- greedy losslessness ---------------------------------------------------------------------


def proposers(tiny, target, device=None, backend="ref", dtype=torch.float32):
    """name -> (proposer factory, what the acceptance must show)."""
    return {
        "ngram": lambda: NgramProposer(k=4, adaptive=False),  # drafts at every match
        "ngram-adaptive": lambda: NgramProposer(k=7),  # drafts while they are accepted
        "random-draft": lambda: DraftProposer(load(tiny, "qwen3", backend, dtype, device), k=4),
        "self-draft": lambda: DraftProposer(target, k=5),
    }


@pytest.mark.parametrize("name", ["ngram", "ngram-adaptive", "random-draft", "self-draft"])
def test_greedy_speculative_output_equals_plain_greedy(tiny, name):
    target = load(tiny)
    prompt = repetitive_prompt()
    plain = generate(target, prompt, STEPS, stop_ids=[])
    stats = SpecStats()
    proposer = proposers(tiny, target)[name]()
    out = generate(target, prompt, STEPS, stop_ids=[], speculative=proposer, spec_stats=stats)
    assert out == plain
    assert stats.drafted > 0 or name == "ngram-adaptive"
    if name == "self-draft":
        assert stats.acceptance_rate == 1.0  # the target's own greedy tokens
        assert stats.verify_steps < STEPS / 4  # about k + 1 tokens per step
    if name == "random-draft":
        assert stats.accepted < stats.drafted  # rejections and rollbacks happened
    if name == "ngram":
        assert stats.accepted > 0


def test_stop_ids_max_new_tokens_and_the_sequence_afterwards(tiny):
    target = load(tiny)
    prompt = prompt_ids()
    free = generate(target, prompt, 40, stop_ids=[])
    stop = free[17]
    first = free.index(stop)
    cache = new_cache(target, MAX_LEN)
    runner = ModelRunner(target, cache)
    # The target drafting for itself accepts everything: the stop token arrives inside a run
    # of accepted drafts, and generation must end there.
    proposer = DraftProposer(target, k=6)
    seq = cache.new_sequence()
    streamed = []
    out = generate_into(runner, seq, prompt, 40, stop_ids=[stop], on_token=streamed.append,
                        speculative=proposer)
    assert out == free[:first] == streamed
    assert seq.tokens == prompt + out  # the stop token was sampled, never run
    assert cache.free_pages == cache.num_pages - cache.pages_for(len(seq))
    for n in (1, 2, 9, 13):
        seq2 = cache.new_sequence()
        out2 = generate_into(runner, seq2, prompt, n, stop_ids=[], speculative=proposer)
        assert out2 == free[:n] and seq2.tokens == prompt + free[:n - 1]
        cache.release(seq2)
    # Continuing a sequence equals one long generation.
    seq3 = cache.new_sequence()
    a = generate_into(runner, seq3, prompt, 11, stop_ids=[], speculative=NgramProposer())
    b = generate_into(runner, seq3, [a[-1]], 12, stop_ids=[], speculative=proposer)
    assert a + b == free[:23]


class FixedDrafts(Proposer):
    """Always drafts the same tokens (most of them wrong)."""

    def __init__(self, ids, k=4):
        self.ids, self.k = list(ids), k

    def propose(self, tokens, k):
        return self.ids[:k]


def test_drafts_never_need_more_cache_than_plain_decoding(tiny):
    target = load(tiny)
    prompt = prompt_ids()
    free = generate(target, prompt, 40, stop_ids=[])
    # A stop token that first appears late: the sequence then ends near the cache's end.
    i = next(i for i in range(27, 20, -1) if free[i] not in free[:i])
    results = []
    for proposer in (None, FixedDrafts([1, 2, 3, 4, 5, 6, 7, 8], k=8)):
        cache = new_cache(target, num_pages=3, page_size=16)  # 48 positions: 20 + i fit
        seq = cache.new_sequence()
        out = generate_into(ModelRunner(target, cache), seq, prompt, 40, stop_ids=[free[i]],
                            speculative=proposer)
        results.append((out, list(seq.tokens)))
    # Drafting 8 ahead would overflow the cache near the end; fewer drafts are made instead.
    assert results[1] == results[0] and results[0][0] == free[:i]


def test_a_failing_proposer_leaves_the_sequence_as_it_was(tiny):
    class Broken(Proposer):
        def propose(self, tokens, k):
            if len(tokens) > 30:
                raise RuntimeError("drafter failed")
            return [0]

    target = load(tiny)
    cache = new_cache(target, MAX_LEN)
    runner = ModelRunner(target, cache)
    seq = cache.new_sequence()
    generate_into(runner, seq, prompt_ids(), 4, stop_ids=[])
    before = (list(seq.tokens), list(seq.pages), cache.free_pages)
    with pytest.raises(RuntimeError, match="drafter failed"):
        generate_into(runner, seq, [3], 30, stop_ids=[], speculative=Broken())
    assert (seq.tokens, seq.pages, cache.free_pages) == before


# --- sampled runs ----------------------------------------------------------------------------


def test_sampled_speculative_runs_are_reproducible_and_hold_the_sequence(tiny):
    target = load(tiny)
    prompt = prompt_ids()
    params = SamplingParams(0.9, top_k=50)
    cache = new_cache(target, MAX_LEN)
    runner = ModelRunner(target, cache)
    results = []
    for _ in range(2):
        seq = cache.new_sequence()
        out = generate_into(runner, seq, prompt, 30, params, stop_ids=[], seed=5,
                            speculative=NgramProposer())
        assert len(out) == 30 and seq.tokens == prompt + out[:-1]
        results.append(out)
        cache.release(seq)
    assert results[0] == results[1]
    # The first token comes from the prefill, sampled as plain generation samples it.
    assert results[0][0] == generate(target, prompt, 1, params, stop_ids=[], seed=5)[0]


def test_a_sampling_draft_equal_to_the_target_is_always_accepted(tiny):
    # q = p at every position, so the p/q rule must accept every draft: a check that the q the
    # drafter reports is the distribution the target's filtered p is compared with.
    target = load(tiny)
    stats = SpecStats()
    params = SamplingParams(1.0, top_p=0.95)
    out = generate(target, prompt_ids(), 24, params, stop_ids=[], seed=3,
                   speculative=DraftProposer(target, k=4, sample=True), spec_stats=stats)
    assert len(out) == 24 and stats.drafted > 0
    assert stats.acceptance_rate == 1.0


# --- chat ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_chat_session_with_ngram_drafts_gives_the_plain_replies(smollm2_dir):
    model = load_model(smollm2_dir, dtype=torch.float32, backend="ref", max_len=512)
    tok = load_tokenizer(smollm2_dir)
    plain = ChatSession(model, tok)
    spec = ChatSession(model, tok, speculative=NgramProposer(adaptive=False))  # always drafts
    for text in ("Repeat exactly: the quick brown fox jumps over the lazy dog.",
                 "Again, with a cat instead of a dog."):
        expected, plain_stats = plain.reply(text, 16)
        got, stats = spec.reply(text, 16)
        assert got == expected
        assert plain_stats.spec is None
        assert stats.spec is not None and stats.spec.drafted > 0
        assert stats.reused == plain_stats.reused and stats.generated == plain_stats.generated
    assert stats.spec.accepted > 0


# --- bad input -------------------------------------------------------------------------------


def test_draft_model_with_another_vocabulary_is_refused(tiny, tmp_path):
    from tiny_models import build_tiny, save_tiny

    target = load(tiny)
    hf = build_tiny("llama", seed=9)
    hf.resize_token_embeddings(256)
    other = load_model(save_tiny(hf, tmp_path / "small-vocab"), dtype=torch.float32,
                       max_len=MAX_LEN)
    cache = new_cache(target, MAX_LEN)
    runner = ModelRunner(target, cache)
    seq = cache.new_sequence()
    with pytest.raises(ValueError, match="vocabulary"):
        generate_into(runner, seq, prompt_ids(), 4, speculative=DraftProposer(other))
    assert len(seq) == 0 and cache.free_pages == cache.num_pages


def test_draft_model_runs_a_prompt_as_the_target_did(tiny):
    """The target runs a prompt in one step and the token sampled from it in the next; the draft
    catches up the same way (a prompt step's matrix products round differently from a decode
    step's, so one step of prompt + token would compute that token's keys and logits on another
    path than the target: a draft equal to the target could then disagree with it). Short
    catch-ups (the last draft and the target's token) stay one step."""
    target = load(tiny)
    proposer = DraftProposer(target, k=3)
    steps = []
    forward = proposer.runner.forward

    def counting_forward(seq, ids, *args, **kwargs):
        steps.append(len(ids))
        return forward(seq, ids, *args, **kwargs)

    proposer.runner.forward = counting_forward
    prompt = repetitive_prompt()
    out = generate(target, prompt, 12, stop_ids=[], speculative=proposer)
    assert steps[:2] == [len(prompt), 1]  # the prompt, then the target's first token
    assert all(n <= proposer.k + 1 for n in steps[2:]) and len(out) == 12


@pytest.mark.parametrize("k", [0, -2, 1.5])
def test_draft_proposer_needs_k_at_least_one(tiny, k):
    with pytest.raises(ValueError, match="k"):
        DraftProposer(load(tiny), k=k)


def test_out_of_vocabulary_drafts_are_a_clear_error(tiny):
    target = load(tiny)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(target, prompt_ids(), 8, stop_ids=[], speculative=FixedDrafts([100000]))


def test_draft_type_carries_distributions():
    d = Draft([3, 4, 5], torch.ones(3, 7))
    assert d == [3, 4, 5] and d.truncated(2) == [3, 4] and d.truncated(2).probs.shape == (2, 7)
    assert Draft([1]).probs is None


# --- GPU: CUDA graphs ------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
@pytest.mark.parametrize("name", ["ngram", "ngram-adaptive", "random-draft", "self-draft"])
def test_gpu_greedy_speculative_output_equals_plain_greedy(tiny, backend, name):
    target = load(tiny, backend=backend, dtype=torch.bfloat16, device="cuda")
    prompt = repetitive_prompt()
    plain = generate(target, prompt, STEPS, stop_ids=[])  # graphs, pipelined
    stats = SpecStats()
    factory = proposers(tiny, target, "cuda", backend, torch.bfloat16)[name]
    out = generate(target, prompt, STEPS, stop_ids=[], speculative=factory(), spec_stats=stats)
    assert out == plain, divergence(target, prompt, plain, out)
    assert stats.drafted > 0 or name == "ngram-adaptive"
    if name == "self-draft":  # 1-token draft steps and k+1-token verify steps agree exactly
        assert stats.acceptance_rate == 1.0, stats.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_gpu_graphs_and_eager_agree_on_speculative_sampling(tiny, backend):
    target = load(tiny, backend=backend, dtype=torch.bfloat16, device="cuda")
    params = SamplingParams(0.8, top_p=0.9)
    runs = []
    for graphs in (False, True):
        cache = new_cache(target, MAX_LEN)
        runner = ModelRunner(target, cache, graphs=graphs)
        seq = cache.new_sequence()
        draft = DraftProposer(load(tiny, "qwen3", backend, torch.bfloat16, "cuda"), k=3,
                              sample=True, graphs=graphs)
        out = generate_into(runner, seq, prompt_ids(), 40, params, stop_ids=[], seed=2,
                            speculative=draft)
        runs.append((out, list(seq.tokens)))
    assert runs[0] == runs[1]


# --- the command line ------------------------------------------------------------------------


def tileinfer_cmd(*args, stdin=None):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "tileinfer_cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_cli_run_and_chat_speculate_when_asked_and_answer_as_plain_decoding():
    """Answers decode plainly by default; --speculative ngram (or --draft-k) drafts n-grams and
    gives plain decoding's text (--speculative none)."""
    prompt = "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog."
    plain = tileinfer_cmd("run", prompt, "-n", "16", "-t", "0", "--backend", "ref", "--stats",
                          "--speculative", "none")
    assert plain.returncode == 0, plain.stderr
    assert "speculative" not in plain.stderr and "lazy dog" in plain.stdout
    sampled = tileinfer_cmd("run", prompt, "-n", "4", "-t", "0.7", "--backend", "ref",
                            "--stats", "--seed", "1")
    assert sampled.returncode == 0, sampled.stderr
    assert "speculative" not in sampled.stderr  # sampling: plain unless asked
    default = tileinfer_cmd("run", prompt, "-n", "16", "-t", "0", "--backend", "ref", "--stats")
    assert default.stdout == plain.stdout and "speculative" not in default.stderr
    for extra in (("--speculative", "ngram"), ("--draft-k", "3")):
        run = tileinfer_cmd("run", prompt, "-n", "16", "-t", "0", "--backend", "ref", "--stats",
                            *extra)
        assert run.returncode == 0, run.stderr
        assert run.stdout == plain.stdout
        assert "drafts accepted" in run.stderr
    chat = tileinfer_cmd("chat", "--backend", "ref", "-n", "12", "-t", "0", "--speculative",
                         "ngram", stdin=f"{prompt}\n/stats\n/exit\n")
    assert chat.returncode == 0, chat.stderr
    assert "drafts accepted" in chat.stdout


@pytest.mark.parametrize("args,pattern", [
    (("--speculative", "bogus"), "use ngram, none, draft:MODEL or dflash:MODEL"),
    (("--speculative", "draft:"), "use ngram, none, draft:MODEL or dflash:MODEL"),
    (("--speculative", "none", "--draft-k", "3"), "--draft-k needs speculative decoding"),
])
def test_cli_bad_speculative_options(args, pattern):
    result = tileinfer_cmd("run", "hi", "-n", "2", "--backend", "ref", *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and pattern in result.stderr
