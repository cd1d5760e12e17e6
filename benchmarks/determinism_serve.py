"""Does a served answer depend on the load? ``tileinfer serve`` on the loopback interface: one
chat request alone, then the same request 16 times among 64 concurrent requests of mixed prompt
and answer lengths; each copy's text and logprobs (every token's, and its top 2) against the
answer alone, bit for bit. Prints one JSON object per line (progress on stderr).

    python benchmarks/determinism_serve.py --backend triton --deterministic
    python benchmarks/determinism_serve.py --backend triton            # the control: no mode

``--seeded``: temperature 0.8 with a fixed seed instead of greedy (every request carries it).
The model: ``--model`` (default: the embedded default model).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from serve_load import free_port, log, stop_server, wait_health

PROBE = "Explain in a few sentences why the sky is blue."
FILLER = ("The history of the river valley is told in its stones, its fields and the songs of "
          "the people who farmed it. ")


MODEL = {"name": None}  # the served model's name, read from /v1/models


def body(content: str, max_tokens: int, temperature: float, seed: int | None) -> bytes:
    request = {"model": MODEL["name"], "messages": [{"role": "user", "content": content}],
               "max_tokens": max_tokens, "temperature": temperature, "logprobs": True,
               "top_logprobs": 2}
    if seed is not None:
        request["seed"] = seed
    return json.dumps(request).encode()


def ask(url: str, data: bytes) -> dict:
    request = urllib.request.Request(url + "/v1/chat/completions", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        choice = json.loads(r.read())["choices"][0]
    return {"text": choice["message"]["content"], "logprobs": choice["logprobs"]["content"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="triton")
    p.add_argument("--model")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--seeded", action="store_true")
    p.add_argument("--copies", type=int, default=16)
    p.add_argument("--concurrent", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    port = free_port()
    cmd = [sys.executable, "-m", "tileinfer_cli", "serve", "--port", str(port), "--backend",
           args.backend, "--log-level", "warning"]
    cmd += ["--model", args.model] if args.model else []
    cmd += ["--deterministic"] if args.deterministic else []
    log("starting:", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc)
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
            MODEL["name"] = json.loads(r.read())["data"][0]["id"]
        temperature, seed = (0.8, 1234) if args.seeded else (0.0, None)
        probe = body(PROBE, args.max_tokens, temperature, seed)
        ask(url, probe)  # a warm-up (graphs, kernels)
        alone = ask(url, probe)
        # The probe's copies spread among requests of 1..48 filler sentences and 8..128 tokens.
        others = [body(FILLER * (1 + (7 * i) % 48) + f"Question {i}: what happened next?",
                       8 + (29 * i) % 121, 0.0 if i % 3 else 0.9, i)
                  for i in range(args.concurrent - args.copies)]
        step = max(1, len(others) // args.copies)
        bodies = list(others)
        for c in range(args.copies):
            bodies.insert(c * (step + 1), probe)
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda b: ask(url, b), bodies))
        copies = [a for a, b in zip(answers, bodies) if b is probe]
        result = {
            "backend": args.backend, "deterministic": args.deterministic,
            "sampling": "seeded 0.8" if args.seeded else "greedy", "concurrent": len(bodies),
            "copies": len(copies),
            "same_text": sum(a["text"] == alone["text"] for a in copies),
            "same_logprobs": sum(a["logprobs"] == alone["logprobs"] for a in copies),
            "distinct_texts": len({a["text"] for a in copies} | {alone["text"]}),
            "alone_tokens": len(alone["logprobs"]), "alone_text": alone["text"][:120],
        }
        print(json.dumps(result), flush=True)
    finally:
        stop_server(proc)


if __name__ == "__main__":
    main()
