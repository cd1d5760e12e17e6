"""Capturing a step in a CUDA graph: the one helper the runner and the DFlash proposer share."""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture_graph(step: Callable[[], None], warmup: Callable[[], None] | None = None,
                  pool=None) -> torch.cuda.CUDAGraph:
    """Run ``warmup`` (default: ``step``) once on a side stream, so that kernels compile and
    autotune outside the capture, then capture ``step`` into a new graph (sharing ``pool``, a
    ``torch.cuda.graph_pool_handle()``, if given). Capturing does not run the step: the first
    replay does. Scratch the ops keep must already be reserved (``Model.new_buffers`` does)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        (warmup or step)()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        step()
    return graph


def use_graphs(model, graphs: bool | None) -> bool:
    """Whether steps of model run from CUDA graphs: ``graphs`` if given (checked), else on when
    the model is on a CUDA device and its backend is graph-safe."""
    on_cuda = torch.device(model.device).type == "cuda"
    if graphs is None:
        return on_cuda and model.ops.graph_safe
    if graphs and not on_cuda:
        raise ValueError("CUDA graphs need a model on a CUDA device")
    if graphs and not model.ops.graph_safe:
        raise ValueError(f"backend {model.ops.name!r} is not graph-safe; use graphs=False")
    return bool(graphs)
