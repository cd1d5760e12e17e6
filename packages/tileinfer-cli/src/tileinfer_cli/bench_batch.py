"""``tileinfer bench --batch N``: a static batch on the serving engine, as gpt-fast measures one.

N requests of ``prompt_len`` random token ids and ``new_tokens`` new tokens each (greedy, no stop
ids) are added at once to an ``LLMEngine`` whose KV pool is sized from the memory left after the
weights; tok/s over the whole run (N * new_tokens / wall time, prefill included) and over the
decode steps (from the step that gave every request its first token to the end). Two warm-up
runs compile the kernels and capture the CUDA graphs before anything is timed (the prefill step's
static shape runs eagerly on its first use and is captured on its second).
"""

from __future__ import annotations

import random
import statistics
import time

from .bench_measure import synchronize


def _now(device) -> float:
    synchronize(device)
    return time.perf_counter()


def bench_static_batch(model, batch: int, prompt_len: int, new_tokens: int, kv_quantize=None,
                       repeats: int = 3, seed: int = 0) -> dict:
    from tileinfer import LLMEngine

    engine = LLMEngine(model, max_running=batch, kv_quantize=kv_quantize, prefix_caching=False)
    engine.warmup()
    rng, vocab = random.Random(seed), model.config.vocab_size

    def one_run(n_new: int) -> tuple[float, float]:
        for _ in range(batch):
            engine.add_request([rng.randrange(vocab) for _ in range(prompt_len)],
                               max_new_tokens=n_new, stop_ids=[])
        started, first = set(), None
        t0 = _now(model.device)
        while engine.has_unfinished():
            for out in engine.step():
                started.add(out.request_id)
            if first is None and len(started) == batch:
                first = _now(model.device)
        end = _now(model.device)
        return end - t0, end - (first or end)

    one_run(4)
    one_run(4)
    runs = [one_run(new_tokens) for _ in range(repeats)]
    total = statistics.median(r[0] for r in runs)
    decode = statistics.median(r[1] for r in runs)
    stats = engine.check_accounting()
    engine.close()
    return dict(backend=model.ops.name, weights=model.quantize or str(model.dtype).split(".")[-1],
                kv_cache=kv_quantize or "bf16", batch=batch, prompt_len=prompt_len,
                new_tokens=new_tokens, tok_s=batch * new_tokens / total,
                decode_tok_s=batch * (new_tokens - 1) / decode if decode > 0 else None,
                wall_s=total, pool_pages=stats["pages_total"], page_size=stats["page_size"],
                pool_bytes=stats["pool_bytes"], pipelined_steps=stats["pipelined_steps"])
