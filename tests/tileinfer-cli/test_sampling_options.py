"""``-o KEY VALUE`` on run and chat: every sampling option of the API by the OpenAI-style names
(temperature, top_p, top_k, seed, max_tokens, presence_penalty, frequency_penalty,
repetition_penalty, min_p, logit_bias), checked like the flags, unknown keys refused in
one line that lists the known ones."""

import json

import pytest

from cli_helpers import assert_one_line_error, tileinfer
from tileinfer_cli.main import build_parser


@pytest.mark.parametrize("command", [["run", "hi"], ["chat"]])
def test_each_option_sets_what_its_flag_sets(command):
    parse = build_parser().parse_args
    via_o = parse(command + ["-o", "temperature", "0.7", "-o", "top_p", "0.9", "-o", "top_k", "40",
                             "-o", "seed", "7", "--option", "max_tokens", "99"])
    via_flags = parse(command + ["--temperature", "0.7", "--top-p", "0.9", "--top-k", "40",
                                 "--seed", "7", "--max-new-tokens", "99"])
    assert vars(via_o) == vars(via_flags)
    assert (via_o.temperature, via_o.top_p, via_o.top_k, via_o.seed,
            via_o.max_new_tokens) == (0.7, 0.9, 40, 7, 99)
    assert parse(command + ["-o", "top_k", "1", "-o", "top_k", "2"]).top_k == 2  # the last wins



@pytest.mark.parametrize("command", [["run", "hi"], ["chat"]])
def test_logit_processing_options_set_what_their_flags_set(command):
    parse = build_parser().parse_args
    via_o = parse(command + ["-o", "presence_penalty", "0.5", "-o", "frequency_penalty", "-1",
                             "-o", "repetition_penalty", "1.2", "-o", "min_p", "0.05",
                             "-o", "logit_bias", '{"7": -100, "12": 2.5}'])
    via_flags = parse(command + ["--presence-penalty", "0.5", "--frequency-penalty", "-1",
                                 "--repetition-penalty", "1.2", "--min-p", "0.05",
                                 "--logit-bias", '{"7": -100, "12": 2.5}'])
    assert vars(via_o) == vars(via_flags)
    assert (via_o.presence_penalty, via_o.frequency_penalty, via_o.repetition_penalty,
            via_o.min_p, via_o.logit_bias) == (0.5, -1.0, 1.2, 0.05, {7: -100.0, 12: 2.5})


@pytest.mark.parametrize("args,pattern", [
    (["-o", "best_of", "1"], r"argument --option/-o: unknown option 'best_of'; the options are "
                             "temperature, top_p, top_k, seed, max_tokens, presence_penalty, "
                             "frequency_penalty, repetition_penalty, min_p, logit_bias"),
    (["-o", "presence_penalty", "2.5"], r"argument --option/-o: presence_penalty: 2.5 is out of "
                                        r"range"),
    (["-o", "repetition_penalty", "0"], r"argument --option/-o: repetition_penalty: 0 is out of "
                                        r"range"),
    (["-o", "min_p", "-0.1"], r"argument --option/-o: min_p: -0.1 is out of range"),
    (["-o", "logit_bias", "[1]"], r"argument --option/-o: logit_bias: \[1\] is not a JSON "
                                  r"object of token ids to biases"),
    (["-o", "logit_bias", '{"5": 300}'], r"argument --option/-o: logit_bias: the bias of token 5 "
                                         r"must be a number in \[-100, 100\]"),
    (["-o", "logit_bias", '{"x": 3}'], r"argument --option/-o: logit_bias: x is not a token id"),
    (["-o", "top_p", "2"], r"argument --option/-o: top_p: 2 is out of range"),
    (["-o", "max_tokens", "0"], r"argument --option/-o: max_tokens: 0 is out of range"),
    (["-o", "seed", "x"], r"argument --option/-o: seed: 'x' is not an integer"),
    (["-o", "temperature"], r"argument --option/-o: expected 2 arguments"),
])
def test_bad_options_are_one_line(args, pattern):
    assert_one_line_error(tileinfer("run", "hi", *args), pattern)
    assert_one_line_error(tileinfer("chat", *args), pattern)


def test_options_reach_the_sampler(tiny_home):
    def tokens(*args):
        result = tileinfer("run", "-m", "tiny", "--json", *args, "the thin", env=tiny_home)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["tokens"]

    sampled = tokens("-o", "temperature", "1.5", "-o", "seed", "3", "-o", "top_k", "20",
                     "-o", "max_tokens", "6")
    assert sampled == tokens("--temperature", "1.5", "--seed", "3", "--top-k", "20", "-n", "6")
    assert len(sampled) == 6 and sampled != tokens("-n", "6")


def test_logit_processing_options_reach_the_sampler(tiny_home):
    def tokens(*args):
        result = tileinfer("run", "-m", "tiny", "--json", "--temperature", "0", "-n", "8", *args,
                           "the thin", env=tiny_home)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["tokens"]

    greedy = tokens()
    assert tokens("-o", "logit_bias", json.dumps({str(greedy[0]): -100}))[0] != greedy[0]
    assert tokens("-o", "frequency_penalty", "2", "-o", "presence_penalty", "2") != greedy
    result = tileinfer("run", "-m", "tiny", "-o", "logit_bias", '{"99999999": 1}', "hi",
                       env=tiny_home)
    assert_one_line_error(result, "logit_bias: token 99999999 is outside the vocabulary")
    result = tileinfer("run", "-m", "tiny", "--speculative", "ngram", "-o", "min_p", "0.1",
                       "-o", "temperature", "1", "hi", env=tiny_home)
    assert_one_line_error(result, "speculative decoding does not take min_p 0.1 .*"
                                  "-o min_p 0 turn them off")


def test_generation_config_penalty_is_the_default_and_an_option_overrides_it(tmp_path):
    """generation_config.json's repetition_penalty (Qwen2.5's Instruct models set one) applies
    to run and chat as transformers applies it; -o repetition_penalty 1 turns it off."""
    from types import SimpleNamespace

    from tileinfer import SamplingParams
    from tileinfer_cli.options import sampling_from

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
         "repetition_penalty": 1.1, "eos_token_id": [5, 6]}))
    config = SimpleNamespace(vocab_size=100, eos_token_ids=(5,))
    parse = build_parser().parse_args
    params, stops = sampling_from(parse(["run", "hi"]), tmp_path, config)
    assert params == SamplingParams(0.7, top_k=20, top_p=0.8, repetition_penalty=1.1)
    assert stops == [5, 6]
    params, _ = sampling_from(parse(["run", "hi", "-o", "repetition_penalty", "1", "-t", "0",
                                     "--min-p", "0.1"]), tmp_path, config)
    assert params == SamplingParams(0.0, top_k=20, top_p=0.8, min_p=0.1)
