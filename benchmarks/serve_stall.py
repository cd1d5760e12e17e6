"""Does a huge request stall the other streams of ``tileinfer serve``? One completion streams
``--output-len`` tokens; meanwhile, ``--big-mb`` MB of chat text arrives in one request (its
template, validation and tokenization run off the event loop; it is then refused for the
context). The stream's gaps between chunks are timed: the longest one while the big request was
being read and prepared, against the longest before it. One JSON object (progress on stderr).

    python benchmarks/serve_stall.py --make-folder /tmp/l8b --shape llama3-8b --backend cuda
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from urllib.parse import urlparse

from serve_load import (emit, log, make_folder, make_prompts, spawn_server, stop_server,
                        stream_request)


def big_body(megabytes: float) -> bytes:
    """A chat request of that many MB of words (made before the measurement: building it takes
    the client's loop a while)."""
    rng = random.Random(1)
    words = ["river", "stone", "field", "song", "valley", "people", "farm", "light"]
    text = " ".join(rng.choice(words) for _ in range(int(megabytes * 1e6 / 6)))
    return json.dumps({"messages": [{"role": "user", "content": text}],
                       "max_tokens": 4}).encode()


async def big_request(host: str, port: int, body: bytes) -> dict:
    """The big request; its status and how long the answer took."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n").encode() + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    answer = await reader.read()
    writer.close()
    return {"status": status, "bytes": len(body), "seconds": round(time.perf_counter() - t0, 3),
            "answer": answer[-200:].decode("utf-8", "replace")}


async def measure(url: str, output_len: int, megabytes: float, delay: float) -> dict:
    u = urlparse(url)
    prompt = make_prompts(1, 64, 100, 30000, 0)[0]
    body = json.dumps({"prompt": prompt, "max_tokens": output_len, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    big_one = big_body(megabytes)
    # A short request first: on a fresh machine the first prefill compiles kernels, which could
    # hold the measured stream's first token until after the big request is answered.
    warm = json.loads(body)
    warm["max_tokens"] = 8
    await stream_request(u.hostname, u.port, json.dumps(warm).encode(), None)
    stream = asyncio.create_task(stream_request(u.hostname, u.port, body, None))
    await asyncio.sleep(delay)
    sent = time.perf_counter()
    big = await big_request(u.hostname, u.port, big_one)
    done = time.perf_counter()
    result = await stream
    chunks = result["chunks"]
    gaps = [(b - a, a) for a, b in zip(chunks, chunks[1:])]
    before = [g for g, at in gaps if at < sent]
    during = [g for g, at in gaps if sent - 0.1 <= at <= done]
    longest = sorted(gaps, reverse=True)[:3]
    return {"bench": "serve_stall", "stream_error": result["error"], "stream_chunks": len(chunks),
            "longest_gaps": [{"ms": round(g * 1e3, 2), "starts_after_send_ms":
                              round((at - sent) * 1e3, 1)} for g, at in longest],
            "big_request": big, "gaps_before": len(before),
            "longest_gap_before_ms": round(max(before) * 1e3, 2) if before else None,
            "gaps_during": len(during),
            "longest_gap_during_ms": round(max(during) * 1e3, 2) if during else None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--make-folder", type=Path, metavar="DIR")
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--backend")
    p.add_argument("--big-mb", type=float, default=4.0)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--delay", type=float, default=1.0, help="seconds of stream before the big one")
    args = p.parse_args(argv)
    if args.make_folder:
        make_folder(args.make_folder, args.shape)
        args.model, load_format = args.make_folder, "dummy"
    else:
        load_format = None
    if not args.model:
        p.error("give --model or --make-folder")
    server_args = argparse.Namespace(
        model=args.model, max_running=8, max_step_tokens=2048, clients=1,
        load_format=load_format, backend=args.backend, threads=None,
        serve_arg=["--max-body-bytes", str(int(args.big_mb * 1e6) + (1 << 20))])
    proc, url = spawn_server(server_args)
    try:
        row = asyncio.run(measure(url, args.output_len, args.big_mb, args.delay))
    finally:
        stop_server(proc)
    emit(row)
    log(f"longest gap {row['longest_gap_during_ms']} ms while the {args.big_mb} MB request was "
        f"handled (before: {row['longest_gap_before_ms']} ms); it got HTTP "
        f"{row['big_request']['status']} in {row['big_request']['seconds']} s")


if __name__ == "__main__":
    main()
