"""The one timing helper of the benchmarks: GPU time of calls replayed from a CUDA graph."""

from __future__ import annotations

import statistics

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
