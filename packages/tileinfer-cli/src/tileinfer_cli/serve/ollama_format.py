"""The answers of ollama's API: one JSON object, or newline-delimited JSON objects streamed
(``application/x-ndjson``), the last with ``done: true``, ``done_reason`` and the timings ollama
reports (nanoseconds: ``total_duration``, ``prompt_eval_duration``, the time to the first
token, ``eval_duration``, the rest; ``load_duration`` 0, the model being loaded already).

A chat's objects carry ``message`` (``content``, ``thinking`` for a thinking model's reasoning,
``tool_calls`` with their arguments as objects); a generate's carry ``response`` and
``thinking``. The text is split as the chat endpoint splits it (``tileinfer_cli/reasoning.py``,
``tool_output.ToolStream``). An error after the stream began is a last object ``{"error": ...}``,
which ollama's clients raise.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from ..embedding import embedding
from .chunks import whole_answer

NDJSON = "application/x-ndjson"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _calls(calls: list[dict]) -> list[dict]:
    """Chat tool_calls entries as ollama's (arguments an object)."""
    out = []
    for call in calls:
        arguments = call["function"]["arguments"]
        try:
            arguments = json.loads(arguments)
        except (TypeError, ValueError):
            pass
        out.append({"function": {"name": call["function"]["name"], "arguments": arguments}})
    return out


def timings(job) -> dict:
    end = job.t_last or time.perf_counter()
    total = max(0.0, end - job.arrival)
    first = job.ttft if job.ttft is not None else total
    return {"total_duration": int(total * 1e9), "load_duration": 0,
            "prompt_eval_count": job.plan.prompt_tokens,
            "prompt_eval_duration": int(first * 1e9),
            "eval_count": job.completion_tokens, "eval_duration": int((total - first) * 1e9)}


class OllamaFormat:
    media_type = NDJSON

    def __init__(self, model_name: str, chat: bool):
        self.model_name, self.chat = model_name, chat

    def _object(self, thought: str | None, text: str, calls: list[dict], done: bool) -> dict:
        obj = {"model": self.model_name, "created_at": _now()}
        if self.chat:
            message = {"role": "assistant", "content": text}
            if thought:
                message["thinking"] = thought
            if calls:
                message["tool_calls"] = _calls(calls)
            obj["message"] = message
        else:
            obj["response"] = text
            if thought:
                obj["thinking"] = thought
        obj["done"] = done
        return obj

    def _final(self, job, obj: dict) -> dict:
        reason = job.choices[0].finish_reason
        return obj | {"done_reason": "length" if reason == "length" else "stop"} | timings(job)

    def response(self, job) -> dict:
        thought, content, calls, _ = whole_answer(job.plan, job.choices[0])
        return self._final(job, self._object(thought, content or "", calls, True))

    def chunks(self, job, deltas) -> str:
        lines = []
        for choice, text, _, finish in deltas:
            thought, calls, final = "", [], finish is not None
            if choice.reasoning is not None:
                thought, text = choice.reasoning.feed(text, final)
            if choice.tools is not None:
                text, call_deltas = choice.tools.feed(text, finish)
                # ToolStream's two deltas a call: its name, then its arguments.
                calls = [{"function": {"name": first["function"]["name"],
                                       "arguments": rest["function"]["arguments"]}}
                         for first, rest in zip(call_deltas[0::2], call_deltas[1::2])]
            if thought or text or calls:
                lines.append(json.dumps(self._object(thought, text, calls, False)))
        return "".join(line + "\n" for line in lines)

    def end(self, job) -> bytes:
        if job.error is not None:
            return (json.dumps({"error": job.error.message}) + "\n").encode()
        return (json.dumps(self._final(job, self._object(None, "", [], True))) + "\n").encode()


class OllamaEmbedFormat:
    def __init__(self, model_name: str):
        self.model_name = model_name

    def response(self, job) -> dict:
        dims = job.request.dimensions
        vectors = [embedding(c.hidden, dims) for c in job.choices]
        t = timings(job)
        return {"model": self.model_name, "embeddings": vectors,
                "total_duration": t["total_duration"], "load_duration": 0,
                "prompt_eval_count": job.plan.prompt_tokens}
