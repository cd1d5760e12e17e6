"""A line of ``tileinfer chat`` that fails (an unknown command, a bad /set, a line that is not
UTF-8, input that ends inside a \"\"\" block): its error on standard error, the conversation as it
was. Piped in, the chat ends there with exit code 2, the later lines unsent and the turns before
it logged (``--continue`` goes on from there); at a terminal the chat goes on."""

import io
import json

import pytest

from cli_helpers import assert_one_line_error, tileinfer


def logged(home):
    result = tileinfer("logs", "--json", "-n", "0", env=home)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_failed_piped_line_ends_the_chat_on_stderr_with_exit_code_2(tiny_home):
    # Before: the error went to stdout among the answers, "then" was answered, and the exit
    # code was 0.
    alone = tileinfer("chat", "-m", "tiny", "-n", "3", "--no-log", stdin="the thin\n",
                      env=tiny_home)
    assert alone.returncode == 0, alone.stderr
    result = tileinfer("chat", "-m", "tiny", "-n", "3", stdin="the thin\n/bad-command\nthen\n",
                       env=tiny_home)
    assert_one_line_error(result, r"^tileinfer: error: line 2: unknown command '/bad-command'; "
                                  "commands: /set KEY VALUE")
    assert result.stdout == alone.stdout  # the first answer only: "then" was not sent
    rows = logged(tiny_home)
    assert [r["prompt"] for r in rows] == ["the thin"]
    again = tileinfer("chat", "--continue", "-n", "3", stdin="then\n", env=tiny_home)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    rows = logged(tiny_home)
    assert [r["prompt"] for r in rows] == ["the thin", "then"]
    assert rows[0]["conversation_id"] == rows[1]["conversation_id"]


@pytest.mark.parametrize("script, pattern, answered", [
    (b"/set temperature 0.5\n/set top_p 7\nthe thin\n", r"line 2: top_p: 7 is out of range",
     []),
    (b"the thin\n\xff\nthen\n", r"line 2: the line is not valid UTF-8 text \(byte 0xff",
     ["the thin"]),
    (b'the thin\n"""\nnever\nclosed\n', r'line 2: the input ended inside a """ block \(no '
                                         r'closing """\); its message was not sent', ["the thin"]),
])
def test_each_kind_of_failed_piped_line(tiny_home, script, pattern, answered):
    result = tileinfer("chat", "-m", "tiny", "-n", "2", stdin=script, env=tiny_home)
    assert_one_line_error(result, "^tileinfer: error: " + pattern)
    assert [r["prompt"] for r in logged(tiny_home)] == answered


def test_at_a_terminal_a_failed_line_is_said_on_stderr_and_the_chat_goes_on(tiny_home, capsys,
                                                                            monkeypatch):
    from tileinfer_cli.chat_loop import ChatLoop
    from tileinfer_cli.logs import Log
    from tileinfer_cli.main import build_parser
    from tileinfer_cli.options import load, sampling_from
    from tileinfer_cli.session import new_session

    for key, value in tiny_home.items():
        monkeypatch.setenv(key, value)
    args = build_parser().parse_args(["chat", "-m", "tiny", "-n", "2", "--no-log"])
    model, tokenizer, folder = load(args)
    sampling, stop_ids = sampling_from(args, folder, model.config)
    session = new_session(args, model, tokenizer, sampling, stop_ids)
    lines = iter(["/nope", "/set top_p 7", "the thin", "/set", "/exit"])

    class Keyboard:
        def read_line(self, prompt):
            return next(lines)

    out, console = io.StringIO(), io.StringIO()
    ChatLoop(session, args, [], Log(args, "chat"), {"cid": "c"}, Keyboard(), console, out,
             "tiny").run()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("tileinfer: error: unknown command '/nope'; commands: /set")
    assert err[1].startswith("tileinfer: error: top_p: 7 is out of range")
    assert [m.role for m in session.messages] == ["user", "assistant"]  # "the thin" answered
    assert "top_p=1.0" in out.getvalue() and "error" not in out.getvalue()
