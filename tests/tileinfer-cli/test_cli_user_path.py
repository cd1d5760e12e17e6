"""The command line of issue 20, run as a user runs it (a subprocess, the embedded SmolLM2 on the
ref backend): --version, a fast --help with defaults and examples, prompts from standard input
and files, --system, --stop, --json, --threads, models listed, run and removed by name, and every
mistake as one line with exit code 2, leaving nothing behind."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_helpers import tileinfer

TESTS = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of France?"


def assert_one_line_error(result, pattern):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(pattern, lines[0]), result.stderr


@pytest.fixture(scope="session")
def home(smollm2_dir):
    """TILEINFER_HOME of the test session, where the default model is already imported."""
    return {"TILEINFER_HOME": str(smollm2_dir.parent.parent)}


def run_json(home, *args, stdin=None):
    result = tileinfer("run", "--json", *args, stdin=stdin, env=home)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- version and help ----------------------------------------------------------------------------

def test_version_lists_the_distributions_and_backends():
    result = tileinfer("--version")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for line in ("tileinfer-core 0.1.0", "tileinfer-cli 0.1.0",
                 "tileinfer-backend-ref 0.1.0  (backend: ref)",
                 "tileinfer-backend-triton 0.1.0  (backend: triton)"):
        assert line in out, out
    assert "torch " in out and "Python " in out


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["--version"]])
def test_help_and_version_import_neither_torch_nor_tileinfer(args):
    # Before: --help took 5 s, importing torch at startup.
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "tileinfer_cli", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    modules = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
               if line.startswith("import time:")}
    assert "tileinfer_cli.main" in modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "tileinfer", "numpy")}


@pytest.mark.parametrize("command", ["run", "chat", "pull", "rm", "import", "bench"])
def test_help_shows_defaults_and_examples(command):
    result = tileinfer(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "examples:" in result.stdout
    if command in ("run", "chat"):
        assert "the longest answer in tokens (default: 512)" in result.stdout
        assert "(default: bf16)" in result.stdout  # --kv-cache
    if command == "bench":
        assert "(default: llama3.2-1b)" in result.stdout and "(default: 256)" in result.stdout


# --- numbers and text are checked before anything loads ------------------------------------------

@pytest.mark.parametrize("args,pattern", [
    (["run", "hi", "--seed", "100000000000000000000000"], "--seed: 1000.* is out of range"),
    (["run", "hi", "--seed", "-1"], "--seed: -1 is out of range"),
    (["run", "hi", "--max-new-tokens", "0"], "--max-new-tokens/-n: 0 is out of range"),
    (["run", "hi", "--max-len", "0"], "--max-len: 0 is out of range"),
    (["run", "hi", "--max-len", "99999999999999"], "--max-len: .* is out of range"),
    (["run", "hi", "--top-k", "-1"], "--top-k: -1 is out of range"),
    (["run", "hi", "--top-p", "0"], r"--top-p: 0 is out of range: use a number in \(0, 1\]"),
    (["run", "hi", "--temperature", "nan"], "--temperature/-t: nan is out of range"),
    (["run", "hi", "--temperature", "-1"], "--temperature/-t: -1 is out of range"),
    (["run", "hi", "--threads", "0"], "--threads: 0 is out of range"),
    (["run", "hi", "--speculative", "ngram", "--draft-k", "0"], "--draft-k: 0 is out of range"),
    (["run", "hi", "--seed", "abc"], "--seed: 'abc' is not an integer"),
    (["chat", "--max-new-tokens", "-3"], "--max-new-tokens/-n: -3 is out of range"),
    (["bench", "--repeats", "0"], "--repeats: 0 is out of range"),
    (["bench", "--prompt-len", "0"], "--prompt-len: 0 is out of range"),
    (["bench", "--shape", "llama9"], "--shape: invalid choice"),
])
def test_numeric_options_out_of_range_are_one_line(args, pattern):
    assert_one_line_error(tileinfer(*args), pattern)


def test_invalid_utf8_on_the_command_line_is_one_line():
    # Before: a traceback ("TextInputSequence must be str").
    result = tileinfer("run", b"caf\xff au lait")
    assert_one_line_error(result, r"the command line is not valid UTF-8 text \(byte 0xff at "
                                  "character 4\\)")
    assert_one_line_error(tileinfer("run", "--system", b"\xc3(", "hi"),
                          "--system is not valid UTF-8 text")
    assert_one_line_error(tileinfer("run", "--stop", b"\xfe", "hi"), "--stop is not valid UTF-8")


def test_invalid_utf8_on_standard_input_is_one_line():
    assert_one_line_error(tileinfer("run", stdin=b"caf\xe9\n"),
                          r"standard input is not valid UTF-8 text \(byte 0xe9 at byte offset 3\)")


def test_empty_or_missing_prompt_is_one_line(tmp_path):
    assert_one_line_error(tileinfer("run", stdin=b"  \n"), "the prompt is empty")
    assert_one_line_error(tileinfer("run", "--file", str(tmp_path / "nope.txt")),
                          "cannot read the prompt file .*nope.txt: No such file")
    assert_one_line_error(tileinfer("run", "a", "b", "c"), "quote the prompt")


# --- prompts from standard input and files, --system, --stop, --json, --threads -----------------

@pytest.mark.slow
def test_prompt_from_standard_input(home):
    # Before: `echo q | tileinfer run -` answered the literal "-".
    result = tileinfer("run", "-n", "12", stdin=QUESTION + "\n", env=home)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    # "-", with the default model named (before: `run -m NAME` knew pulled repos only).
    out = run_json(home, "-n", "12", "-m", "SmolLM2-135M-Instruct", "-", stdin=QUESTION)
    assert "Paris" in out["text"]
    assert out["finish_reason"] == "stop" and len(out["tokens"]) < 12  # the end token came


@pytest.mark.slow
def test_prompt_from_a_file(home, tmp_path):
    question = tmp_path / "q.txt"
    question.write_text(QUESTION + "\n")
    out = run_json(home, "-n", "12", "--file", str(question), "--threads", "1")
    assert "Paris" in out["text"]


@pytest.mark.slow
def test_json_reports_text_tokens_timings_and_finish_reason(home, smollm2_dir):
    from tileinfer import load_tokenizer

    out = run_json(home, "-n", "3", QUESTION)
    assert out["finish_reason"] == "length" and out["stop"] is None
    assert len(out["tokens"]) == 3
    assert out["text"] == load_tokenizer(smollm2_dir).decode(out["tokens"])
    assert out["backend"] == "ref" and out["prompt_tokens"] > 10
    timings = out["timings"]
    assert set(timings) == {"load", "time_to_first_token", "generate", "tokens_per_second",
                            "from_start_to_first_token", "startup"}
    # The parts of the start-up, in order, add up to the time from the start to the first token.
    assert list(timings["startup"]) == ["start", "import_torch", "import_tileinfer",
                                        "load_model", "warm_up", "prompt", "first_token"]
    assert sum(timings["startup"].values()) == pytest.approx(
        timings["from_start_to_first_token"], abs=2e-3)
    assert timings["startup"]["first_token"] == pytest.approx(timings["time_to_first_token"],
                                                              abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("stop,text", [
    ("capital of", "The "),          # " capital" + " of": two tokens
    ("s Par", "The capital of France i"),  # ends inside the token " Paris"
])
def test_stop_string_cuts_the_answer_across_tokens(home, stop, text):
    out = run_json(home, "-n", "30", "--stop", stop, "--stop", "zebra", QUESTION)
    assert out["text"] == text
    assert out["finish_reason"] == "stop" and out["stop"] == stop
    if stop == "capital of":  # streamed to the terminal: the same text, the stop not printed
        printed = tileinfer("run", "-n", "30", "--stop", stop, QUESTION, env=home)
        assert printed.returncode == 0 and printed.stdout == text + "\n"


@pytest.mark.slow
def test_system_message_reaches_the_prompt(home, smollm2_dir):
    from tileinfer import ChatMessage, chat_prompt, load_tokenizer

    system = "You answer in one word."
    out = run_json(home, "-n", "1", "--system", system, QUESTION)
    tok = load_tokenizer(smollm2_dir)

    def prompt_tokens(messages):
        return len(tok.encode(chat_prompt(smollm2_dir, messages), add_special_tokens=False))

    user = ChatMessage("user", QUESTION)
    assert out["prompt_tokens"] == prompt_tokens([ChatMessage("system", system), user])
    assert out["prompt_tokens"] != prompt_tokens([user])  # the template's default system text


def test_stop_writer_holds_back_what_may_start_a_stop_string():
    import io

    from tileinfer_cli.stops import StopStringFound, StopWriter

    out = io.StringIO()
    writer = StopWriter(["</answer>", "\n\n"], out)
    for chunk in ["Paris", " is it.<", "/ans"]:
        writer.write(chunk)
    assert out.getvalue() == "Paris is it."  # "</ans" might be the stop string: held back
    with pytest.raises(StopStringFound) as found:
        writer.write("wer> more")
    assert found.value.stop == "</answer>" and out.getvalue() == "Paris is it."
    other = StopWriter(["xyz"], io.StringIO())
    other.write("ab x")
    other.end()  # no stop string came: the held-back tail is written
    assert other.text == "ab x"


# --- models by name ------------------------------------------------------------------------------

def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.slow
def test_imported_models_are_listed_run_and_removed_by_name(tmp_path, smollm2_dir):
    # Before: `run -m smol` said "run `tileinfer pull smol` first", and nothing removed it.
    models = tmp_path / "home" / "models"
    shutil.copytree(smollm2_dir, models / "my-smol", copy_function=os.link)
    leftover = models / f".my-smol.importing-{dead_pid()}"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"x" * 1000)
    env = {"TILEINFER_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    listed = tileinfer("list", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert "imported" in rows["my-smol"]
    assert "default, imported on first use" in rows["SmolLM2-135M-Instruct"]
    answer = tileinfer("run", "-m", "my-smol", "-n", "12", QUESTION, env=env)
    assert answer.returncode == 0 and "Paris" in answer.stdout, answer.stderr
    removed = tileinfer("rm", "my-smol", env=env)
    assert removed.returncode == 0, removed.stderr
    assert "removed the leftovers of an interrupted import: .my-smol.importing-" in removed.stdout
    assert "removed my-smol" in removed.stdout
    assert sorted(os.listdir(models)) == []
    assert (smollm2_dir / "model.safetensors").is_file()  # the hard-linked original stays
    assert_one_line_error(tileinfer("run", "-m", "my-smol", "hi", env=env),
                          "'my-smol' is not a model folder, an imported model or a pulled repo id")
    assert_one_line_error(tileinfer("rm", "my-smol", env=env),
                          "'my-smol' is neither an imported model nor a pulled one")


def _gguf_helpers():
    """tiny_llama and write_gguf of the GGUF import tests (a small GGUF with a tokenizer)."""
    spec = importlib.util.spec_from_file_location(
        "gguf_import_tests", TESTS / "tileinfer-core" / "io" / "test_gguf_import.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    helpers = _gguf_helpers()
    return helpers.write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", helpers.tiny_llama())


SIGTERM_IMPORT = """
import sys, time
import tileinfer.io.gguf_import as g
from tileinfer_cli.main import main
real = g.save_file
def save_then_hang(tensors, path, metadata=None):
    real(tensors, path, metadata=metadata)
    print("STAGED", flush=True)
    time.sleep(120)
g.save_file = save_then_hang
sys.exit(main(["import", sys.argv[1], "--name", "tiny"]))
"""


def test_terminated_import_leaves_nothing_behind(tmp_path, tiny_gguf):
    # Before: an import killed by SIGTERM left a hidden .NAME.importing-PID folder forever.
    env = {**os.environ, "TILEINFER_HOME": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", SIGTERM_IMPORT, str(tiny_gguf)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "STAGED"
    assert (tmp_path / "models" / f".tiny.importing-{child.pid}").is_dir()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert os.listdir(tmp_path / "models") == []


def test_import_then_run_by_name(tmp_path, tiny_gguf):
    env = {"TILEINFER_HOME": str(tmp_path)}
    imported = tileinfer("import", str(tiny_gguf), "--name", "tiny", env=env)
    assert imported.returncode == 0, imported.stderr
    assert "as tiny into" in imported.stdout
    out = tileinfer("run", "-m", "tiny", "--json", "-n", "4", "the thin", env=env)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["tokens"]) <= 4


# --- bad models ----------------------------------------------------------------------------------

@pytest.fixture
def tiny_folder(tmp_path, tiny_gguf):
    from tileinfer import import_gguf

    return import_gguf(tiny_gguf, tmp_path / "tiny")


def test_random_bytes_in_the_weights_are_one_line(tiny_folder):
    # Before: loaded silently, printed <|endoftext|> forty times and exited with 0.
    file = tiny_folder / "model.safetensors"
    data = bytearray(file.read_bytes())
    # The last tensor's data, seeded: unseeded bytes held no NaN or inf in about 2% of runs
    # (float32: an all-ones exponent in 1 of 256 values).
    data[-4096:] = random.Random(0).randbytes(4096)
    file.write_bytes(bytes(data))
    assert_one_line_error(tileinfer("run", "-m", str(tiny_folder), "hi"),
                          r"tensor '.*' holds \d+ NaN or infinite values? \(of \d+\)")


def test_absurd_config_size_is_one_line_at_once(tiny_folder):
    # Before: num_hidden_layers 10**8 ran for minutes and died of memory.
    config = json.loads((tiny_folder / "config.json").read_text())
    (tiny_folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 10**8}))
    assert_one_line_error(tileinfer("run", "-m", str(tiny_folder), "hi", timeout=60),
                          "config field 'num_hidden_layers' is 100000000, but the checkpoint")


def test_max_len_beyond_the_models_positions(home):
    # Before: --max-len 20000 beyond SmolLM2's 8,192 positions was accepted without a word, and
    # --max-len 1000000000 ran for minutes and died of memory.
    assert_one_line_error(tileinfer("run", "--max-len", "20000", "hi", env=home),
                          "--max-len 20000 exceeds the model's 8192 positions")
    result = tileinfer("run", "--max-len", "1000000000", "--allow-long-context", "hi", env=home,
                       timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    warning, error = [line for line in result.stderr.splitlines() if line.strip()]
    assert warning.startswith("tileinfer: warning: --max-len 1000000000 exceeds")
    assert re.match(r"tileinfer: error: loading .* needs about .* but only .* is available",
                    error)


# --- backends ------------------------------------------------------------------------------------

def install_plugin(site: Path, name: str, body: str):
    (site / f"{name}.py").write_text(textwrap.dedent(body))
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tileinfer]\n{name} = {name}\n")
    return {"PYTHONPATH": str(site)}


def test_unknown_name_in_tileinfer_backends_is_reported():
    # Before: TILEINFER_BACKENDS=nosuch was silently accepted.
    result = tileinfer("backends", env={"TILEINFER_BACKENDS": "nosuch"})
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().startswith("tileinfer: warning: TILEINFER_BACKENDS names "
                                            "backends that are not installed: nosuch")
    assert "nosuch   unavailable: not installed (named in TILEINFER_BACKENDS)" in result.stdout


def test_info_hook_returning_none_marks_only_that_plugin_invalid(tmp_path):
    # Before: it crashed every command, `tileinfer backends` included.
    env = install_plugin(tmp_path, "nonebackend", """
        from tileinfer.backend import hookimpl

        @hookimpl
        def tileinfer_backend_info():
            return None
    """)
    result = tileinfer("backends", env=env)
    assert result.returncode == 0, result.stderr
    assert ("nonebackend unavailable: invalid plugin 'nonebackend': tileinfer_backend_info() "
            "returned None") in result.stdout
    assert "ref      available" in result.stdout
    assert_one_line_error(tileinfer("run", "--backend", "nonebackend", "hi", env=env),
                          "backend 'nonebackend' cannot run here: invalid plugin")


def test_cpu_backend_left_with_the_default_devices_is_one_line(tmp_path):
    # BackendInfo's devices default to ("cuda",): before, `run` died with a traceback on a CPU.
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the backend runs there")
    env = install_plugin(tmp_path, "cpuforgot", """
        from tileinfer.backend import BackendInfo, hookimpl

        @hookimpl
        def tileinfer_backend_info():
            return BackendInfo(name="cpuforgot", available=True)
    """)
    assert_one_line_error(tileinfer("run", "--backend", "cpuforgot", "hi", env=env),
                          r"backend 'cpuforgot' runs on cuda \(BackendInfo.devices\) and none is "
                          "present here")


@pytest.mark.slow
def test_piped_chat_stops_at_a_line_that_is_not_utf8(home):
    # A piped chat ends at its first failed line (chat --help says why), after the answers
    # before it.
    script = QUESTION.encode() + b"\ncaf\xff\n" + QUESTION.encode() + b"\n/exit\n"
    result = tileinfer("chat", "-n", "12", stdin=script, env=home)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("tileinfer: error: line 2: the line is not valid UTF-8 "
                                     "text (byte 0xff at byte offset 3)")
    assert result.stdout.count("Paris") == 1


def test_process_age_is_measured_from_the_kernels_record():
    """The start-up clock's process age: within the wall time a parent measures around the
    child (one clock tick of slack), and more than nothing."""
    code = ("from tileinfer_cli.startup import _AGE; print(_AGE)")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    outside = time.perf_counter() - start
    age = float(done.stdout)
    assert 0 < age <= outside + 0.011, (age, outside)


THINKING = "<think>\nThe user asks for a capital\\. Paris\\.\n</think>\n\nParis\\."


@pytest.mark.slow
def test_hide_thinking_prints_the_answer_without_its_reasoning(home):
    # A regex makes SmolLM2 answer as a thinking model writes (it has no <think> of its own).
    pytest.importorskip("llguidance")
    out = run_json(home, "-n", "40", "--regex", THINKING, QUESTION)
    assert out["text"] == "<think>\nThe user asks for a capital. Paris.\n</think>\n\nParis."
    out = run_json(home, "-n", "40", "--regex", THINKING, "--hide-thinking", QUESTION)
    assert out["text"] == "Paris." and out["reasoning"] == "The user asks for a capital. Paris."
    shown = tileinfer("run", "-n", "40", "--regex", THINKING, "--hide-thinking", QUESTION,
                      env=home)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "Paris.\n"


@pytest.mark.slow
def test_json_schema_and_regex_shape_the_answer(home, tmp_path):
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"capital": {"enum": ["Paris", "London", "Rome"]},
                                               "country": {"type": "string", "maxLength": 12}},
              "required": ["capital", "country"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    out = run_json(home, "-n", "40", "--json-schema", str(path), QUESTION)
    answer = json.loads(out["text"])
    assert set(answer) == {"capital", "country"} and answer["capital"] in schema["properties"][
        "capital"]["enum"] and len(answer["country"]) <= 12
    out = run_json(home, "-n", "12", "--regex", "The capital is [A-Z][a-z]+\\.", QUESTION)
    assert re.fullmatch(r"The capital is [A-Z][a-z]+\.", out["text"]), out["text"]
    bad = tileinfer("run", "--json-schema", str(tmp_path / "missing.json"), QUESTION, env=home)
    assert_one_line_error(bad, "--json-schema: cannot read")
    # The grammar library's reason comes after a picture of the regex: it is on the one line.
    bad = tileinfer("run", "--regex", "(", QUESTION, env=home)
    assert_one_line_error(bad, "--regex: bad regex: .* unclosed group$")
