"""The conversation log (SQLite under TileInfer's home): run answers and chat turns stored,
``tileinfer logs`` listing and searching them, ``chat --continue``/``--cid`` going on with one,
``--no-log`` and TILEINFER_LOGS=0, and a corrupt, locked or contended database that never costs an
answer."""

import argparse
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, tileinfer


def run_json(home, prompt, *args):
    result = tileinfer("run", "-m", "tiny", "--json", "-n", "3", *args, prompt, env=home)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


def logs_command(home, *args):
    """(exit code, stdout, stderr) of `tileinfer logs ARGS`, run in this process (it loads no
    model)."""
    import contextlib
    import io

    from tileinfer_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in home.items():
            patch.setenv(key, value)
        patch.setattr("sys.stdout", out)
        with contextlib.redirect_stderr(err):
            code = main(["logs", *args])
    return code, out.getvalue(), err.getvalue()


def logged(home, *args):
    code, out, err = logs_command(home, "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_run_answers_are_logged_and_found(tiny_home):
    first = run_json(tiny_home, "the thin", "--system", "Be brief.")
    second = run_json(tiny_home, "then", "-o", "temperature", "0.5", "-o", "seed", "4")
    rows = logged(tiny_home, "-n", "0")
    assert [r["prompt"] for r in rows] == ["the thin", "then"]
    a, b = rows
    assert (a["answer"], a["answer_tokens"], a["prompt_tokens"]) == (
        first["text"], len(first["tokens"]), first["prompt_tokens"])
    assert (a["system"], a["model"], a["backend"], a["command"]) == ("Be brief.", "tiny", "ref",
                                                                      "run")
    assert a["finish_reason"] == first["finish_reason"] and a["seconds"] > 0
    assert a["conversation_id"] == first["conversation_id"] != b["conversation_id"]
    assert b["conversation_id"] == second["conversation_id"]
    assert b["options"] == {"temperature": 0.5, "top_p": 1.0, "top_k": 0, "seed": 4,
                            "max_tokens": 3}
    assert [r["prompt"] for r in logged(tiny_home, "-q", "thin")] == ["the thin"]
    assert [r["prompt"] for r in logged(tiny_home, "-q", "brief")] == ["the thin"]
    assert [r["prompt"] for r in logged(tiny_home, "-n", "1")] == ["then"]
    assert logged(tiny_home, "-q", "100%") == []  # % is text, not a wildcard
    text = logs_command(tiny_home)[1]
    assert "## Prompt\n\nthe thin\n" in text and "## System\n\nBe brief." in text


def test_no_log_and_the_environment_switch(tiny_home):
    run_json(tiny_home, "the thin", "--no-log")
    run_json({**tiny_home, "TILEINFER_LOGS": "0"}, "the thin")
    assert not (Path(tiny_home["TILEINFER_HOME"]) / "logs.db").exists()
    assert logs_command(tiny_home)[1] == "nothing logged yet\n"


def test_chat_turns_are_logged_and_continued(tiny_home, tiny_gguf_file):
    from tileinfer import ChatMessage, ChatSession, load_model, load_tokenizer

    chat = tileinfer("chat", "-m", "tiny", "-n", "3", stdin="the thin\nthen\n", env=tiny_home)
    assert chat.returncode == 0, chat.stderr
    rows = logged(tiny_home)
    assert [r["prompt"] for r in rows] == ["the thin", "then"]
    assert rows[0]["conversation_id"] == rows[1]["conversation_id"]
    assert rows[0]["command"] == "chat"
    resumed = tileinfer("chat", "-m", "tiny", "-n", "3", "--continue", stdin="in\n/stats\n",
                        env=tiny_home)
    assert resumed.returncode == 0, resumed.stderr
    folder = Path(tiny_home["TILEINFER_HOME"]) / "models" / "tiny"
    session = ChatSession(load_model(folder, backend="ref"), load_tokenizer(folder))
    history = []
    for r in rows:
        history += [ChatMessage("user", r["prompt"]), ChatMessage("assistant", r["answer"])]
    expected = len(session.prompt_ids(history + [ChatMessage("user", "in")]))
    assert f"reused 0 cached prompt tokens, prefilled {expected}," in resumed.stdout
    after = logged(tiny_home, "-n", "0")
    assert [r["prompt"] for r in after] == ["the thin", "then", "in"]
    assert len({r["conversation_id"] for r in after}) == 1
    by_id = tileinfer("chat", "-m", "tiny", "-n", "1", "--cid", rows[0]["conversation_id"],
                      stdin="/stats\n", env=tiny_home)
    assert by_id.returncode == 0, by_id.stderr
    assert_one_line_error(tileinfer("chat", "--cid", "nosuch", env=tiny_home),
                          "no conversation 'nosuch' in the log")


def test_reset_starts_a_new_logged_conversation(tiny_home):
    chat = tileinfer("chat", "-m", "tiny", "-n", "2", stdin="the thin\n/reset\nthen\n",
                     env=tiny_home)
    assert chat.returncode == 0, chat.stderr
    a, b = logged(tiny_home)
    assert a["conversation_id"] != b["conversation_id"]


def test_corrupt_log_costs_one_warning_not_the_answer(tiny_home):
    db = Path(tiny_home["TILEINFER_HOME"]) / "logs.db"
    db.write_bytes(b"this is not a database" * 100)
    result = tileinfer("run", "-m", "tiny", "-n", "15", "hello there", env=tiny_home)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr  # "\n" * 11 + "wwww"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tileinfer: warning: the answer was not "
                                                   "logged (file is not a database;"), lines
    assert db.read_bytes() == b"this is not a database" * 100
    assert_one_line_error(tileinfer("logs", env=tiny_home), "cannot read the log .*logs.db: "
                                                            "file is not a database")


def record(log, i):
    return log.write("c", model="m", backend="ref", system=None, prompt=f"p{i}", answer="a",
                     options={}, prompt_tokens=1, answer_tokens=1, time_to_first_token=0.1,
                     seconds=0.1, finish_reason="stop")


def test_locked_log_costs_one_warning(tmp_path, monkeypatch, capsys):
    from tileinfer_cli import logs

    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path))
    monkeypatch.setattr(logs, "BUSY_TIMEOUT_S", 0.2)
    log = logs.Log(argparse.Namespace(no_log=False), "run")
    assert record(log, 0)
    holder = sqlite3.connect(tmp_path / "logs.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    assert not record(log, 1) and not record(log, 2)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "the answer was not logged (database is locked" in err[0]
    holder.execute("COMMIT")
    assert record(log, 3)
    assert [r["prompt"] for r in logs.recent(0)] == ["p0", "p3"]


WRITER = """
import argparse, sys
from tileinfer_cli import logs
log = logs.Log(argparse.Namespace(no_log=False), "run")
for i in range(25):
    assert log.write(sys.argv[1], model="m", backend="ref", system=None, prompt=f"p{i}",
                     answer="a", options={}, prompt_tokens=1, answer_tokens=1,
                     time_to_first_token=0.1, seconds=0.1, finish_reason="stop")
"""


def test_concurrent_writers_lose_nothing(tmp_path):
    env = {**os.environ, "TILEINFER_HOME": str(tmp_path)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, f"w{n}"], env=env,
                                stderr=subprocess.PIPE, text=True) for n in range(4)]
    for w in writers:
        assert w.wait(timeout=120) == 0 and w.stderr.read() == ""
    db = sqlite3.connect(tmp_path / "logs.db")
    assert db.execute("SELECT count(*) FROM responses").fetchone()[0] == 100
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# --- what a logged run needs to be made again --------------------------------------------------


def last_row(home):
    return logged(home, "-n", "1")[0]


def test_continue_goes_on_with_the_conversations_model(tiny_home, tiny_gguf_file):
    from tileinfer import import_gguf

    import_gguf(tiny_gguf_file, Path(tiny_home["TILEINFER_HOME"]) / "models" / "tiny2")
    chat = tileinfer("chat", "-m", "tiny2", "-n", "2", stdin="the thin\n", env=tiny_home)
    assert chat.returncode == 0, chat.stderr
    # Before: without a model, --continue loaded the default model (SmolLM2), not tiny2.
    resumed = tileinfer("chat", "--continue", "-n", "2", stdin="then\n", env=tiny_home)
    assert resumed.returncode == 0, resumed.stderr
    first, second = logged(tiny_home, "-n", "0")
    assert (first["model"], second["model"]) == ("tiny2", "tiny2")
    assert first["conversation_id"] == second["conversation_id"]
    # A model named on the command line answers instead (as llm -c -m), and is the one the
    # next --continue goes on with.
    other = tileinfer("chat", "-c", "-m", "tiny", "-n", "2", stdin="in\n", env=tiny_home)
    assert other.returncode == 0, other.stderr
    again = tileinfer("chat", "-c", "-n", "2", stdin="on\n", env=tiny_home)
    assert again.returncode == 0, again.stderr
    rows = logged(tiny_home, "-n", "0")
    assert [(r["prompt"], r["model"]) for r in rows] == [
        ("the thin", "tiny2"), ("then", "tiny2"), ("in", "tiny"), ("on", "tiny")]
    assert len({r["conversation_id"] for r in rows}) == 1


def test_a_conversation_whose_model_is_gone_is_one_line(tiny_home):
    from tileinfer_cli import logs

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TILEINFER_HOME", tiny_home["TILEINFER_HOME"])
        record(logs.Log(argparse.Namespace(no_log=False), "chat"), 0)  # model "m": not here
    assert_one_line_error(tileinfer("chat", "--continue", env=tiny_home),
                          r"conversation c was with the model 'm', which is not here \(.*\); -m "
                          "MODEL goes on with another model")
    resumed = tileinfer("chat", "--continue", "-m", "tiny", "-n", "1", stdin="x\n", env=tiny_home)
    assert resumed.returncode == 0, resumed.stderr


def test_a_model_folder_is_logged_by_its_absolute_path(tiny_home, tmp_path):
    folder = Path(tiny_home["TILEINFER_HOME"]) / "models" / "tiny"
    result = tileinfer("run", "-m", "tiny", "-n", "1", "hi", env=tiny_home, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    result = tileinfer("run", "-m", "./tiny", "-n", "1", "hi", env=tiny_home,
                       cwd=str(folder.parent))
    assert result.returncode == 0, result.stderr
    assert [r["model"] for r in logged(tiny_home, "-n", "0")] == ["tiny", str(folder.resolve())]
    resumed = tileinfer("chat", "-c", "-n", "1", stdin="x\n", env=tiny_home, cwd=str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
    assert last_row(tiny_home)["model"] == str(folder.resolve())


def test_logged_options_make_the_run_again(tiny_home):
    # Before: the drawn seed, --fp8 and --speculative were not logged; --regex neither.
    options = ("-t", "0.9", "--fp8", "--speculative", "ngram", "--draft-k", "3")
    first = run_json(tiny_home, "the thin", "-n", "8", *options)
    logged_options = last_row(tiny_home)["options"]
    seed = logged_options["seed"]
    assert isinstance(seed, int)
    assert {k: logged_options[k] for k in ("temperature", "quantization", "speculative",
                                           "draft_k")} == {"temperature": 0.9,
                                                           "quantization": "fp8",
                                                           "speculative": "ngram", "draft_k": 3}
    again = run_json(tiny_home, "the thin", "-n", "8", *options, "--seed", str(seed))
    assert again["tokens"] == first["tokens"]
    other = run_json(tiny_home, "the thin", "-n", "8", *options, "--seed", str(seed + 1))
    assert other["tokens"] != first["tokens"]  # so that the seed is what made them equal
    assert last_row(tiny_home)["options"]["seed"] == seed + 1
    run_json(tiny_home, "the thin", "--regex", "[a-z]+", "--kv-cache", "int8")
    row = last_row(tiny_home)["options"]
    assert (row["regex"], row["kv_cache"], row["seed"]) == ("[a-z]+", "int8", None)  # greedy


def test_chat_turns_log_their_seeds(tiny_home):
    script = "the thin\nthen\n"
    chat = tileinfer("chat", "-m", "tiny", "-n", "6", "-t", "0.9", stdin=script, env=tiny_home)
    assert chat.returncode == 0, chat.stderr
    a, b = logged(tiny_home)
    seed = a["options"]["seed"]
    assert isinstance(seed, int) and b["options"]["seed"] == seed
    assert (a["options"]["turn_seed"], b["options"]["turn_seed"]) == (seed, seed + 1)
    again = tileinfer("chat", "-m", "tiny", "-n", "6", "-t", "0.9", "--seed", str(seed),
                      stdin=script, env=tiny_home)
    assert again.returncode == 0, again.stderr
    assert again.stdout == chat.stdout
    assert [r["answer"] for r in logged(tiny_home, "-n", "2")] == [a["answer"], b["answer"]]
