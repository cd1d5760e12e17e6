"""The decode GEMVs' L2 prefetch (kernels/l2_prefetch.cuh): before it waits for the kernel
before it (PDL), a GEMV block asks for weight bytes past those its prologue copies, so that the
short kernels between the GEMVs (norms, the decode attention) overlap with the weight stream.

Per kernel family ("mma": gemv.cu, "rows": gemv_rows.cu, "wgmma": gemm_fp8.py's), two
settings: ``{family}_budget``, the bytes of a weight prefetched, spread evenly over its rows (0:
none; L2 holds some 50 MB), and ``{family}_ahead``, blocks per SM: block b also prefetches the
rows of block b + ahead x SMs (the blocks of the first wave, resident early, fetch for those of
the second; gemm_fp8.py's blocks prefetch their own rows only). ``SHIPPED`` holds the measured
choice; the experiment switch's ``"l2_prefetch"`` (ops/tuning.py) replaces any of them.
"""

from __future__ import annotations

from .common import num_sms
from .tuning import experiments

SHIPPED = {"mma_budget": 0, "mma_ahead": 0, "rows_budget": 0, "rows_ahead": 0,
           "wgmma_budget": 0}


def l2_prefetch_defines(family: str, pdl_on: bool, weight_rows: int, device: int) -> dict:
    """The defines of a `family` build's prefetch for a weight of weight_rows rows (every
    matrix's): none without PDL (the prefetch runs while the kernel before still does) or where
    the budget leaves less than 16 bytes a row."""
    settings = {**SHIPPED, **experiments["l2_prefetch"]}
    row_bytes = int(settings[f"{family}_budget"]) // max(1, weight_rows) // 16 * 16
    if not pdl_on or row_bytes <= 0:
        return {}
    ahead = int(settings.get(f"{family}_ahead", 0)) * num_sms(device)
    return {"L2_PREFETCH": row_bytes, "L2_AHEAD": max(0, ahead)}
