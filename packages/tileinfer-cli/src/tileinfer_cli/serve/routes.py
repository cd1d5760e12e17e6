"""The endpoints: completions (chat and legacy), responses, embeddings, models, tokenize and
detokenize, health, metrics; ollama's chat, generate, embed, tags and version.

A completion request is read (size-limited: 413 once past the limit), then, on a worker thread
(``Server.preparing``), parsed (malformed JSON: 400), validated against its schema (an unknown
or unsupported parameter: 400 naming it) and checked against the model (prompt and
``max_tokens`` within the context: 400 with the numbers); back on the loop, checked against
the queue (full: 429) and added to the engine as a job. The response waits for the job's first
event, watching for the client to go away meanwhile; so errors that come before the first token
(a queue timeout, a failing step) still get their HTTP status. A streamed answer then goes out
as server-sent events; a client that disconnects aborts its job (pages freed at once).
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import datetime, timezone

from starlette.responses import JSONResponse, Response, StreamingResponse

from .chunks import ChatFormat, CompletionFormat
from .embeddings import EmbeddingRequest, EmbeddingsFormat, plan_embeddings
from .errors import APIError, error_response
from .jobs import END, Job
from .ollama_format import OllamaEmbedFormat, OllamaFormat
from .ollama_request import (OllamaChatRequest, OllamaEmbedRequest, OllamaGenerateRequest,
                             plan_ollama_chat, plan_ollama_embed, plan_ollama_generate)
from .prepare import plan_chat, plan_completion
from .responses import ModelCard, ModelList
from .responses_format import ResponsesFormat
from .responses_request import ResponsesRequest, plan_responses
from .responses_store import ResponseStore
from .schemas import ChatRequest, CompletionRequest
from .tokenizing import detokenize, tokenize
from .validation import parse, parse_json

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def too_large(limit: int, size: int | None = None) -> APIError:
    said = f"has {size} bytes" if size is not None else "is longer"
    return APIError(413, f"the request body {said}; the limit is {limit} bytes (--max-body-bytes)",
                    "invalid_request_error", code="request_too_large")


async def read_body(request, limit: int) -> bytes:
    """The body, read as it comes; 413 as soon as it passes the limit."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise too_large(limit, int(size))
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _disconnected(receive):
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


GONE = object()  # the client disconnected


async def first_event(request, job):
    """The job's first event, or GONE if the client disconnected first."""
    get = asyncio.ensure_future(job.events.get())
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((get, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not get.done():
            get.cancel()
    return get.result() if get.done() and not get.cancelled() else GONE


class SSEResponse(StreamingResponse):
    """A stream whose job is closed however the response ends (finished, the client gone, the
    server's grace period over); server-sent events, or another media type (ollama's NDJSON)."""

    def __init__(self, job, body, media_type: str = "text/event-stream"):
        super().__init__(body, media_type=media_type, headers=SSE_HEADERS)
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.close()


async def _events(job, fmt, first):
    item = first
    while item is not END:
        batch, item = [fmt.chunks(job, item)], None
        while not job.events.empty():  # the loop fell behind: one write for every event
            queued = job.events.get_nowait()
            if queued is END:
                item = END
                break
            batch.append(fmt.chunks(job, queued))
        yield "".join(batch).encode()
        if item is None:
            item = await job.events.get()
    yield fmt.end(job)


class Endpoints:
    def __init__(self, server):
        self.server = server
        served = server.served
        self.chat_format = ChatFormat(served.name, served.tokenizer)
        self.completion_format = CompletionFormat(served.name, served.tokenizer)
        self.responses = ResponseStore(server.responses_kept)
        self.responses_format = ResponsesFormat(served.name, served.tokenizer, self.responses)
        self.embeddings_format = EmbeddingsFormat(served.name)
        self.ollama_chat_format = OllamaFormat(served.name, chat=True)
        self.ollama_generate_format = OllamaFormat(served.name, chat=False)
        self.ollama_embed_format = OllamaEmbedFormat(served.name)

    async def chat(self, request):
        return await self._complete(request, ChatRequest, plan_chat, self.chat_format,
                                    "chatcmpl-")

    async def completions(self, request):
        return await self._complete(request, CompletionRequest, plan_completion,
                                    self.completion_format, "cmpl-")

    async def embeddings(self, request):
        return await self._complete(request, EmbeddingRequest, plan_embeddings,
                                    self.embeddings_format, "embd-")

    # -- ollama's API (ollama_request.py, ollama_format.py) ----------------------------------

    async def ollama_chat(self, request):
        return await self._complete(request, OllamaChatRequest, plan_ollama_chat,
                                    self.ollama_chat_format, "chat-")

    async def ollama_generate(self, request):
        return await self._complete(request, OllamaGenerateRequest, plan_ollama_generate,
                                    self.ollama_generate_format, "gen-")

    async def ollama_embed(self, request):
        return await self._complete(request, OllamaEmbedRequest, plan_ollama_embed,
                                    self.ollama_embed_format, "embd-")

    def _ollama_model(self) -> dict:
        """The served model as ollama's model lists describe one."""
        s = self.server.served
        size = sum(p.stat().st_size for p in s.folder.glob("*.safetensors"))
        modified = datetime.fromtimestamp(self.server.started, timezone.utc).isoformat()
        return {"name": s.name, "model": s.name, "modified_at": modified, "size": size,
                "digest": "", "details": {"format": "safetensors", "family": s.model_type,
                                          "families": [s.model_type], "parameter_size": "",
                                          "quantization_level": ""}}

    async def ollama_tags(self, request):
        """GET /api/tags: the served model, as ollama lists its models."""
        return JSONResponse({"models": [self._ollama_model()]})

    async def ollama_ps(self, request):
        """GET /api/ps: the loaded model (always the served one)."""
        model = self._ollama_model()
        model.pop("modified_at")
        return JSONResponse({"models": [model | {"expires_at": "9999-12-31T23:59:59Z",
                                                 "size_vram": 0,
                                                 "context_length": self.server.served.max_len}]})

    async def ollama_show(self, request):
        """POST /api/show: the served model's template, details and what it can do."""
        server = self.server
        body = parse_json(await read_body(request, server.max_body))
        server.check_model(body.get("model") if isinstance(body, dict) else None)
        s, model = server.served, self._ollama_model()
        capabilities = ["completion", "embedding"]
        if s.tool_parser is not None:
            capabilities.append("tools")
        if s.reasoning:
            capabilities.append("thinking")
        return JSONResponse({
            "modified_at": model["modified_at"], "template": s.template.source or "",
            "modelfile": "", "license": "", "parameters": "", "details": model["details"],
            "model_info": {"general.architecture": s.model_type,
                           f"{s.model_type}.context_length": s.max_len,
                           f"{s.model_type}.embedding_length": s.hidden_size},
            "capabilities": capabilities})

    async def ollama_version(self, request):
        from importlib.metadata import version

        return JSONResponse({"version": version("tileinfer-cli")})

    async def create_response(self, request):
        return await self._complete(
            request, ResponsesRequest, lambda served, req: plan_responses(served, req,
                                                                          self.responses),
            self.responses_format, "resp_")

    async def stored_response(self, request):
        """GET a kept response, or DELETE it (404 when none is kept under that id)."""
        response_id = request.path_params["response_id"]
        if request.method == "DELETE":
            found = self.responses.delete(response_id)
            answer = {"id": response_id, "object": "response", "deleted": True}
        else:
            answer = found = self.responses.response(response_id)
        if not found:
            raise APIError(404, f"no response {response_id!r} is kept here (the server keeps "
                           f"the newest {self.responses.capacity}, in memory)",
                           "invalid_request_error", code="not_found")
        return JSONResponse(answer)

    async def _complete(self, request, schema, planner, fmt, prefix):
        server = self.server
        try:
            server.check_accepting()
            body = await read_body(request, server.max_body)
            # Parsing, the chat template and tokenizing on a worker thread: a long prompt
            # does not hold up the streams the loop is writing.
            req, plan = await asyncio.get_running_loop().run_in_executor(
                server.preparing, self._prepare, body, schema, planner)
        except APIError as e:
            if e.status == 400 or e.status == 404:
                server.metrics.outcome("invalid")
            raise
        job = Job(server.bridge, plan, server.served.tokenizer,
                  f"{prefix}{secrets.token_hex(12)}", req)
        # Nothing to generate or score (completions' max_tokens: 0, no prompt logprobs).
        if max(plan.max_tokens) == 0 and plan.prompt_logprobs is None and not plan.hidden_state:
            job.finish_unrun()
        else:
            server.bridge.check_capacity(plan.choices)
            server.bridge.submit(job)
        handed_over = False
        try:
            item = await first_event(request, job)
            if item is GONE:  # the client went away while waiting
                return Response(status_code=499)
            if item is END and job.error is not None:
                return error_response(job.error)
            if plan.stream:
                handed_over = True
                return SSEResponse(job, _events(job, fmt, item),
                                   getattr(fmt, "media_type", "text/event-stream"))
            while item is not END:  # a job that is not streamed only puts END
                item = await job.events.get()
            if job.error is not None:
                return error_response(job.error)
            return JSONResponse(fmt.response(job))
        finally:
            if not handed_over:
                job.close()

    def _prepare(self, body: bytes, schema, planner):
        req = parse(parse_json(body), schema)
        self.server.check_model(req.model)
        return req, planner(self.server.served, req)

    def _card(self) -> ModelCard:
        s = self.server.served
        return ModelCard(id=s.name, created=self.server.started, max_model_len=s.max_len,
                         sampling_defaults=s.defaults.card())

    async def models(self, request):
        return JSONResponse(ModelList(data=[self._card()]).model_dump())

    async def model(self, request):
        """GET /v1/models/{model}: the served model's card (404 for another name)."""
        self.server.check_model(request.path_params["model"])
        return JSONResponse(self._card().model_dump())

    async def tokenize(self, request):
        return await self._tokenizer(request, tokenize)

    async def detokenize(self, request):
        return await self._tokenizer(request, detokenize)

    async def _tokenizer(self, request, answer):
        server = self.server
        body = await read_body(request, server.max_body)

        def work():
            found, model = answer(server.served, parse_json(body))
            server.check_model(model)
            return found

        return JSONResponse(await asyncio.get_running_loop().run_in_executor(
            server.preparing, work))

    async def health(self, request):
        if self.server.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(self, request):
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(self.server.metrics.render(), media_type=CONTENT_TYPE_LATEST)
