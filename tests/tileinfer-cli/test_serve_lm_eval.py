"""lm-eval-harness as a client of ``tileinfer serve`` (the real SmolLM2-135M-Instruct, float32,
ref backend on the CPU), on the team's small tasks in ``lm_eval_tasks/``: ``local-completions``
scores the multiple-choice task as lm-eval's own ``hf`` model does on the same folder (accuracy
within 1 point, every choice's log-likelihood within 1e-3), and ``local-chat-completions`` runs
the generate_until task to the end."""

from __future__ import annotations

from pathlib import Path

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client", "lm_eval", "tenacity",
                "aiohttp", "accelerate", "transformers"):  # the serve extra, lm-eval[api], hf
    pytest.importorskip(_module)

from test_serve_helpers import ServerProcess

pytestmark = pytest.mark.slow
TASKS = Path(__file__).parent / "lm_eval_tasks"
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-lm-eval") / "server.log"
    s = ServerProcess(["-m", smollm2_dir, "--backend", "ref", "--dtype", "fp32",
                       "--kv-tokens", "8192", "--max-running", "4"], log)
    try:
        yield s.wait_ready()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """lm-eval's TaskManager over the repository's task files, each told where its data is."""
    from lm_eval.tasks import TaskManager

    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    for name in ("tiny_choice", "tiny_answer"):
        text = (TASKS / f"{name}.yaml").read_text()
        text += f"dataset_kwargs:\n  data_files:\n    train: {TASKS / (name + '.jsonl')}\n"
        (folder / f"{name}.yaml").write_text(text)
    return TaskManager(include_path=str(folder))


def run(model, task: str, tasks, **kwargs):
    from lm_eval import simple_evaluate

    out = simple_evaluate(model=model, tasks=[task], log_samples=True, task_manager=tasks,
                          **kwargs)
    return out["results"][task], sorted(out["samples"][task], key=lambda s: s["doc_id"])


def loglikelihoods(samples) -> list[float]:
    """Every choice's log-likelihood, document by document."""
    return [float(r[0][0] if isinstance(r[0], (list, tuple)) else r[0])
            for s in samples for r in s["resps"]]


def test_local_completions_scores_as_lm_evals_hf_model(server, smollm2_dir, tasks):
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    served = LocalCompletionsAPI(base_url=server.url + "/v1/completions", model=MODEL,
                                 tokenizer_backend="huggingface", tokenizer=str(smollm2_dir),
                                 max_length=2048, num_concurrent=2, max_retries=1)
    hf = HFLM(pretrained=str(smollm2_dir), dtype="float32", device="cpu", batch_size=8)
    got, got_samples = run(served, "tileinfer_tiny_choice", tasks)
    want, want_samples = run(hf, "tileinfer_tiny_choice", tasks)
    assert len(got_samples) == len(want_samples) == 10
    assert abs(got["acc,none"] - want["acc,none"]) <= 0.01, (got, want)
    mine, theirs = loglikelihoods(got_samples), loglikelihoods(want_samples)
    assert len(mine) == len(theirs) == 30
    worst = max(abs(a - b) for a, b in zip(mine, theirs))
    assert worst <= 1e-3, worst


def test_local_chat_completions_runs_a_generate_until_task(server, smollm2_dir, tasks):
    from lm_eval.models.openai_completions import LocalChatCompletion

    chat = LocalChatCompletion(base_url=server.url + "/v1/chat/completions", model=MODEL,
                               num_concurrent=2, max_retries=1)
    result, samples = run(chat, "tileinfer_tiny_answer", tasks, apply_chat_template=True)
    assert len(samples) == 3
    assert all(isinstance(s["resps"][0][0], str) and s["resps"][0][0] for s in samples)
    assert 0.0 <= result["exact_match,contains"] <= 1.0
