"""``tileinfer chat`` on a real pseudo-terminal (pexpect), as a person types into it: Up recalls
the last line, a pasted multi-line block is one turn, ``/set temperature 0.7`` takes effect for
the next turn, and ``--continue`` resumes the conversation. What the model answered is noise (a
tiny random model); the conversation log says what the chat sent it."""

import json
import os
import sys

import pytest

from cli_helpers import tileinfer

pexpect = pytest.importorskip("pexpect")

UP, ENTER = "\x1b[A", "\r"
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # a terminal's bracketed paste
PROMPT = ">>>"  # prompt_toolkit draws the space after it as a cursor move


def chat(env, *args):
    child = pexpect.spawn(sys.executable, ["-m", "tileinfer_cli", "chat", "-m", "tiny", "-n", "3",
                                           "--seed", "1", *args],
                          env={**os.environ, **env, "TERM": "xterm", "PYTHONUNBUFFERED": "1",
                               "PROMPT_TOOLKIT_NO_CPR": "1"},
                          encoding="utf-8", timeout=120, dimensions=(30, 120))
    child.expect_exact(PROMPT)
    return child


def turn(child, keys):
    child.send(keys)
    child.expect_exact(PROMPT)


def logged(env):
    result = tileinfer("logs", "--json", "-n", "20", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # oldest first


@pytest.mark.slow
def test_a_chat_on_a_terminal(tiny_home):
    child = chat(tiny_home)
    turn(child, "hello there" + ENTER)
    turn(child, UP + ENTER)  # the last line again
    turn(child, PASTE_START + "first line\nsecond line" + PASTE_END + ENTER)
    turn(child, "/set temperature 0.7" + ENTER)
    turn(child, "after the set" + ENTER)
    child.send("/exit" + ENTER)
    child.expect(pexpect.EOF)
    rows = logged(tiny_home)
    assert [r["prompt"] for r in rows] == ["hello there", "hello there",
                                           "first line\nsecond line", "after the set"]
    assert len({r["conversation_id"] for r in rows}) == 1
    options = [r["options"] if isinstance(r["options"], dict) else json.loads(r["options"])
               for r in rows]
    assert options[-1].get("temperature") == 0.7
    assert all(o.get("temperature") != 0.7 for o in options[:-1])

    again = chat(tiny_home, "--continue")
    turn(again, "one more" + ENTER)
    again.send("/exit" + ENTER)
    again.expect(pexpect.EOF)
    rows = logged(tiny_home)
    assert rows[-1]["prompt"] == "one more"
    assert rows[-1]["conversation_id"] == rows[0]["conversation_id"]  # resumed, not a new one
