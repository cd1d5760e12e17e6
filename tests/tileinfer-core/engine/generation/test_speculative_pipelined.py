"""The pipelined, adaptive speculative loop (n-gram drafts): the n-gram continuation API; the loop
against a scripted target (a stand-in runner whose model continues a known token sequence), which
shows what it launches, step by step, on text that copies its context and on text that does not;
then on real tiny models: greedy output, the sequence and the KV cache afterwards equal to plain
greedy decoding's bit for bit (also with every guess of the pipeline failing), stop ids and
max_new_tokens at every position, sampled runs."""

from __future__ import annotations
import contextlib

import random
from types import SimpleNamespace

import pytest
import torch

from speculative_helpers import gpu_backends, one_cpu_thread  # noqa: F401
from tileinfer import NgramProposer, SamplingParams, SpecStats, load_model
from tileinfer.engine.kv.cache import PagedKVCache, new_cache
from tileinfer.engine.runtime.finite import check_finite
from tileinfer.engine.generation.generate import generate, generate_into
from tileinfer.engine.generation.runner import ModelRunner
from tileinfer.engine.generation.speculative.proposer import Proposer
from tileinfer.model.config import config_from_dict
from tiny_models import prompt_ids, tiny  # noqa: F401

MAX_LEN = 200


# --- the n-gram continuation -----------------------------------------------------------------


def test_continuation_copies_on_past_the_end_and_after_guessed_tokens():
    p = NgramProposer(k=4)
    tokens = [7, 1, 2, 3, 9, 1, 2]
    assert p.prediction(tokens) == 3
    assert p.continuation(tokens, (), 4) == [3, 9, 1, 2]
    # After guessed tokens [3, 9]: the suffix [9] last occurred at 4, followed by 1, 2, ...
    assert p.continuation(tokens, [3, 9], 3) == [1, 2, 3]
    # A repeating stretch repeats on past the end of the sequence.
    tokens.append(3)
    assert p.continuation(tokens, (), 7) == [9, 1, 2, 3, 9, 1, 2]
    assert p.continuation([5, 6], (), 3) == [] and p.prediction([5, 6, 8]) is None


def test_prediction_follows_a_growing_list_and_a_rewritten_one():
    p = NgramProposer(k=3)
    rng = random.Random(0)
    tokens: list[int] = []
    for _ in range(300):
        tokens.append(rng.randrange(5))
        expected = NgramProposer(k=3).propose(list(tokens), 1)
        assert p.prediction(tokens) == (expected[0] if expected else None)
    other = tokens[:50]
    expected = NgramProposer(k=3).propose(other, 1)
    assert p.prediction(other) == (expected[0] if expected else None)


# --- a scripted target -------------------------------------------------------------------------


class ScriptedRunner:
    """Stands in for a ModelRunner whose model continues ``truth``: the token after position p is
    truth[p + 1] when the tokens at positions 0..p are truth's, else a wrong one. Steps run at
    once (on the host); ``steps`` lists the rows of each step launched after the prefill."""

    def __init__(self, truth, page_size=16):
        self.truth = list(truth)
        vocab = max(self.truth) + 2
        config = config_from_dict(dict(model_type="llama", vocab_size=vocab, hidden_size=8,
                                       intermediate_size=8, num_hidden_layers=1,
                                       num_attention_heads=1, num_key_value_heads=1,
                                       max_position_embeddings=4096))
        pages = len(self.truth) // page_size + 4
        self.cache = PagedKVCache(config, pages, page_size, dtype=torch.float32, device="cpu")
        self.vocab = vocab
        self.model = SimpleNamespace(max_len=4096, device=torch.device("cpu"), config=config,
                                     ops=SimpleNamespace(sample_tokens=self._sample))
        self.seed = torch.zeros(1, dtype=torch.int64)
        self.counter = torch.zeros(1, dtype=torch.int64)
        self.next_token = torch.zeros(1, dtype=torch.int32)
        self.cached: dict[int, int] = {}
        self.steps: list[int] = []
        self.prefilled = False
        self.graphs = False
        self.rows: dict[int, torch.Tensor] = {}
        self.step_seconds: dict[int, list[float]] = {}
        self.lock = contextlib.nullcontext()
        self.hidden_layers, self.step_listener = (), None
        self.logit_sum = torch.zeros(1)  # the scripted logits are finite

    def check_finite(self, total, token_index):
        check_finite(total, token_index, "scripted")

    def row_sums(self, n):
        return torch.zeros(n)

    def add_sizes(self, sizes):
        pass

    def _run(self, seq, ids):
        start = len(seq)
        self.cache.reserve(seq, len(ids))
        seq.tokens.extend(ids)
        rows = []
        for i, token in enumerate(ids):
            p = start + i
            self.cached[p] = token
            right = p < len(self.truth) and all(self.cached[q] == self.truth[q]
                                                 for q in range(p + 1))
            nxt = self.truth[p + 1] if p + 1 < len(self.truth) else 0
            rows.append(nxt if right else (nxt + 1) % self.vocab)
        if self.prefilled:
            self.steps.append(len(ids))
        self.prefilled = True
        return rows

    def _logits(self, rows):
        return torch.nn.functional.one_hot(torch.tensor(rows), self.vocab).float()

    @staticmethod
    def _sample(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
        out.copy_(logits.argmax(-1).to(torch.int32))

    def forward(self, seq, ids, sampling=None, all_logits=False, first_from=None,
                sample_rows=False):
        ids = [int(i) for i in ids]
        if first_from is not None:
            ids[0] = int(first_from[0])
        rows = self._run(seq, ids)
        if sample_rows:
            self.rows[len(ids)] = torch.tensor(rows, dtype=torch.int32)
        elif sampling is not None:
            self.next_token[0] = rows[-1]
        logits = self._logits(rows)
        return logits if all_logits else logits[-1:]

    def row_tokens(self, n):
        return self.rows[n]

    def decode_from_device(self, seq, sampling):
        (row,) = self._run(seq, [int(self.next_token[0])])
        self.next_token[0] = row
        return self._logits([row])


def ngram(k=7, row_cost=0.05, **kwargs):
    """An n-gram proposer whose loop counts an extra row as row_cost of a step (instead of
    measuring it: the scripted target's steps take no time worth measuring)."""
    proposer = NgramProposer(k=k, **kwargs)
    proposer.row_cost = row_cost
    return proposer


def scripted(truth, prompt_len, proposer, max_new, stop=()):
    runner = ScriptedRunner(truth)
    seq = runner.cache.new_sequence()
    stats = SpecStats()
    out = generate_into(runner, seq, truth[:prompt_len], max_new, SamplingParams(),
                        stop_ids=list(stop), seed=0, speculative=proposer, spec_stats=stats)
    return out, runner, seq, stats


def copying_text(seed=0, length=160):
    """A prompt of 60 random tokens, then an answer that copies it with a changed token every
    20 or so (a paragraph rewritten with other names)."""
    rng = random.Random(seed)
    prompt = [rng.randrange(100, 400) for _ in range(60)]
    answer = []
    while len(answer) < length:
        for t in prompt:
            answer.append(rng.randrange(400, 500) if rng.random() < 0.05 else t)
    return prompt, answer[:length]


def test_scripted_copying_text_drafts_and_steps_beat_plain():
    prompt, answer = copying_text()
    truth = prompt + answer
    out, runner, seq, stats = scripted(truth, len(prompt), ngram(), len(answer))
    assert out == answer
    assert seq.tokens == truth[:len(truth) - 1]
    rows = runner.steps
    # Plain decoding takes len(answer) - 1 steps after the prefill; each extra row of a step
    # costs a few percent of a step on a GPU.
    cost = sum(1 + 0.05 * (n - 1) for n in rows)
    assert cost < 0.5 * (len(answer) - 1), (len(rows), stats.summary())  # over 2x
    assert stats.accepted > 0.75 * stats.drafted and stats.wasted_steps <= 15


def test_scripted_text_that_does_not_copy_runs_plain_steps():
    rng = random.Random(1)
    prompt = [rng.randrange(100, 4000) for _ in range(60)]
    answer = [rng.randrange(100, 4000) for _ in range(150)]
    truth = prompt + answer
    out, runner, _, stats = scripted(truth, len(prompt), ngram(), len(answer))
    assert out == answer
    # Exactly the steps of plain decoding: one token each, one per token, none wasted.
    assert runner.steps == [1] * (len(answer) - 1)
    assert stats.drafted == 0 and stats.wasted_steps == 0


def test_scripted_text_with_short_matches_costs_at_most_a_few_rows():
    """Open text where the lookup's predictions come true now and then (common words): the loop
    may draft a little, but launches no more than a plain step per token and few extra rows."""
    rng = random.Random(2)
    words = [rng.randrange(100, 130) for _ in range(40)]  # a small vocabulary: 1-gram matches
    prompt = [rng.choice(words) for _ in range(40)]
    answer = [rng.choice(words) for _ in range(200)]
    truth = prompt + answer
    out, runner, _, stats = scripted(truth, len(prompt), ngram(), len(answer))
    assert out == answer
    cost = sum(1 + 0.05 * (n - 1) for n in runner.steps)
    assert cost <= 1.05 * (len(answer) - 1), stats.summary()


@pytest.mark.parametrize("adaptive", [True, False], ids=["adaptive", "fixed-k"])
@pytest.mark.parametrize("seed", range(6))
def test_scripted_outputs_and_sequence_at_every_stop_and_length(seed, adaptive):
    prompt, answer = copying_text(seed, 90)
    truth = prompt + answer
    rng = random.Random(seed)
    for max_new in (1, 2, 3, rng.randrange(4, 90), 90):
        proposer = ngram(k=rng.randrange(1, 8), adaptive=adaptive)
        out, runner, seq, _ = scripted(truth, len(prompt), proposer, max_new)
        assert out == answer[:max_new]
        assert seq.tokens == truth[:len(prompt) + max_new - 1]
        assert runner.cache.free_pages == runner.cache.num_pages - runner.cache.pages_for(len(seq))
    stop = answer[rng.randrange(5, 60)]
    first = answer.index(stop)
    out, runner, seq, _ = scripted(truth, len(prompt), ngram(k=5, adaptive=adaptive), 90,
                                   stop=[stop])
    assert out == answer[:first] and seq.tokens == truth[:len(prompt) + first]



@pytest.mark.parametrize("ends", [True, False], ids=["stops-where-the-prompt-did", "goes-on"])
def test_scripted_copy_of_a_turn_that_ends_with_a_stop_token(ends):
    """The answer copies the prompt's text that a stop token followed (a chat turn's end): the
    drafts end at the stop token, and no step is launched on the tokens after it, which would
    only be dropped. An answer that goes on past where the prompt stopped still comes out right."""
    rng = random.Random(3)
    body = [rng.randrange(100, 400) for _ in range(80)]
    stop = 7
    prompt = [5] + body + [stop, 9, 11, 13]
    tail = [stop] if ends else [rng.randrange(100, 400) for _ in range(20)] + [stop]
    truth = prompt + body + tail
    out, runner, seq, stats = scripted(truth, len(prompt), ngram(), 200, stop=[stop])
    assert out == body + tail[:-1]
    assert seq.tokens == truth[:len(truth) - 1]
    if ends:
        assert stats.wasted_steps == 0, stats.summary()
        assert max(runner.cached) == len(truth) - 2  # the last input: the stop token's row


# --- real tiny models ----------------------------------------------------------------------------


def load(tiny, arch="llama", dtype=torch.float32):
    return load_model(tiny.directory(arch, dtype=dtype), dtype=dtype, backend="ref",
                      max_len=MAX_LEN)


class Oracle(Proposer):
    """A host proposer that knows the answer and lies at chosen positions: a lookup whose
    predictions come true where the test wants (and fail where it wants)."""

    def __init__(self, truth, wrong, k=5, adaptive=False):
        self.truth, self.wrong, self.k, self.adaptive = list(truth), set(wrong), k, adaptive

    def _at(self, p):
        if p >= len(self.truth):
            return 1
        return (self.truth[p] + 1) % 256 if p in self.wrong else self.truth[p]

    def prediction(self, tokens):
        return self._at(len(tokens))

    def continuation(self, tokens, tail, n):
        p = len(tokens) + len(tail)
        return [self._at(p + i) for i in range(n)]


def _kv_rows(cache, seq):
    pos = torch.arange(len(seq))
    pages = torch.tensor(seq.pages)[pos // cache.page_size]
    return cache.k_pages[:, pages, pos % cache.page_size], cache.v_pages[:, pages,
                                                                          pos % cache.page_size]


@pytest.mark.parametrize("arch,dtype", [("llama", torch.float32), ("qwen3", torch.bfloat16)])
@pytest.mark.parametrize("pattern", ["all-right", "every-3rd-wrong", "random"])
def test_greedy_output_and_kv_cache_equal_plain_decoding(tiny, arch, dtype, pattern):
    """Guessed chains that fail at every kind of place: the output, the sequence and every cached
    key and value equal plain greedy decoding's, bit for bit (ref rounds verify rows as
    1-token steps)."""
    model = load(tiny, arch, dtype)
    prompt = prompt_ids(20, seed=2)
    n_new = 40
    cache = new_cache(model, MAX_LEN)
    seq = cache.new_sequence()
    plain = generate_into(ModelRunner(model, cache), seq, prompt, n_new, stop_ids=[])
    plain_kv = _kv_rows(cache, seq)
    truth = prompt + plain
    rng = random.Random(pattern)
    wrong = {"all-right": set(),
             "every-3rd-wrong": set(range(len(prompt), len(truth), 3)),
             "random": {p for p in range(len(prompt), len(truth)) if rng.random() < 0.25}}[pattern]
    cache2 = new_cache(model, MAX_LEN)
    seq2 = cache2.new_sequence()
    stats = SpecStats()
    out = generate_into(ModelRunner(model, cache2), seq2, prompt, n_new, stop_ids=[],
                        speculative=Oracle(truth, wrong, k=5), spec_stats=stats)
    assert out == plain
    assert seq2.tokens == seq.tokens
    for a, b in zip(_kv_rows(cache2, seq2), plain_kv):
        assert torch.equal(a, b)
    assert stats.drafted > 0
    if pattern == "all-right":
        assert stats.accepted == stats.drafted and stats.wasted_steps == 0
    else:
        assert stats.wasted_steps > 0


def test_continuing_a_sequence_and_ngram_on_a_repetitive_prompt(tiny):
    model = load(tiny)
    prompt = prompt_ids(12) * 2 + prompt_ids(6)
    free = generate(model, prompt, 30, stop_ids=[])
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache)
    seq = cache.new_sequence()
    a = generate_into(runner, seq, prompt, 11, stop_ids=[], speculative=NgramProposer(k=7))
    b = generate_into(runner, seq, [a[-1]], 19, stop_ids=[],
                      speculative=NgramProposer(k=3, adaptive=False))
    assert a + b == free


@pytest.mark.parametrize("adaptive", [True, False])
def test_sampled_pipelined_runs_are_reproducible(tiny, adaptive):
    model = load(tiny)
    prompt = prompt_ids(12) * 2 + prompt_ids(6)
    params = SamplingParams(0.8, top_k=40)
    outs = []
    for _ in range(2):
        cache = new_cache(model, MAX_LEN)
        seq = cache.new_sequence()
        out = generate_into(ModelRunner(model, cache), seq, prompt, 30, params, stop_ids=[],
                            seed=9, speculative=NgramProposer(k=4, adaptive=adaptive))
        assert len(out) == 30 and seq.tokens == prompt + out[:-1]
        outs.append(out)
    assert outs[0] == outs[1]
    # Token 0 comes from the prefill's stream (seed, 0), as in plain sampling.
    assert outs[0][0] == generate(model, prompt, 1, params, stop_ids=[], seed=9)[0]


def test_the_draft_count_follows_the_hit_rate_and_the_measured_cost_of_rows():
    from tileinfer.engine.generation.speculative.step_costs import DraftPolicy

    def budget(hit_rate, seconds, k=7):
        policy = DraftPolicy(NgramProposer(k=k), {n: [s] * 5 for n, s in seconds.items()})
        policy.hit_rate = policy.trust_rate = hit_rate  # long into an answer: the prior gone
        return policy.budget()

    cheap = {n: 1e-3 * (1 + 0.02 * (n - 1)) for n in range(1, 9)}
    assert budget(0.3, cheap) == 0  # below draft_threshold: no drafts
    assert budget(0.97, cheap) == 7 and budget(0.7, cheap) >= 1
    # A verify row costing 60% of a step: fewer drafts, none at a middling hit rate.
    dear = {n: 1e-3 * (1 + 0.6 * (n - 1)) for n in range(1, 9)}
    assert 1 <= budget(0.97, dear) < 7 and budget(0.7, dear) == 0
    # Unmeasured sizes take the steepest measured cost per row.
    assert budget(0.97, {1: 1e-3, 2: 2e-3}) == 0
    assert budget(0.97, {1: 1e-3}) == 7  # the prior: 10% of a step per row


def test_the_hit_rate_is_the_weighted_average_of_the_guesses_seen():
    """Bias-corrected: one right guess reads as 1, not as the smoothing weight; later guesses
    weigh as an exponential moving average does. The rate that chaining rests on also counts
    prior_misses failed guesses before the first, which fade with the older terms."""
    from tileinfer.engine.generation.speculative.step_costs import DraftPolicy

    proposer = NgramProposer(k=7)
    policy = DraftPolicy(proposer, {})
    a, prior = policy.smoothing, proposer.prior_misses
    assert prior == 1.0
    assert policy.hit_rate == 0.0 and policy.budget() == 0
    policy.record_guess(True)
    assert policy.hit_rate == 1.0
    assert policy.trust_rate == pytest.approx(a / (a + (1 - a) * a * prior))
    # One right guess: drafts, and a step may be launched on one of them, not on two (a
    # wrong one would be thrown away); without the prior's miss it would be on all seven.
    assert policy.trust_rate < 1.0
    assert policy.budget() >= 1 and policy.trusted(1) and not policy.trusted(2)
    policy.record_guess(False)
    assert policy.hit_rate == pytest.approx((1 - a) * a / ((1 - a) * a + a))
    for _ in range(3):
        policy.record_guess(True)
    # Five guesses, the miss three back: its weight a (1 - a)**3 of all weights 1 - (1 - a)**5;
    # the prior's a (1 - a)**5 besides.
    weights, missed = 1 - (1 - a) ** 5, a * (1 - a) ** 3
    assert policy.hit_rate == pytest.approx(1 - missed / weights)
    assert policy.trust_rate == pytest.approx((weights - missed)
                                              / (weights + a * prior * (1 - a) ** 5))
    # A long run of right guesses: the prior is forgotten, every draft is made and trusted.
    for _ in range(30):
        policy.record_guess(True)
    assert policy.trust_rate > 0.99 and policy.budget() == 7 and policy.trusted(7)


def test_without_the_prior_one_right_guess_is_trusted():
    from tileinfer.engine.generation.speculative.step_costs import DraftPolicy

    proposer = NgramProposer(k=7)
    proposer.prior_misses = 0.0
    policy = DraftPolicy(proposer, {})
    policy.record_guess(True)
    assert policy.trust_rate == 1.0 and policy.budget() == 7 and policy.trusted(7)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
@pytest.mark.parametrize("pattern", ["all-right", "every-3rd-wrong", "random"])
def test_gpu_pipelined_guesses_give_plain_greedy_output(tiny, backend, pattern):
    """The pipelined loop with CUDA graphs (device-given inputs, steps chained before their
    source is read, dropped steps still running): plain greedy output, token for token."""
    model = load_model(tiny.directory("qwen3", dtype=torch.bfloat16), dtype=torch.bfloat16,
                       backend=backend, max_len=MAX_LEN, device="cuda")
    prompt = prompt_ids(20, seed=2)
    plain = generate(model, prompt, 60, stop_ids=[])  # graphs, pipelined
    truth = prompt + plain
    rng = random.Random(pattern)
    wrong = {"all-right": set(),
             "every-3rd-wrong": set(range(len(prompt), len(truth), 3)),
             "random": {p for p in range(len(prompt), len(truth)) if rng.random() < 0.25}}[pattern]
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache)
    assert runner.graphs
    seq = cache.new_sequence()
    stats = SpecStats()
    out = generate_into(runner, seq, prompt, 60, stop_ids=[], speculative=Oracle(truth, wrong, k=7),
                        spec_stats=stats)
    assert out == plain and seq.tokens == prompt + plain[:-1]
    assert (stats.wasted_steps > 0) == (pattern != "all-right")
    # And the adaptive n-gram loop on the same runner (its costs measured meanwhile).
    assert generate_into(runner, cache.new_sequence(), prompt, 60, stop_ids=[],
                         speculative=NgramProposer(k=7)) == plain
    assert runner.step_seconds.get(1)
