"""What another busy Python thread costs an eager step, by thread switch interval.

Every PyTorch op (and a kernel launch through cuda.bindings) releases the GIL, so an eager forward
step gives it up hundreds of times; while another thread runs Python (a server's event loop),
each time can cost the step up to the interpreter's switch interval. For each case: an eager
16-token forward of a random llama3.2-1b-shaped model (``tileinfer.forward``), the median of 8
wall times (after 2 warm-ups), with the CUDA backend's launches holding the GIL
(``tileinfer_backend_cuda/launch.py``) or through cuda.bindings, alone or beside a thread spinning
in Python. One JSON line per case. ``tileinfer serve`` picks its switch interval from this.

    python benchmarks/gil_contention.py
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import torch
from tileinfer import forward
from tileinfer.engine.kv.cache import new_cache
from tileinfer.model.random_weights import random_model, shape_config
from tileinfer_backend_cuda import launch

CASES = [("pydll", 5e-4, False), ("bindings", 5e-4, False), ("pydll", 5e-4, True),
         ("pydll", 1e-4, True), ("pydll", 5e-5, True), ("pydll", 2e-5, True),
         ("bindings", 5e-5, True)]


def main():
    model = random_model(shape_config("llama3.2-1b"), dtype=torch.bfloat16, backend="cuda",
                         device="cuda", max_len=512)
    cache = new_cache(model, 256)
    spinning = threading.Event()

    def spin():
        while spinning.is_set():
            pass

    def step_ms():
        seq = cache.new_sequence()
        torch.cuda.synchronize()
        t = time.perf_counter()
        forward(model, cache, seq, list(range(1, 17)))
        torch.cuda.synchronize()
        cache.release(seq)
        return (time.perf_counter() - t) * 1e3

    for launches, interval, busy in CASES:
        launch._instance = None if launches == "pydll" else False  # False: cuda.bindings
        sys.setswitchinterval(interval)
        thread = threading.Thread(target=spin, daemon=True)
        if busy:
            spinning.set()
            thread.start()
        for _ in range(2):
            step_ms()
        ms = statistics.median(step_ms() for _ in range(8))
        spinning.clear()
        if busy:
            thread.join()
        print(json.dumps(dict(launch=launches, switch_interval_ms=interval * 1e3,
                              busy_thread=busy, eager_step_ms=round(ms, 2))), flush=True)


if __name__ == "__main__":
    main()
