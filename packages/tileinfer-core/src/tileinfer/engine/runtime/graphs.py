"""Capturing a step in a CUDA graph: the one helper every static step and the DFlash drafter use."""

from __future__ import annotations

from collections.abc import Callable

import torch

_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _capture_stream() -> torch.cuda.Stream:
    """One side stream per device for warm-ups and captures (a new stream per capture costs a
    driver call and keeps the stream alive as long as its graph)."""
    device = torch.cuda.current_device()
    stream = _CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    return stream


def capture_graph(step: Callable[[], None], warmup: Callable[[], None] | None = None,
                  pool=None) -> torch.cuda.CUDAGraph:
    """Run ``warmup`` (default: ``step``) once on a side stream, so that kernels compile and
    autotune outside the capture, then capture ``step`` into a new graph (sharing ``pool``, a
    ``torch.cuda.graph_pool_handle()``, if given). Capturing does not run the step: the first
    replay does. Scratch the ops keep must already be reserved (``Model.new_buffers`` does).

    Unlike ``torch.cuda.graph`` this neither synchronizes the device nor empties the caching
    allocator before the capture: the side stream waits for the current one instead (stream
    order is all the capture needs), and the cached blocks stay for the steps that follow (an
    emptied cache makes their next allocations go back to the driver)."""
    stream = _capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        (warmup or step)()
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=pool)
        try:
            step()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
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
