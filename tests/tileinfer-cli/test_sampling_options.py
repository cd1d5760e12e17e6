"""``-o KEY VALUE`` on run and chat: every sampling option of the API by the OpenAI-style names
(temperature, top_p, top_k, seed, max_tokens), checked like the flags, unknown keys refused in
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


@pytest.mark.parametrize("args,pattern", [
    (["-o", "frequency_penalty", "1"], r"argument --option/-o: unknown option "
                                       r"'frequency_penalty'; the options are temperature, "
                                       "top_p, top_k, seed, max_tokens"),
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
