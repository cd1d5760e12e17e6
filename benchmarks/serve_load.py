"""Load test of ``tileinfer serve``: N concurrent streaming clients on the loopback interface,
against the engine's offline figure for the same requests. Prints one JSON object per line
(progress on stderr).

Each client sends ``--requests-per-client`` requests one after another to /v1/completions:
a prompt of ``--prompt-len`` random token ids (seeded; no two share a prefix), greedy,
``--output-len`` tokens exactly (``ignore_eos``), streamed with usage in the last chunk. The
clients are plain asyncio sockets (no HTTP library: the client's own cost stays small and the
script needs nothing beyond the standard library on the client side), in one process per 64
clients (``--client-procs``): one process reading 256 streams at 15 ms steps (17,000 chunks a
second) is itself near a full core.

``serve`` row: requests/s, output tokens/s over the measured wall time (first request sent to
last answer read), time to first token (``ttft``), time per output token after the first per
request (``tpot``), the gaps between consecutive streamed chunks (``itl``; a chunk holds the
tokens of one engine step, or of a few when the HTTP side fell behind), p50/p90/p99 in
milliseconds, errors (count and the first messages), and the engine steps the server ran during
the measurement (``steps``, ``pipelined_steps``: launched before the previous step's tokens were
read), from its /metrics.

``offline`` row (``--offline``): the same requests through ``tileinfer.LLMEngine`` in this
process (same model, shape, backend, quantization, max_running, max_step_tokens), all added at
once and stepped to the end after a warm-up: output tokens/s, its steps and pipelined steps, and
``serve_vs_offline``, the server's throughput over it. With a spawned server, the server has
exited before the offline run.

The server: ``--url`` drives one already running (loopback only); otherwise the script starts
``tileinfer serve`` with the model options below on a free port, waits for /health, warms it up
(a round of short requests), measures, and stops it with SIGTERM.

Random weights of a named shape without a checkpoint (the server's ``--load-format dummy``):
``--make-folder DIR --shape llama3-8b`` writes DIR with the shape's config.json and a synthetic
word-level tokenizer covering its vocabulary (so every sampled id has a text), then serves it.

    python benchmarks/serve_load.py --make-folder /tmp/l8b --shape llama3-8b \\
        --clients 64 --prompt-len 512 --output-len 256 --offline
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --clients 8 --output-len 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# --guided-json open: an answer longer than any --output-len (a string of at least 16,384
# characters), so that every request runs its tokens as an unconstrained one does
OPEN_SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "minLength": 16384}},
               "required": ["text"], "additionalProperties": False}
MAX_CLIENTS = 4096


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def emit(row):
    print(json.dumps(row), flush=True)


def percentiles(values, scale=1000.0) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "n": 0}
    v = sorted(values)

    def at(q):
        return round(v[min(len(v) - 1, int(q * len(v)))] * scale, 2)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "mean": round(
        statistics.fmean(v) * scale, 2), "n": len(v)}


# -- a dummy model folder ---------------------------------------------------------------------

def make_folder(folder: Path, shape: str, tokenizer_from: Path | None = None):
    """config.json of the shape, a word-level tokenizer of its vocabulary, a plain template.
    tokenizer_from: a model folder whose tokenizer files are copied instead, the shape's
    vocabulary then cut to the tokenizer's (a grammar needs a tokenizer that spells text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from tileinfer.model.random_weights import SHAPES

    config = dict(SHAPES[shape], model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0,
                  max_position_embeddings=131072, tie_word_embeddings=False,
                  eos_token_id=128001, bos_token_id=128000)
    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is not None:
        import shutil

        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (tokenizer_from / name).exists():
                shutil.copy(tokenizer_from / name, folder / name)
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config["vocab_size"] = tok.get_vocab_size()
        config["eos_token_id"] = config["bos_token_id"] = tok.token_to_id(
            json.loads((folder / "tokenizer_config.json").read_text())["eos_token"])
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        (folder / "chat_template.jinja").write_text(
            "{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
        log(f"wrote {folder}: {shape} config, the tokenizer of {tokenizer_from} "
            f"({config['vocab_size']} tokens)")
        return
    vocab = config["vocab_size"]
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "w128000", "eos_token": "w128001"}))
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    log(f"wrote {folder}: {shape} config, word-level tokenizer of {vocab} tokens")


# -- the server -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc=None, timeout=900.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server at {url} did not answer /health in {timeout} s")


def spawn_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tileinfer_cli", "serve", "--model", str(args.model),
           "--port", str(port), "--max-running", str(args.max_running),
           "--max-step-tokens", str(args.max_step_tokens), "--max-queue",
           str(max(1024, args.clients * 2)), "--log-level", "warning"]
    if args.load_format:
        cmd += ["--load-format", args.load_format]
    if args.backend:
        cmd += ["--backend", args.backend]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.quantization:
        cmd += ["--quantization", args.quantization]
    cmd += args.serve_arg
    log("starting:", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr)
    url = f"http://127.0.0.1:{port}"
    wait_health(url, proc)
    return proc, url


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the clients ------------------------------------------------------------------------------

async def stream_request(host, port, body: bytes, key: str | None) -> dict:
    """One streamed completion over a fresh connection: timings and usage, or an error."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write((f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{auth}"
                  "Connection: close\r\n\r\n").encode() + body)
    await writer.drain()
    result = {"start": t0, "chunks": [], "usage": None, "error": None}
    try:
        status = int((await reader.readline()).split()[1])
        chunked = False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if status != 200 or not chunked:
            result["error"] = f"HTTP {status}: {(await reader.read())[:300]!r}"
            return result
        buffer = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                break
            buffer += await reader.readexactly(size)
            await reader.readexactly(2)
            now = time.perf_counter()
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = event.removeprefix(b"data: ")
                if data == b"[DONE]":
                    continue
                payload = json.loads(data)
                if "error" in payload:
                    result["error"] = payload["error"]["message"]
                elif payload.get("usage"):
                    result["usage"] = payload["usage"]
                elif payload["choices"] and payload["choices"][0]["text"]:
                    result["chunks"].append(now)
    except (OSError, ValueError, asyncio.IncompleteReadError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        writer.close()
    result["end"] = time.perf_counter()
    return result


def make_prompts(n, length, vocab_lo, vocab_hi, seed) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_lo, vocab_hi) for _ in range(length)] for _ in range(n)]


async def run_clients(url, prompts, clients, output_len, deadline_s, key, extra=None):
    u = urlparse(url)
    host, port = u.hostname, u.port or 80
    queue = list(enumerate(prompts))
    results = []
    stop_at = time.perf_counter() + deadline_s

    async def client():
        while queue and time.perf_counter() < stop_at:
            _, prompt = queue.pop(0)
            body = json.dumps({"prompt": prompt, "max_tokens": output_len, "temperature": 0,
                               "ignore_eos": True, "stream": True,
                               "stream_options": {"include_usage": True},
                               **(extra or {})}).encode()
            try:
                remaining = max(1.0, stop_at - time.perf_counter())
                results.append(await asyncio.wait_for(stream_request(host, port, body, key),
                                                      remaining))
            except (asyncio.TimeoutError, OSError) as e:
                results.append({"error": f"{type(e).__name__}: {e}", "chunks": [],
                                "usage": None})

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return results, t0, time.perf_counter()


def _client_process(args):
    return asyncio.run(run_clients(*args))


def run_client_processes(url, prompts, clients, output_len, deadline_s, key, processes,
                         extra=None):
    """The clients spread over ``processes`` processes (each its own event loop and interpreter,
    so that parsing thousands of chunks a second does not make the load generator the bottleneck),
    clients and prompts dealt out in turn. Returns every result and the wall time from the first
    process's start to the last one's end (perf_counter is the system's monotonic clock)."""
    processes = max(1, min(processes, clients))
    if processes == 1:
        results, t0, t1 = asyncio.run(run_clients(url, prompts, clients, output_len, deadline_s,
                                                  key, extra))
        return results, t1 - t0
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(url, prompts[i::processes], len(range(i, clients, processes)), output_len,
             deadline_s, key, extra) for i in range(processes)]
    # fork: the children only run sockets and json (this process has not touched the GPU yet)
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = list(pool.map(_client_process, jobs))
    results = [r for part, _, _ in parts for r in part]
    return results, max(t1 for _, _, t1 in parts) - min(t0 for _, t0, _ in parts)


def engine_counters(url: str, api_key=None) -> dict:
    """The server's engine step counters from /metrics (steps, pipelined_steps); {} if absent."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    req = urllib.request.Request(url.rstrip("/") + "/metrics", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    names = {"tileinfer_engine_steps_total": "steps",
             "tileinfer_engine_pipelined_steps_total": "pipelined_steps"}
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            found[names[name]] = int(float(value))
    return found


def summarize(results, wall, args) -> dict:
    ok = [r for r in results if r["error"] is None and r["usage"] and r["chunks"]]
    errors = [r["error"] or "no usage or no text" for r in results if r not in ok]
    out_tokens = sum(r["usage"]["completion_tokens"] for r in ok)
    ttft = [r["chunks"][0] - r["start"] for r in ok]
    tpot = [(r["chunks"][-1] - r["chunks"][0]) / (r["usage"]["completion_tokens"] - 1)
            for r in ok if r["usage"]["completion_tokens"] > 1]
    itl = [b - a for r in ok for a, b in zip(r["chunks"], r["chunks"][1:])]
    return dict(bench="serve", clients=args.clients, requests=len(results),
                guided_json=bool(args.guided_json),
                prompt_len=args.prompt_len, output_len=args.output_len,
                max_running=args.max_running, wall_s=round(wall, 3),
                requests_per_s=round(len(ok) / wall, 3),
                output_tok_s=round(out_tokens / wall, 1), output_tokens=out_tokens,
                ttft_ms=percentiles(ttft), tpot_ms=percentiles(tpot), itl_ms=percentiles(itl),
                errors=len(errors), first_errors=errors[:3])


# -- offline ----------------------------------------------------------------------------------

def offline(args, prompts) -> dict:
    import torch

    from tileinfer import LLMEngine, SamplingParams, load_config, load_model
    from tileinfer.backend import default_backend_name
    from tileinfer.model.random_weights import random_model
    from tileinfer_cli.options import DEFAULT_MAX_LEN, default_threads

    # As the server sets itself up (tileinfer serve's defaults): threads, dtype, max_len.
    torch.set_num_threads(args.threads or default_threads())
    backend = args.backend or default_backend_name()
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.load_format == "dummy":
        config = load_config(args.model)
        model = random_model(config, dtype=dtype, backend=backend, device=device, seed=0,
                             max_len=min(DEFAULT_MAX_LEN, config.max_position_embeddings),
                             quantize=args.quantization)
    else:
        model = load_model(args.model, dtype=dtype, backend=backend, quantize=args.quantization)
    engine = LLMEngine(model, max_running=args.max_running,
                       max_step_tokens=args.max_step_tokens)
    engine.warmup()

    def run(batch, new):
        for p in batch:
            engine.add_request(p, SamplingParams(), max_new_tokens=new, stop_ids=[])
        tokens = 0
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        while engine.has_unfinished():
            for out in engine.step():
                if out.finish_reason == "error":
                    raise RuntimeError(out.error)
                tokens += len(out.new_tokens)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return tokens, time.perf_counter() - t

    run(make_prompts(min(len(prompts), 8), args.prompt_len, 100, 30000, args.seed + 1), 8)
    before = engine.stats()
    tokens, wall = run(prompts, args.output_len)
    after = engine.stats()
    engine.close()
    return dict(bench="offline", requests=len(prompts), prompt_len=args.prompt_len,
                output_len=args.output_len, max_running=args.max_running,
                wall_s=round(wall, 3), output_tok_s=round(tokens / wall, 1),
                output_tokens=tokens, backend=model.ops.name,
                steps=after["steps"] - before["steps"],
                pipelined_steps=after["pipelined_steps"] - before["pipelined_steps"])


# -- main -------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (loopback only); default: start one")
    p.add_argument("--api-key", default=os.environ.get("TILEINFER_API_KEY"))
    p.add_argument("--model", help="the model folder (for a started server and --offline)")
    p.add_argument("--make-folder", type=Path, metavar="DIR",
                   help="write a dummy folder of --shape there and serve it (random weights)")
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--load-format", choices=["auto", "dummy"], default=None)
    p.add_argument("--backend")
    p.add_argument("--max-running", type=int, default=None,
                   help="the engine's running requests (default: --clients)")
    p.add_argument("--max-step-tokens", type=int, default=2048)
    p.add_argument("--threads", type=int, help="CPU threads (server and offline engine)")
    p.add_argument("--quantization", choices=["int8", "fp8", "fp8-weight-only"],
                   help="the weights' quantization (server and offline engine)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="one more argument for tileinfer serve (repeatable)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests-per-client", type=int, default=1)
    p.add_argument("--client-procs", type=int, default=None,
                   help="processes the clients run in (default: one per 64 clients, at most 8)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--max-seconds", type=float, default=600.0,
                   help="stop sending after this long (the run's bound)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--tokenizer-from", type=Path, metavar="DIR",
                   help="with --make-folder: copy this model folder's tokenizer (and cut the "
                        "shape's vocabulary to it) instead of a word-level one")
    p.add_argument("--guided-json", metavar="FILE",
                   help="every request carries this JSON schema (guided_json: structured "
                        "output; the warm-up carries it too, so it is compiled before the "
                        "measurement); 'open' for an object holding one long string")
    p.add_argument("--offline", action="store_true",
                   help="also run the same requests through the engine in this process")
    args = p.parse_args(argv)
    if not 1 <= args.clients <= MAX_CLIENTS:
        p.error(f"--clients must be in 1..{MAX_CLIENTS}")
    if not 1 <= args.requests_per_client <= 1000:
        p.error("--requests-per-client must be in 1..1000")
    args.max_running = args.max_running or args.clients
    args.client_procs = args.client_procs or min(8, -(-args.clients // 64))
    extra = None
    if args.guided_json:
        schema = OPEN_SCHEMA if args.guided_json == "open" else json.loads(
            Path(args.guided_json).read_text())
        extra = {"guided_json": schema}
    if args.make_folder:
        make_folder(args.make_folder, args.shape, args.tokenizer_from)
        args.model, args.load_format = args.make_folder, "dummy"
    if args.url:
        host = urlparse(args.url).hostname
        if host not in LOOPBACK:
            p.error(f"--url must be a loopback address (127.0.0.1, localhost, ::1), not {host}")
        if args.offline and not args.model:
            p.error("--offline needs --model (and --load-format) to build the same engine")
    elif not args.model:
        p.error("give --url, --model or --make-folder")

    prompts = make_prompts(args.clients * args.requests_per_client, args.prompt_len, 100, 30000,
                           args.seed)
    proc = None
    url = args.url
    if url is None:
        proc, url = spawn_server(args)
    try:
        if not args.no_warmup:
            warm = make_prompts(min(args.clients, 8), args.prompt_len, 100, 30000, args.seed + 1)
            run_client_processes(url, warm, len(warm), 8, 300, args.api_key, 1, extra)
        log(f"{len(prompts)} requests from {args.clients} clients: prompt {args.prompt_len}, "
            f"output {args.output_len}")
        before = engine_counters(url, args.api_key)
        results, wall = run_client_processes(url, prompts, args.clients, args.output_len,
                                             args.max_seconds, args.api_key, args.client_procs,
                                             extra)
        after = engine_counters(url, args.api_key)
    finally:
        if proc is not None:
            stop_server(proc)
    row = summarize(results, wall, args)
    row.update({name: after[name] - before[name] for name in after if name in before})
    emit(row)
    log(f"serve: {row['output_tok_s']} output tok/s, TTFT p50 {row['ttft_ms']['p50']} ms, "
        f"ITL p50 {row['itl_ms']['p50']} ms, {row['errors']} errors")
    if args.offline:
        off = offline(args, prompts)
        off["serve_vs_offline"] = round(row["output_tok_s"] / off["output_tok_s"], 3)
        emit(off)
        log(f"offline: {off['output_tok_s']} output tok/s; the server reached "
            f"{off['serve_vs_offline']:.1%} of it")


if __name__ == "__main__":
    main()
