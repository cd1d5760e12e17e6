"""The timing helpers of the benchmarks: GPU time of calls replayed from a CUDA graph, and the
host's time in chosen methods."""

from __future__ import annotations

import statistics
import time

import torch


def time_graph(calls, replays: int = 7) -> float:
    """Median seconds per call of ``calls`` (zero-argument callables, already run once so that
    their kernels are compiled), captured back to back in one CUDA graph and replayed: the way
    a model runner issues decode steps, without launch overhead."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(calls))
    del graph
    return statistics.median(times)


def time_op(fn, reps: int = 20, replays: int = 7) -> float:
    """Median seconds of one ``fn(i)`` (i = 0..reps-1, e.g. picking rotated inputs so nothing
    sits in L2), after one warm-up call."""
    fn(0)
    return time_graph([lambda i=i: fn(i) for i in range(reps)], replays)


def time_methods(owner, names, totals: dict, labels=None) -> dict:
    """Wrap the methods ``names`` of class ``owner`` with host timers adding into ``totals``
    ({label: (seconds, calls)}, filled as they run; the label of a method is its name unless
    ``labels`` gives another). Returns totals."""
    for name, label in zip(names, labels or names):
        original = getattr(owner, name)

        def wrapper(*args, _original=original, _label=label, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                seconds, calls = totals.get(_label, (0.0, 0))
                totals[_label] = (seconds + time.perf_counter() - start, calls + 1)

        setattr(owner, name, wrapper)
    return totals
