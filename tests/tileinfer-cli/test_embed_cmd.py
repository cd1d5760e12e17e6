"""``tileinfer embed``: texts' embeddings, one JSON array a line, on a tiny random-weight model
with SmolLM2's tokenizer (ref, float32): each the engine's last hidden state of the text's
tokens, L2-normalized (computed here with ``LLMEngine`` directly); from arguments and from
standard input; ``--dimensions``; mistakes as one line."""

from __future__ import annotations

import io
import json

import pytest
import torch
from safetensors.torch import save_file

from test_serve_helpers import TINY_CONFIG, tiny_folder
from tileinfer import LLMEngine, load_config, load_model, load_tokenizer
from tileinfer.model.weights import checkpoint_shapes
from tileinfer_cli.main import main

TEXTS = ["The cat sat on the mat.", "Quantum chromodynamics, briefly"]


@pytest.fixture(scope="module")
def folder(smollm2_dir, tmp_path_factory):
    folder = tiny_folder(smollm2_dir, tmp_path_factory.mktemp("embed"))
    g = torch.Generator().manual_seed(0)
    save_file({name: torch.randn(shape, generator=g) * 0.1 for name, shape in
               checkpoint_shapes(load_config(folder)).items()},
              str(folder / "model.safetensors"))
    return folder


def expected(folder, texts, dimensions=None) -> list[torch.Tensor]:
    model = load_model(folder, dtype=torch.float32, backend="ref")
    tok = load_tokenizer(folder)
    engine = LLMEngine(model)
    rids = [engine.add_request(tok.encode(t, add_special_tokens=True), max_new_tokens=0,
                               hidden_state=True) for t in texts]
    found = {}
    while engine.has_unfinished():
        for out in engine.step():
            found[out.request_id] = torch.tensor(out.hidden_state, dtype=torch.float64)
    engine.close()
    vectors = [found[r][:dimensions] for r in rids]
    return [v / v.norm() for v in vectors]


def piped(text: str | bytes):
    """A standard input that holds ``text`` (bytes read through .buffer, as a pipe's)."""
    data = text.encode() if isinstance(text, str) else text
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def run_embed(folder, args, capsys, monkeypatch, stdin=None) -> list[list[float]]:
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", piped(stdin))
    code = main(["embed", "-m", str(folder), "--backend", "ref", "--dtype", "fp32", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return [json.loads(line) for line in captured.out.splitlines()]


def test_one_normalized_vector_a_line(folder, capsys, monkeypatch):
    want = expected(folder, TEXTS)
    for got in (run_embed(folder, TEXTS, capsys, monkeypatch),
                run_embed(folder, [], capsys, monkeypatch, stdin="\n".join(TEXTS) + "\n")):
        assert len(got) == 2 and all(len(v) == TINY_CONFIG["hidden_size"] for v in got)
        for v, w in zip(got, want):
            torch.testing.assert_close(torch.tensor(v, dtype=torch.float64), w, rtol=1e-5,
                                       atol=1e-6)


def test_dimensions_keep_the_first_values(folder, capsys, monkeypatch):
    got = run_embed(folder, ["--dimensions", "16", TEXTS[0]], capsys, monkeypatch)
    torch.testing.assert_close(torch.tensor(got[0], dtype=torch.float64),
                               expected(folder, TEXTS[:1], 16)[0], rtol=1e-5, atol=1e-6)


def test_output_line_n_is_input_line_n(folder, capsys, monkeypatch):
    # Lines as a file holds them: CRLF ends, a last line without its newline, spaces kept.
    lines = ["  indented", "The cat sat on the mat.", "x", "Quantum chromodynamics, briefly"]
    got = run_embed(folder, [], capsys, monkeypatch,
                    stdin="\r\n".join(lines[:2]) + "\r\n" + "\n".join(lines[2:]))
    assert len(got) == len(lines)
    for v, w in zip(got, expected(folder, lines)):
        torch.testing.assert_close(torch.tensor(v, dtype=torch.float64), w, rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("args, stdin, pattern", [
    ([], "", "no text to embed"),
    # Before: blank lines were skipped, so the output had fewer lines than the input and every
    # vector after one sat beside the wrong line.
    ([], "a cat\n\na dog\n", "line 2 of standard input is blank: each text gets one output "
                              "line"),
    ([], "a cat\n  \t\n", "line 2 of standard input is blank"),
    ([], "a cat\n\n", "line 2 of standard input is blank"),
    (["a cat", " "], None, "TEXT 2 is blank"),
    ([], b"a cat\n\xff\n", "standard input is not valid UTF-8 text (byte 0xff"),
    (["--dimensions", "65", "x"], None, "this model's embeddings have 64"),
])
def test_mistakes_are_one_line(folder, capsys, monkeypatch, args, stdin, pattern):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", piped(stdin))
    code = main(["embed", "-m", str(folder), "--backend", "ref", *args])
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2 and pattern in err and len(err.strip().splitlines()) == 1, err
    assert captured.out == ""
