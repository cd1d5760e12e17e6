"""An example TileInfer backend: four ops in plain PyTorch, the rest from ``ref``.

Each op is a ``@hookimpl`` function named after its hookspec in ``tileinfer/backend/hookspecs.py``
with the spec's arguments, same names, same order; it writes its result into the tensors it is
given and returns nothing. The docstrings of the hookspecs say where results are rounded.
"""

from __future__ import annotations

import torch

from tileinfer.backend import BackendInfo, hookimpl


@hookimpl
def tileinfer_backend_info():
    return BackendInfo(
        name="example",  # equal to the entry point's name in pyproject.toml
        available=True,  # plain PyTorch runs wherever torch does
        devices=("cpu", "cuda"),
        # Its ops allocate temporaries (x.float(), ...): not for capture in a CUDA graph.
        graph_safe=False,
        notes={"linear": "torch.matmul in float32"},
    )


@hookimpl
def embed(out, table, ids):
    out.copy_(table[ids.long()])


def _rms(x, weight, eps, dtype):
    xf = x.float()
    x_hat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight.to(dtype) * x_hat.to(dtype)


@hookimpl
def rmsnorm(out, x, weight, eps):
    out.copy_(_rms(x, weight, eps, out.dtype))


@hookimpl
def add_rmsnorm(residual, out, delta, weight, eps):
    residual.copy_((residual.float() + delta.float()).to(residual.dtype))
    out.copy_(_rms(residual, weight, eps, out.dtype))


@hookimpl
def linear(out, x, weight, weight_scale, batch_invariant):
    w = weight.float() if weight_scale is None else weight.float() * weight_scale[:, None]
    # The float32 sum, rounded once to out's dtype (x's dtype, or float32 for the logits).
    # batch_invariant: one row at a time, since a matrix product may sum a row in another order
    # at another row count; a batched step takes all rows in one product.
    rows = [slice(i, i + 1) for i in range(x.shape[0])] if batch_invariant else [slice(None)]
    for r in rows:
        out[r].copy_((x[r].float() @ w.T).to(out.dtype))
