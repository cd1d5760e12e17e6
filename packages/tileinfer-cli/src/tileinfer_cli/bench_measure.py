"""What ``tileinfer bench`` measures: prefill and decode throughput at batch 1, and the
memory-bandwidth bound it is compared with.

Decoding one token at batch 1 reads every weight once (the embedding table excepted: one row)
plus the KV cache of the context, so ``bound = copy bandwidth / bytes read per token``. The copy
bandwidth is measured with a device-to-device copy (bytes read + written per second).
"""

from __future__ import annotations

import random
import time

import torch

from tileinfer import (ModelRunner, SamplingParams, generate_into, kv_bytes_per_token, new_cache,
                       weight_bytes)
from tileinfer.engine.generation.runner import prefill_bucket


def copy_bandwidth(device="cuda", nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write), the median of 10."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() * 2 / sorted(times[2:])[len(times[2:]) // 2]


def bytes_per_decode_token(model, context: int, kv_quantize=None, batch: int = 1) -> int:
    """Bytes a decode step reads: the weights once (the embedding table excepted, of which a step
    reads only a row a sequence, not counted) plus the KV cache of ``context`` positions for each
    of ``batch`` sequences. At batch 1 that is a token's; a step of ``batch`` tokens shares the
    weights' bytes."""
    embed = model.weights.embed
    weights = weight_bytes(model) - (0 if model.weights.lm_head is embed
                                     else embed.numel() * embed.element_size())
    return weights + batch * context * kv_bytes_per_token(model.config, kv_quantize, model.dtype)


def synchronize(device):
    """Wait for the device's work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def bench_generation(model, prompt_len: int = 16, new_tokens: int = 256,
                     graphs: bool | None = None, pipeline: bool | None = None,
                     kv_quantize: str | None = None, repeats: int = 3, progress=None) -> dict:
    """Prefill and decode throughput at batch 1 (greedy, no stop tokens), medians of repeats.
    progress(text), if given, hears of each warm-up and timed run as it ends."""
    say = progress or (lambda text: None)
    # Room for the prefill's padding too (engine/generation/runner.py prefill_bucket): a pool that holds
    # the prompt but not its bucket would run the prefill eagerly.
    prefill_len = max(prompt_len, prefill_bucket(prompt_len) or 0)
    cache = new_cache(model, prefill_len + new_tokens + 32, quantize=kv_quantize)
    runner = ModelRunner(model, cache, graphs=graphs)
    pipeline = runner.graphs if pipeline is None else pipeline
    rng = random.Random(0)
    prompt = [rng.randrange(model.config.vocab_size) for _ in range(prompt_len)]
    greedy = SamplingParams()

    def one_run(n_new):
        seq = cache.new_sequence()
        first = []
        synchronize(model.device)
        start = time.perf_counter()
        out = generate_into(runner, seq, prompt, n_new, greedy, stop_ids=[], seed=0,
                            pipeline=pipeline,
                            on_token=lambda t: first or first.append(time.perf_counter()))
        synchronize(model.device)
        end = time.perf_counter()
        cache.release(seq)
        assert len(out) == n_new
        return first[0] - start, end - first[0]

    for i in range(2):  # warm-up: compiles kernels, captures graphs (a prefill's on its 2nd use)
        one_run(min(8, new_tokens))
        say(f"warm-up {i + 1}/2 done")
    runs = []
    for i in range(repeats):
        runs.append(one_run(new_tokens))
        ttft, decode = runs[-1]
        say(f"run {i + 1}/{repeats}: first token after {ttft * 1e3:.1f} ms, decode "
            f"{(new_tokens - 1) / decode if decode > 0 else 0:.1f} tok/s")
    runs.sort()
    prefill_s, decode_s = runs[len(runs) // 2]
    result = dict(prompt_len=prompt_len, new_tokens=new_tokens, graphs=runner.graphs,
                  pipeline=pipeline, kv_cache=kv_quantize or str(model.dtype).split(".")[-1],
                  weights=model.quantize or str(model.dtype).split(".")[-1],
                  backend=model.ops.name,
                  time_to_first_token_ms=prefill_s * 1e3,
                  decode_tok_s=(new_tokens - 1) / decode_s)
    if runner.graphs:
        result.update(_step_times(runner, cache, prompt))
    return result


def _step_times(runner, cache, prompt, steps: int = 50) -> dict:
    """GPU time of one captured 1-token step (replays back to back) and the host's own time to
    prepare and issue one pipelined step: when host < GPU, pipelining hides the host."""
    greedy = SamplingParams()
    seq = cache.new_sequence()
    runner.forward(seq, prompt, greedy)
    runner.decode_from_device(seq, greedy)
    graph = runner.captured_graph(1, greedy)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    end.synchronize()
    gpu_ms = start.elapsed_time(end) / steps
    # The host's own time per step: each step is issued with the GPU idle, so that nothing in
    # it waits for the GPU (back to back, the host would run ahead until its pinned metadata
    # buffers are all in flight and then wait, which is the GPU's time, not the host's).
    host_s = 0.0
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.decode_from_device(seq, greedy)
        host_s += time.perf_counter() - t0
    host_ms = host_s * 1e3 / steps
    torch.cuda.synchronize()
    cache.release(seq)
    return dict(gpu_ms_per_step=gpu_ms, host_ms_per_step=host_ms)
