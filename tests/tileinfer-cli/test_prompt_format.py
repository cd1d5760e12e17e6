"""``--raw`` (no chat template: the text completed as it is) and ``--chat-template FILE`` (another
Jinja template, with the model's special tokens), checked against generating from the ids that
each should produce."""

import json

import pytest

from cli_helpers import assert_one_line_error, tileinfer

TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture
def tiny(tiny_home):
    from pathlib import Path

    from tileinfer import load_model, load_tokenizer

    folder = Path(tiny_home["TILEINFER_HOME"]) / "models" / "tiny"
    return load_model(folder, backend="ref"), load_tokenizer(folder), folder


def run_json(home, *args):
    result = tileinfer("run", "-m", "tiny", "--json", "-n", "5", "--speculative", "none", *args,
                       env=home)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def greedy(model, ids):
    from tileinfer import generate

    return generate(model, ids, 5, stop_ids=list(model.config.eos_token_ids))


def test_raw_completes_the_text_as_it_is(tiny_home, tiny):
    model, tok, folder = tiny
    out = run_json(tiny_home, "--raw", "the thin")
    ids = tok.encode("the thin", add_special_tokens=True)
    assert out["prompt_tokens"] == len(ids)
    assert out["tokens"] == greedy(model, ids)
    templated = run_json(tiny_home, "the thin")
    assert templated["prompt_tokens"] > out["prompt_tokens"]  # the model's template wraps it


def test_chat_template_file_replaces_the_models(tiny_home, tiny, tmp_path):
    from tileinfer import ChatMessage, chat_prompt

    model, tok, folder = tiny
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    out = run_json(tiny_home, "--chat-template", str(tmp_path / "t.jinja"), "--system", "Be",
                   "the thin")
    text = chat_prompt(TEMPLATE, [ChatMessage("system", "Be"), ChatMessage("user", "the thin")],
                       bos_token=tok.decode([model.config.bos_token_id]))
    assert text.startswith("<|im_start|>[system] Be\n[user] the thin\n[assistant] ")
    ids = tok.encode(text, add_special_tokens=False)
    assert out["prompt_tokens"] == len(ids)
    assert out["tokens"] == greedy(model, ids)


def test_chat_uses_the_template_file(tiny_home, tiny, tmp_path):
    model, tok, folder = tiny
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    result = tileinfer("chat", "-m", "tiny", "-n", "2", "--chat-template", str(tmp_path / "t.jinja"),
                       stdin="the thin\n/stats\n", env=tiny_home)
    assert result.returncode == 0, result.stderr
    expected = len(tok.encode("<|im_start|>[user] the thin\n[assistant] ", add_special_tokens=False))
    assert f"prefilled {expected}," in result.stdout


@pytest.mark.parametrize("args,pattern", [
    (["--raw", "--system", "S"], "--raw uses no chat template, so --system cannot apply"),
    (["--raw", "--chat-template", "x.jinja"], "so --chat-template cannot apply"),
    (["--chat-template", "/no/such.jinja"], "cannot read the chat template /no/such.jinja: No "
                                            "such file"),
])
def test_template_mistakes_are_one_line(args, pattern):
    assert_one_line_error(tileinfer("run", *args, "hi"), pattern)


def test_template_that_does_not_compile_is_one_line(tmp_path):
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}\n{{ m.content }")
    for command in (["run", "hi"], ["chat"]):
        assert_one_line_error(tileinfer(*command, "--chat-template", str(tmp_path / "bad.jinja")),
                              r"bad.jinja: the chat template does not compile \(line 2\)")
