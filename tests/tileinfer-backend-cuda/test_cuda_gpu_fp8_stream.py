"""gemm_fp8_stream.cu (ops/gemm_fp8_stream.py) on an H100 or H200: gemm_fp8.py's batched FP8
products as one stream of K stages a block, against ref and against the path it replaces; the
same bits at every launch, whatever the step's other rows, and from a CUDA graph; the flags
down after each launch."""

from __future__ import annotations

import pytest
import torch
from tileinfer.testing.conformance.helpers import make_fp8_weight, run_linear_op

from cuda_gpu import DEV, loaded_modules
from test_cuda_gpu_linear import _experiment, _over_bound

pytestmark = pytest.mark.gpu

# Two warpgroups a block, one block a SM, a deep ring; one warpgroup, two blocks a SM (twice
# the segments, so more of them joined through the partials); stages of two boxes.
SETTINGS = [{"row_warps": 8, "stream_stages": 8, "stream_ctas": 1},
            {"row_warps": 4, "stream_stages": 4, "stream_ctas": 2},
            {"row_warps": 8, "stream_stages": 4, "stream_boxes": 2}]
IDS = ["wg2", "wg1-ctas2", "wg2-boxes2"]


def _stream(setting):
    return {"fp8_gemm": {"enabled": True, "stream": True, **setting}}


@pytest.fixture(autouse=True)
def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("gemm_fp8_stream.cu is Hopper's")


@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
@pytest.mark.parametrize("n", [17, 32, 64])
@pytest.mark.parametrize("op,rows,k", [("linear", 6144, 4096), ("linear", 4096, 14336),
                                       ("linear", 1000, 4096), ("linear_swiglu", 1000, 4096)])
def test_stream_products_are_as_near_ref_as_the_path_they_replace(cuda, ref, setting, n, op,
                                                                 rows, k):
    """Against ref at llama3-8b's qkv and down, and 1,000 outputs (a row tile partly past the
    edge) with and without SwiGLU: no more outputs past the conformance tolerance than the path
    it replaces (cuBLASLt, or gemv.cu where cuBLASLt refuses), none further past it; a second
    launch gives the same bits, and the flags are down after each."""
    from tileinfer_backend_cuda.ops.common import STREAM_SCRATCH

    g = torch.Generator().manual_seed(n + rows + k)
    x = torch.randn(n, k, generator=g).to(torch.bfloat16).to(DEV)
    w, scale = make_fp8_weight(2 * rows if op == "linear_swiglu" else rows, k, DEV, g)

    def run(ops):
        return run_linear_op(ops, op, x, w, scale, rows, False)

    expected = run(ref)
    with _experiment(_stream(setting)):
        first, second = run(cuda), run(cuda)
        torch.cuda.synchronize()
        flags = STREAM_SCRATCH.get(torch.cuda.current_device())[1]
        assert not torch.count_nonzero(flags), "a flag left up"
    assert loaded_modules("gemm_fp8_stream.cu", WG=1 if setting["row_warps"] == 4 else 2)
    assert torch.equal(first, second)
    ours = _over_bound(first, expected)
    with _experiment({"fp8_gemm": {"enabled": False}}):
        replaced = _over_bound(run(cuda), expected)
    assert int((ours > 1).sum()) <= int((replaced > 1).sum())
    assert ours.max() <= max(1.0, float(replaced.max()))


@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_a_rows_bits_do_not_depend_on_the_other_rows(cuda, setting):
    """The order of a row's sum is the shape's and the GPU's alone: the first 40 rows of a
    64-row step equal a 40-row step of them bit for bit."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 4096, generator=g).to(torch.bfloat16).to(DEV)
    w, scale = make_fp8_weight(4096, 4096, DEV, g)
    with _experiment(_stream(setting)):
        all_rows = run_linear_op(cuda, "linear", x, w, scale, 4096, False)
        some = run_linear_op(cuda, "linear", x[:40].clone(), w, scale, 4096, False)
    assert torch.equal(all_rows[:40], some)


def test_stream_products_replay_from_a_cuda_graph(cuda):
    """Three launches captured in one graph replay on new inputs as they ran eagerly: the
    partials' flags are lowered by the kernel, the scratch reserved before the capture."""
    g = torch.Generator().manual_seed(5)
    w, scale = make_fp8_weight(6144, 4096, DEV, g)
    xs = [torch.randn(64, 4096, generator=g).to(torch.bfloat16).to(DEV) for _ in range(3)]
    x = torch.empty_like(xs[0])
    out = torch.empty(64, 6144, dtype=torch.bfloat16, device=DEV)
    cuda.reserve_scratch(DEV)
    with _experiment(_stream(SETTINGS[0])):
        eager = []
        for xi in xs:
            x.copy_(xi)
            cuda.linear(out, x, w, scale, batch_invariant=False)
            eager.append(out.clone())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # the tensor map and the quantization scratch, made
            cuda.linear(out, x, w, scale, batch_invariant=False)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(3):
                cuda.linear(out, x, w, scale, batch_invariant=False)
    assert loaded_modules("gemm_fp8_stream.cu")
    for xi, want in zip(xs, eager):
        x.copy_(xi)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
