"""``--think`` / ``--no-think`` against the chat template's own source: refused with one line
naming the model where the template reads no ``enable_thinking`` (the flag would change
nothing), taken where it does."""

import json

import pytest

from cli_helpers import assert_one_line_error, tileinfer

# The tiny model's tokens (<|im_start|>, <|im_end|>) with Qwen3's switch: an empty think block
# written into the prompt when enable_thinking is false.
SWITCHED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}")
# DeepSeek-R1's distills: every answer starts in a think block the template opens.
ALWAYS = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
# The name in a comment only: the template reads no such variable.
COMMENT = "{# enable_thinking #}{% for m in messages %}{{ m.content }}{% endfor %}"


def template(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(source)
    return str(path)


@pytest.mark.parametrize("command", ["run", "chat"])
def test_think_for_a_model_without_a_thinking_mode_is_one_line(tiny_home, command):
    # Before: --think was taken and changed nothing.
    args = ["hi"] if command == "run" else []
    result = tileinfer(command, "-m", "tiny", "--think", *args, stdin="hi\n", env=tiny_home)
    assert_one_line_error(result, r"^tileinfer: error: --think: tiny's chat template has no "
                                  r"thinking mode \(it reads no enable_thinking\)")
    assert result.stdout == ""


def test_no_think_for_a_model_that_never_thinks_is_taken(tiny_home):
    result = tileinfer("run", "-m", "tiny", "--no-think", "-n", "2", "hi", env=tiny_home)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_a_template_with_the_switch_takes_both(tiny_home, tmp_path):
    path = template(tmp_path, "switched.jinja", SWITCHED)
    tokens = {}
    for flag in ("--think", "--no-think"):
        result = tileinfer("run", "-m", "tiny", "--chat-template", path, flag, "-n", "1",
                           "--json", "hi", env=tiny_home)
        assert result.returncode == 0, result.stderr
        tokens[flag] = json.loads(result.stdout)["prompt_tokens"]
    assert tokens["--no-think"] > tokens["--think"]  # the switch changed the prompt


def test_templates_without_the_switch(tiny_home, tmp_path):
    always = template(tmp_path, "always.jinja", ALWAYS)
    assert_one_line_error(
        tileinfer("run", "-m", "tiny", "--chat-template", always, "--no-think", "hi",
                  env=tiny_home),
        r"--no-think: the chat template .*always\.jinja starts every answer in a <think> block "
        "and reads no enable_thinking")
    assert_one_line_error(
        tileinfer("run", "-m", "tiny", "--chat-template", always, "--think", "hi",
                  env=tiny_home), r"--think: the chat template .*always\.jinja has no thinking")
    comment = template(tmp_path, "comment.jinja", COMMENT)
    assert_one_line_error(
        tileinfer("run", "-m", "tiny", "--chat-template", comment, "--think", "hi",
                  env=tiny_home), r"--think: the chat template .*comment\.jinja has no thinking")
