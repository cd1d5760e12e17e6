"""A ``tileinfer serve`` app in this process, on a loopback port, whose engine answers every
request with a scripted text (no model): for tests of what the server makes of a given answer
(tool calls), which a tiny random model would never write. Everything above the engine is the
real server: the app, the bridge, jobs, detokenizing, chunks."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tileinfer import load_config, load_tokenizer
from tileinfer.engine.serving.request import RequestOutput

from test_serve_helpers import free_port


class ScriptedEngine:
    """The engine interface the server uses; each request's output is ``script`` encoded,
    ``tokens_per_step`` tokens a step (a cycle of counts), then finish reason "stop" (or, where
    max_new_tokens cut the script, "length", as the engine ends such an answer); with
    ``fail_at`` = k, a request's k-th step fails it instead (finish reason "error")."""

    def __init__(self, tokenizer, tokens_per_step=(1, 3, 2)):
        self.tokenizer, self.tokens_per_step = tokenizer, tokens_per_step
        self.script = ""
        self.fail_at: int | None = None
        self.prompts: list[list[int]] = []  # every request's prompt ids, in order
        self._pending: dict[int, list[int]] = {}
        self._steps: dict[int, int] = {}
        self._cut: set[int] = set()  # requests whose script max_new_tokens cut
        self._lock = threading.Lock()
        self._next = 0

    def add_request(self, prompt_ids, sampling, max_new_tokens, stop_ids, seed, logprobs,
                    prompt_logprobs=None, min_new_tokens=0, hidden_state=False):
        with self._lock:
            rid, self._next = self._next, self._next + 1
            self.prompts.append(list(prompt_ids))
            ids = self.tokenizer.encode(self.script, add_special_tokens=False)
            self._pending[rid] = ids[:max_new_tokens]
            if len(ids) > max_new_tokens:
                self._cut.add(rid)
            self._steps[rid] = 0
            return rid

    def has_unfinished(self) -> bool:
        return bool(self._pending)

    def step(self):
        time.sleep(0.002)
        outputs = []
        with self._lock:
            for rid, ids in list(self._pending.items()):
                k = self.tokens_per_step[self._steps[rid] % len(self.tokens_per_step)]
                self._steps[rid] += 1
                if self._steps[rid] == self.fail_at:
                    del self._pending[rid]
                    outputs.append(RequestOutput(rid, [], True, "error", "a scripted failure"))
                    continue
                new, self._pending[rid] = ids[:k], ids[k:]
                done = not self._pending[rid]
                if done:
                    del self._pending[rid]
                reason = ("length" if rid in self._cut else "stop") if done else None
                outputs.append(RequestOutput(rid, new, finished=done, finish_reason=reason))
        return outputs

    def abort(self, rid) -> bool:
        with self._lock:
            return self._pending.pop(rid, None) is not None

    def fail_all(self, message):
        with self._lock:
            rids, self._pending = list(self._pending), {}
        return [RequestOutput(r, [], True, "error", message) for r in rids]

    def stats(self) -> dict:
        return dict(running=len(self._pending), waiting=0, pages_used=0, pages_cached=0,
                    pages_free=1, pages_total=1, preemptions=0, page_size=16)

    def running_ids(self):
        return set(self._pending)

    def close(self):
        pass


def scripted_server(folder: Path, tool_parser: str = "auto", reasoning_parser: str = "auto"):
    """(the running uvicorn server, its base URL, the engine) for the model folder's tokenizer
    and chat template (and --tool-parser, --reasoning-parser); stop it with ``stop(server)``."""
    import uvicorn

    from tileinfer_cli.serve.app import Server, build_app
    from tileinfer_cli.serve.defaults import SamplingDefaults
    from tileinfer_cli.serve.loading import ServedModel, served_reasoning, served_tool_parser
    from tileinfer_cli.serve.template import ServedTemplate

    tokenizer = load_tokenizer(folder)
    model_config = load_config(folder)
    template = ServedTemplate(folder)
    served = ServedModel(folder.name, folder, tokenizer, SamplingDefaults.of_folder(folder),
                         template, [tokenizer.eos_token_id], False,
                         served_tool_parser(tool_parser, template, tokenizer),
                         served_reasoning(reasoning_parser, template, tokenizer), max_len=4096,
                         vocab_size=tokenizer.vocab_size, backend="scripted",
                         hidden_size=model_config.hidden_size,
                         model_type=model_config.model_type)
    engine = ScriptedEngine(tokenizer)
    port = free_port()
    config = uvicorn.Config(build_app(Server(served, engine)), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the scripted server did not start")
        time.sleep(0.02)
    server.thread = thread
    return server, f"http://127.0.0.1:{port}", engine


def stop(server):
    server.should_exit = True
    server.thread.join(30)
