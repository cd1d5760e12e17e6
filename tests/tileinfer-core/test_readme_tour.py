"""README.md's "A short tour" runs as written: its Python block is executed (on a CPU machine
``default_backend_name`` picks ref), with the embedded default model as the folder."""

from __future__ import annotations

import re
from pathlib import Path

import tileinfer as ti

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_code() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## A short tour"):]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def test_the_readme_tour_runs_and_answers_paris(smollm2_dir, monkeypatch, capsys):
    monkeypatch.setattr(ti, "default_model_dir", lambda: smollm2_dir)
    scope: dict = {}
    exec(compile(tour_code(), str(README), "exec"), scope)
    assert "Paris" in capsys.readouterr().out
    assert scope["model"].ops.name == ti.default_backend_name()
    reply, stats = scope["reply"], scope["stats"]
    assert isinstance(reply, str) and reply.strip()
    assert stats.prefilled > 0 and stats.generated > 0
