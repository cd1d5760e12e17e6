"""The ASGI app: routes, OpenAI-shaped errors, the API-key guard, CORS, the engine's lifespan.

``Guard`` runs before routing: with an API key, every path but ``/health`` needs
``Authorization: Bearer <key>`` (compared with ``hmac.compare_digest``; 401 otherwise), and a
request whose declared body is over the size limit is refused (413) before it is read. The
limit follows the context: ``BODY_BYTES_PER_TOKEN`` per token of ``max_len``, at least
``MIN_BODY_BYTES`` (``--max-body-bytes`` sets it).
With ``--allowed-origins``, Starlette's ``CORSMiddleware`` wraps the guard, so that a browser's
preflight (which carries no key) is answered and every answer, errors included, carries the
CORS headers. An unexpected exception is answered 500 with its type and message, paths cut
(``errors.redact``), and logged with its traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from .bridge import EngineBridge
from .errors import APIError, error_response, redact
from .metrics import Metrics
from .responses_store import RESPONSES_KEPT
from .routes import Endpoints, too_large

log = logging.getLogger("tileinfer.serve")

# A prompt's text takes about 4 bytes per token, JSON-escaped non-ASCII text up to ~12: the body
# of a request that fills the context fits in 16 bytes per token, with room for the rest.
BODY_BYTES_PER_TOKEN = 16
MIN_BODY_BYTES = 1 << 20
PREPARE_THREADS = 4


def body_limit(max_len: int) -> int:
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * max_len)


class Server:
    """What the endpoints share: the model, the engine bridge, metrics, settings."""

    def __init__(self, served, engine, api_key: str | None = None, max_queue: int = 1024,
                 queue_timeout: float | None = 300.0, max_body: int | None = None,
                 allowed_origins=(), metrics_public: bool = False,
                 responses_kept: int = RESPONSES_KEPT):
        self.served, self.engine = served, engine
        self.metrics = Metrics(served.name)
        self.bridge = EngineBridge(engine, self.metrics, max_queue, queue_timeout)
        self.metrics.watch_engine(engine, lambda: len(self.bridge.jobs))
        self.api_key = api_key.encode() if api_key else None
        self.max_body = max_body or body_limit(served.max_len)
        self.preparing = ThreadPoolExecutor(PREPARE_THREADS, "tileinfer-prepare")
        self.allowed_origins = list(allowed_origins)
        self.metrics_public = metrics_public  # /metrics answered without the API key
        self.responses_kept = responses_kept  # /v1/responses answers kept in memory
        self.draining = False  # set on SIGTERM / Ctrl-C: new requests get 503
        self.started = int(time.time())

    def check_accepting(self):
        if self.draining:
            raise APIError(503, "the server is shutting down", "server_error",
                           code="shutting_down")

    def abort_all(self):
        """Fail every request still running or waiting (the shutdown's grace period is over)."""
        for job in list(self.bridge.jobs):
            job.fail(APIError(503, "the server is shutting down: the request was aborted after "
                              "the grace period", "server_error", code="shutting_down"),
                     "abort")

    def check_model(self, name: str | None):
        if name is not None and name != self.served.name:
            raise APIError(404, f"the model {name!r} does not exist: this server serves "
                           f"{self.served.name!r} (GET /v1/models)", "invalid_request_error",
                           "model", "model_not_found")


class Guard:
    """API key and body-size checks before the app (pure ASGI: it costs one dict lookup)."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server
        self.expected = b"Bearer " + server.api_key if server.api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            error = self.check(scope)
            if error is not None:
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def check(self, scope) -> APIError | None:
        headers = dict(scope["headers"])
        open_paths = ("/health", "/metrics") if self.server.metrics_public else ("/health",)
        if self.expected is not None and scope["path"] not in open_paths:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                return APIError(401, "a valid API key is needed: send the header "
                                "'Authorization: Bearer <key>'", "authentication_error",
                                code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        size = headers.get(b"content-length", b"")
        if size.isdigit() and int(size) > self.server.max_body:
            return too_large(self.server.max_body, int(size))
        return None


async def _api_error(request, exc: APIError):
    return error_response(exc)


async def _http_error(request, exc: HTTPException):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(APIError(exc.status_code, f"{exc.detail}: {request.method} "
                                   f"{request.url.path}", kind))


async def _server_error(request, exc: Exception):
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, f"internal error: {type(exc).__name__}: "
                                   f"{redact(str(exc))}", "server_error"))


def build_app(server: Server):
    e = Endpoints(server)
    routes = [Route("/v1/chat/completions", e.chat, methods=["POST"]),
              Route("/v1/completions", e.completions, methods=["POST"]),
              Route("/v1/responses", e.create_response, methods=["POST"]),
              Route("/v1/responses/{response_id}", e.stored_response,
                    methods=["GET", "DELETE"]),
              Route("/v1/embeddings", e.embeddings, methods=["POST"]),
              Route("/v1/models", e.models, methods=["GET"]),
              Route("/v1/models/{model:path}", e.model, methods=["GET"]),
              Route("/api/chat", e.ollama_chat, methods=["POST"]),
              Route("/api/generate", e.ollama_generate, methods=["POST"]),
              Route("/api/embed", e.ollama_embed, methods=["POST"]),
              Route("/api/tags", e.ollama_tags, methods=["GET"]),
              Route("/api/ps", e.ollama_ps, methods=["GET"]),
              Route("/api/show", e.ollama_show, methods=["POST"]),
              Route("/api/version", e.ollama_version, methods=["GET"]),
              Route("/tokenize", e.tokenize, methods=["POST"]),
              Route("/detokenize", e.detokenize, methods=["POST"]),
              Route("/health", e.health, methods=["GET"]),
              Route("/metrics", e.metrics, methods=["GET"])]

    @asynccontextmanager
    async def lifespan(app):
        server.bridge.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            server.bridge.stop()
            server.preparing.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error,
                                        Exception: _server_error})
    guarded = Guard(app, server)
    if not server.allowed_origins:
        return guarded
    from starlette.middleware.cors import CORSMiddleware

    return CORSMiddleware(guarded, allow_origins=server.allowed_origins,
                          allow_methods=["GET", "POST", "DELETE", "OPTIONS"], allow_headers=["*"],
                          max_age=600)
