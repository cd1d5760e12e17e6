"""``tileinfer chat`` as people expect a REPL to behave: line editing and history on a terminal
(prompt_toolkit), multi-line messages (\"\"\" blocks, pastes), no prompts when piped, --stop,
/set, a clear note when the context is full, and /stats that forgets a /reset conversation."""

import argparse
import io
import re

import pytest

from cli_helpers import assert_one_line_error, tileinfer
from tileinfer_cli.chat_input import PipedInput, TerminalInput, read_turn

# --- reading turns -------------------------------------------------------------------------------


def lines_of(*lines):
    it = iter(lines)

    def read_line(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    return read_line


def test_a_fenced_block_is_one_turn():
    read = lines_of('"""', "first line", "", "  indented", '"""', "next")
    assert read_turn(read) == "first line\n\n  indented"
    assert read_turn(read) == "next"
    assert read_turn(lines_of('"""opening text', 'closing text"""')) == "opening text\nclosing text"
    assert read_turn(lines_of('"""one line"""')) == "one line"
    with pytest.raises(EOFError):  # the end of the input between turns
        read_turn(lines_of())


def test_input_that_ends_inside_a_block_is_an_error_not_a_silent_loss():
    from tileinfer_cli.errors import UserError

    # Before: the block's text was dropped and the chat ended with exit code 0.
    with pytest.raises(UserError, match='the input ended inside a """ block'):
        read_turn(lines_of('"""', "never closed"))


def test_piped_lines_drop_terminal_escape_sequences():
    # An arrow key typed into `cat | tileinfer chat` arrives as ESC [ D: it must not reach the
    # model.
    reader = PipedInput(io.BytesIO(b"hel\x1b[Dlo\x1b[A\r\nsecond\n"))
    assert reader.read_line(">>> ") == "hello"
    assert reader.read_line(">>> ") == "second"
    with pytest.raises(EOFError):
        reader.read_line(">>> ")


@pytest.fixture
def terminal(tmp_path):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    with create_pipe_input() as keys:
        yield keys, TerminalInput(tmp_path / "chat_history", input=keys, output=DummyOutput())


def test_terminal_arrow_keys_edit_the_line_and_history_recalls(terminal, tmp_path):
    keys, reader = terminal
    keys.send_text("helo\x1b[Dl\r")  # Left moves before the "o": an "l" goes in there
    assert reader.read_line(">>> ") == "hello"
    keys.send_text("\x1b[A\x1b[A!\r")  # Up recalls the last message
    assert reader.read_line(">>> ") == "hello!"
    assert "+hello" in (tmp_path / "chat_history").read_text()


def test_terminal_paste_of_several_lines_is_one_turn(terminal):
    keys, reader = terminal
    keys.send_text("\x1b[200~line one\nline two\x1b[201~\r")
    assert read_turn(reader.read_line) == "line one\nline two"


# --- turns in a session --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tiny_gguf_file, tmp_path_factory):
    from tileinfer import import_gguf, load_model, load_tokenizer

    folder = import_gguf(tiny_gguf_file, tmp_path_factory.mktemp("m") / "tiny")
    return load_model(folder, backend="ref"), load_tokenizer(folder)


def session_of(tiny_model, **kwargs):
    from tileinfer import ChatSession

    model, tok = tiny_model
    return ChatSession(model, tok, **kwargs)


def test_stop_string_ends_the_reply_and_the_conversation_goes_on(tiny_model):
    from tileinfer_cli.session import chat_turn

    reference, _ = session_of(tiny_model).reply("hello there", 20)
    cut = next(i for i in range(1, len(reference) - 2)
               if reference.find(reference[i:i + 2]) == i and "\ufffd" not in reference[:i + 2])
    stop = reference[cut:cut + 2]
    session, out = session_of(tiny_model), io.StringIO()
    turn = chat_turn(session, "hello there", 20, [stop], out)
    assert out.getvalue() == turn.text == reference[:cut]
    assert (turn.finish, turn.stop) == ("stop", stop)
    assert [(m.role, m.content) for m in session.messages] == [("user", "hello there"),
                                                               ("assistant", reference[:cut])]
    again = chat_turn(session, "then", 4, [], io.StringIO())  # the cache rebuilds at this turn
    assert again.reused is not None and len(again.tokens) == 4


def test_full_context_is_said_in_cli_words_and_changes_nothing(tiny_model):
    from tileinfer_cli.session import ContextFull, chat_turn

    session = session_of(tiny_model, max_tokens=24)
    turn = chat_turn(session, "the thin", 50, [], io.StringIO())
    assert turn.finish == "context" and len(turn.tokens) == 24 - turn.prompt_tokens
    before = list(session.messages)
    with pytest.raises(ContextFull, match="/reset starts over, or start the chat again with a "
                                          "larger --max-len"):
        chat_turn(session, "the thin " * 20, 50, [], io.StringIO())
    assert session.messages == before


def chat(home, script, *args, code=0):
    result = tileinfer("chat", "-m", "tiny", *args, stdin=script, env=home)
    assert result.returncode == code, result.stderr
    return result.stdout


def test_piped_chat_writes_no_prompts_and_stats_forget_a_reset(tiny_home):
    # Before: /stats after /reset repeated the cleared turn, and ">>> " filled piped output.
    out = chat(tiny_home, "the thin\n/stats\n/reset\n/stats\n", "-n", "3")
    assert ">>>" not in out and "..." not in out
    assert out.count("reused 0 cached prompt tokens") == 1
    assert out.rstrip().endswith("(conversation cleared)\n(no turn yet)")


def test_context_full_note_in_the_chat(tiny_home):
    result = tileinfer("chat", "-m", "tiny", "--max-len", "24", "-n", "50",
                       stdin="the thin\n" + "the thin " * 20 + "\n", env=tiny_home)
    assert ("(the reply was cut: the conversation filled the 24 tokens of --max-len; /reset "
            "starts over") in result.stdout
    # The message that does not fit is a failed line: said on stderr, exit code 2.
    assert_one_line_error(result, "^tileinfer: error: line 2: the conversation is [0-9]+ tokens "
                                  "with this message, more than the 24 of --max-len: /reset "
                                  "starts over")
    assert "PromptTooLongError" not in result.stderr and "max_tokens" not in result.stderr


def test_set_changes_sampling_the_way_the_flags_would(tiny_home, tiny_model):
    from tileinfer import SamplingParams

    script = "/set temperature 1.5\n/set seed 3\n/set top_k 20\n/set max_tokens 6\nthe thin\n"
    out = chat(tiny_home, script, "--speculative", "none")
    lines = out.splitlines()
    assert lines[:4] == ["(set temperature to 1.5)", "(set seed to 3)", "(set top_k to 20)",
                         "(set max_tokens to 6)"]
    reference, _ = session_of(tiny_model, sampling=SamplingParams(1.5, top_k=20),
                              seed=3).reply("the thin", 6)
    greedy, _ = session_of(tiny_model).reply("the thin", 6)
    assert reference != greedy  # so that the comparison below says something
    assert "\n".join(lines[4:]).rstrip("\n") == reference.rstrip("\n")


def test_set_system(tiny_home, tiny_model):
    from tileinfer import ChatMessage

    out = chat(tiny_home, "/set system Be brief.\n/set\nthe thin\n/stats\n", "-n", "1")
    expected = len(session_of(tiny_model).prompt_ids([ChatMessage("system", "Be brief."),
                                                      ChatMessage("user", "the thin")]))
    assert f"reused 0 cached prompt tokens, prefilled {expected}," in out
    assert "(system message set)" in out
    assert "system='Be brief.'" in out


@pytest.mark.parametrize("line, message", [
    ("/set top_q 1", "unknown option 'top_q'; the options are temperature, top_p, top_k, seed, "
                     "max_tokens"),
    ("/set top_p 7", "top_p: 7 is out of range"),
    ("/bad-command", "unknown command '/bad-command'; commands: /set KEY VALUE"),
])
def test_a_failed_command_changes_nothing(tiny_model, line, message):
    from tileinfer_cli.chat_commands import Commands
    from tileinfer_cli.errors import UserError

    session = session_of(tiny_model)
    args = argparse.Namespace(max_new_tokens=5)
    out = io.StringIO()
    commands = Commands(session, args, out)
    before = commands.settings()
    with pytest.raises(UserError, match=re.escape(message)):
        commands(line)
    assert commands.settings() == before and out.getvalue() == ""
