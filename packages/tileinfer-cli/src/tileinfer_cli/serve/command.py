"""``tileinfer serve``: the OpenAI-compatible HTTP server (the ``serve`` extra).

Importing this module is cheap (``tileinfer --help`` imports it): the server's modules, torch
and the web libraries are imported when the command runs.
"""

from __future__ import annotations

import os
import signal
import sys

from ..errors import UserError
from ..options import add_model_options
from ..parsing import INT32_MAX, float_range, int_range
from ..reasoning import NAMES as REASONING_NAMES
from .responses_store import RESPONSES_KEPT

EPILOG = """\
One model per server (default: the embedded SmolLM2-135M-Instruct), on the batched engine,
which runs in a process of its own. Endpoints: POST /v1/chat/completions, POST /v1/completions
(streamed or not), GET /v1/models, GET /health, GET /metrics (Prometheus).

examples:
  tileinfer serve                                   http://127.0.0.1:8000/v1
  tileinfer serve -m Qwen/Qwen3-0.6B --port 8080 --max-running 32
  TILEINFER_API_KEY=secret tileinfer serve --host 0.0.0.0
  tileinfer serve -m FOLDER --load-format dummy     random weights of FOLDER's config shape

  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}]}'

--load-format dummy is a benchmarking aid: random weights (seed 0) of the folder's config shape,
so that serving loads can be measured without the checkpoint (the folder needs config.json and
tokenizer.json). Its answers are noise.

Sampling parameters a request leaves out (temperature, top_p, top_k) take the values
generation_config.json sets, else OpenAI's (temperature 1, top_p 1): unlike tileinfer run, a
model without sampling settings samples. GET /v1/models and the start-up line show them.

SIGTERM or Ctrl-C stops accepting requests, lets running ones finish for --shutdown-grace
seconds, aborts the rest and exits; a second SIGTERM or Ctrl-C exits at once (code 128 + the
signal's number).
"""

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(sub, formatter):
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (the serve extra)",
                       description="Serve a model over an OpenAI-compatible HTTP API.",
                       epilog=EPILOG, formatter_class=formatter)
    add_model_options(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every interface; use an API key)")
    g.add_argument("--port", type=int_range(0, 65535), default=8000)
    g.add_argument("--api-key", metavar="KEY", default=None,
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                        "(default: $TILEINFER_API_KEY; the variable keeps it out of `ps`)")
    g.add_argument("--served-model-name", metavar="NAME",
                   help="the model's id in requests and /v1/models (default: --model as "
                        "given, or the folder's name)")
    g.add_argument("--load-format", choices=["auto", "dummy"], default="auto",
                   help="dummy: random weights of the folder's config shape (benchmarks)")
    g.add_argument("--max-body-bytes", type=int_range(1024, INT32_MAX), metavar="N",
                   help="larger request bodies are refused (413; default: 16 bytes per token of "
                        "--max-len, at least 1 MiB)")
    g.add_argument("--allowed-origins", nargs="+", metavar="ORIGIN", default=[],
                   help="web origins (https://app.example, or *) whose pages may call the API "
                        "from a browser (CORS; default: none)")
    g.add_argument("--metrics-public", action="store_true",
                   help="answer /metrics without the API key (for a scraper on the network)")
    g.add_argument("--shutdown-grace", type=float_range(0, 3600), default=30.0, metavar="S",
                   help="on SIGTERM, seconds running requests get to finish")
    g.add_argument("--tool-parser", choices=["auto", "llama3", "qwen3", "mistral", "none"],
                   default="auto", help="the format of the model's tool calls, read from "
                   "answers to requests with tools (auto: the one its chat template shows)")
    g.add_argument("--reasoning-parser", choices=["auto", *REASONING_NAMES, "none"],
                   default="auto", help="split a thinking model's <think> reasoning from the "
                   "answer's content into reasoning_content (and vLLM's reasoning); auto: for a "
                   "model whose vocabulary or chat template has the tags")
    g.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                   default="info", help="info: a line per finished request (id, user, tokens, "
                   "time to first token, duration, finish reason)")
    g.add_argument("--access-log", action="store_true", help="log every HTTP request")
    g.add_argument("--responses-store", type=int_range(0, 1 << 20), default=RESPONSES_KEPT,
                   metavar="N", help="/v1/responses answers kept in memory for "
                   "previous_response_id and GET /v1/responses/ID: the newest N (0: none)")
    e = p.add_argument_group("engine")
    e.add_argument("--max-running", type=int_range(1, 4096), default=64, metavar="N",
                   help="requests running at once (a CUDA-graph bucket up to N)")
    e.add_argument("--max-queue", type=int_range(1, 1 << 20), default=1024, metavar="N",
                   help="requests waiting for the engine; beyond it new ones get 429")
    e.add_argument("--queue-timeout", type=float_range(0, 1e6), default=300.0, metavar="S",
                   help="a request waiting longer for the engine gets an error (0: never)")
    e.add_argument("--max-step-tokens", type=int_range(1, 1 << 20), default=2048, metavar="N",
                   help="tokens per engine step (prefill chunks and decode rows)")
    e.add_argument("--memory-fraction", type=float_range(0, 1, lo_open=True), default=0.9,
                   metavar="F", help="GPU memory for weights, activations and the KV pool")
    e.add_argument("--kv-tokens", type=int_range(16, INT32_MAX), metavar="N",
                   help="on the CPU: KV positions in the pool (default 32768)")
    e.add_argument("--no-prefix-caching", action="store_true",
                   help="do not share the pages of common prompt prefixes")
    e.add_argument("--no-engine-process", action="store_true",
                   help="step the engine on a thread of the server's process instead of a "
                        "process of its own (less memory and start-up time; slower steps under "
                        "many streams, which share the interpreter with the HTTP side)")
    p.set_defaults(func=run)


def _check_extra():
    missing = []
    for name in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UserError(f"tileinfer serve needs {', '.join(missing)}: pip install "
                        "'tileinfer-cli[serve]'")


def _ignore(signum, frame):
    pass


# The interpreter's thread switch interval while serving (Python's default: 5 ms). Every PyTorch
# op releases the GIL, so the engine's thread gives it up hundreds of times in an eager step
# (prefill), and each time the event loop's thread is busy (HTTP, detokenizing) the engine waits
# up to the whole interval to take it back. So the interval is kept short, which keeps an eager
# step beside a busy thread close to its time alone (benchmarks/gil_contention.py;
# benchmarks/RESULTS.md, 2026-12-01, "gemv.cu's 8- and 16-row tables, the server's load
# generator", "The server under load").
SWITCH_INTERVAL_S = 0.00005


def _log_to_stderr(level: str):
    """The server's own log (a line per finished request at info) beside uvicorn's, as it
    writes its lines."""
    import logging

    from uvicorn.logging import DefaultFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
    log = logging.getLogger("tileinfer.serve")
    log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False


def check_pool_fits_max_len(engine, max_len: int):
    """UserError unless the KV pool holds one sequence of max_len positions (else requests that
    leave max_tokens out, which may fill the context, would be refused one by one)."""
    stats = engine.stats()
    page = stats["page_size"]
    free = stats["pages_total"] - stats["pages_used"]  # the runner holds its scratch page
    needed = -(-max_len // page)
    if needed > free:
        engine.close()
        enough = (needed + stats["pages_used"]) * page
        raise UserError(
            f"the KV pool holds {free * page} positions ({free} pages of {page}), fewer than one "
            f"sequence of --max-len {max_len}: give --kv-tokens {enough} or more (on a GPU, a "
            f"larger --memory-fraction), or --max-len {free * page} or less")


def run(args, out):
    _check_extra()
    api_key = args.api_key or os.environ.get("TILEINFER_API_KEY") or None
    if args.host not in LOOPBACK and api_key is None:
        print(f"tileinfer: warning: listening on {args.host} without an API key: anyone who "
              "can reach this port can use the model", file=sys.stderr)
    import uvicorn

    from .app import Server, build_app
    from .engine_build import start_engine
    from .loading import load_served

    served = load_served(args)
    engine = start_engine(args, served)
    check_pool_fits_max_len(engine, served.max_len)
    if args.kv_tokens is not None and args.kv_tokens < served.max_len:
        print(f"tileinfer: note: --kv-tokens {args.kv_tokens} is less than one --max-len "
              f"{served.max_len} sequence; the KV pool holds "
              f"{engine.stats()['pages_total'] * engine.stats()['page_size']} positions",
              file=sys.stderr)
    if args.no_engine_process:
        engine.warmup()  # an engine process captured its graphs before it reported
    server = Server(served, engine, api_key=api_key, max_queue=args.max_queue,
                    queue_timeout=args.queue_timeout or None, max_body=args.max_body_bytes,
                    allowed_origins=args.allowed_origins, metrics_public=args.metrics_public,
                    responses_kept=args.responses_store)
    stats = engine.stats()
    print(f"tileinfer: serving {served.name} ({'random weights, ' if served.dummy else ''}"
          f"backend {served.backend}, max_len {served.max_len}, "
          f"{stats['pages_total']} KV pages of {stats['page_size']}) on "
          f"http://{args.host}:{args.port}/v1 (and ollama's API under /api); sampling "
          f"defaults: {served.defaults.describe()}; "
          f"tool calls: {served.tool_parser.name if served.tool_parser else 'not read'}; "
          f"reasoning: {'split from the content' if served.reasoning else 'not split'}",
          file=sys.stderr, flush=True)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if server.draining:  # the second signal: the user does not want to wait
                print(f"tileinfer: {signal.Signals(sig).name} again: exiting now",
                      file=sys.stderr, flush=True)
                os._exit(128 + sig)
            # Stop taking requests; after the grace period fail those still running (they get
            # an error, streams an error event and [DONE]), so that every connection ends
            # before uvicorn's own deadline (a little later) would cut it.
            server.draining = True
            loop = server.bridge.loop
            if loop is not None:
                loop.call_soon_threadsafe(loop.call_later, args.shutdown_grace,
                                          server.abort_all)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(build_app(server), host=args.host, port=args.port,
                            log_level=args.log_level, access_log=args.access_log,
                            timeout_graceful_shutdown=args.shutdown_grace + 5, lifespan="on")
    # uvicorn handles SIGTERM / SIGINT while serving, then raises the signal again under the
    # handlers it found: make those ignore it, so that a graceful stop exits with code 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore)
    _log_to_stderr(args.log_level)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    uvicorn_server = _Server(config)
    uvicorn_server.run()
    return 0 if uvicorn_server.started else 1
