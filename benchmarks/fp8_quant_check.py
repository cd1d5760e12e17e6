"""FP8 on the CUDA backend against the definition (tileinfer/backend/fp8.py), on a GPU: for a
few step sizes, whether fp8_quant.cu's quantized rows and scales equal PyTorch's bit for bit, and
how far each path (cuda single-sequence, cuda batched, ref on the GPU, ref on the CPU) is from
the float64 product of the same quantized operands.

    python benchmarks/fp8_quant_check.py
"""

import torch, tileinfer as ti
from tileinfer.backend.fp8 import quantize_rows, fp8_matmul
from tileinfer.testing.conformance.helpers import rand, make_fp8_weight
from tileinfer_backend_cuda.ops import linear_fp8
from tileinfer_backend_cuda.ops.common import FP8_SCRATCH
print("tf32", torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
cuda, ref = ti.get_backend("cuda"), ti.get_backend("ref")
for n, k, o in [(17, 256, 384), (64, 256, 384), (65, 256, 384), (200, 576, 960)]:
    gen = torch.Generator().manual_seed(n + k)
    x = rand((n, k), torch.bfloat16, "cuda", 1.0, gen)
    w, s = make_fp8_weight(o, k, "cuda", gen)
    xq_t, xs_t = quantize_rows(x)
    scratch, scales = FP8_SCRATCH.reserve(0)
    xq = scratch[: n * k].view(n, k); xsc = scales[:n]
    linear_fp8.quantize_rows(x, xq, xsc); torch.cuda.synchronize()
    qsame = torch.equal(xq.view(torch.float8_e4m3fn).float(), xq_t.float()); ssame = torch.equal(xsc, xs_t)
    exact = (xq_t.double() @ w.double().T) * xs_t.double()[:, None] * s.double()[None, :]
    outs = {}
    for name, ops, inv in (("cuda-steps", cuda, True), ("cuda-batched", cuda, False), ("ref-gpu", ref, True)):
        out = torch.full((n, o), float("nan"), dtype=torch.bfloat16, device="cuda")
        ops.linear(out, x, w, s, inv); torch.cuda.synchronize()
        outs[name] = out
    refcpu = torch.empty(n, o, dtype=torch.bfloat16); ref.linear(refcpu, x.cpu(), w.cpu(), s.cpu(), True)
    outs["ref-cpu"] = refcpu
    print(n, k, o, "quant same", qsame, "scale same", ssame)
    for name, out in outs.items():
        err = (out.double().cpu() - exact.cpu()).abs()
        print(f"  {name}: max err vs exact {err.max().item():.4g}, >0.02: {(err > 0.02 + 0.02 * exact.abs().cpu()).sum().item()}")
