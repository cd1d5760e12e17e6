"""A deliberately wrong toy backend must FAIL the conformance suite: the suite can fail."""

import textwrap

pytest_plugins = ["pytester"]

TOY = """
import torch
from tileinfer.backend import BackendInfo, get_backend, hookimpl, registry


class Toy:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="toy", available=True, devices=("cpu",))

    @hookimpl
    def rmsnorm(self, out, x, weight, eps):
        out.copy_(x * weight)  # forgets to normalize

    @hookimpl
    def linear_swiglu(self, out, x, weight, weight_scale, gate_up, batch_invariant):
        get_backend("ref").linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant)
        out[-1] = float("nan")  # as if the last row were left unwritten

    @hookimpl
    def linear(self, out, x, weight, weight_scale, batch_invariant):
        w = weight.float() if weight_scale is None else weight.float() * weight_scale[:, None]
        for i in range(x.shape[0]):  # correct: a row at a time, rounded once, to out's dtype
            out[i].copy_((x[i].float() @ w.T).to(out.dtype))

    @hookimpl
    def attention_with_inputs(self, out, q_out, kv, qkv, qk, step, scale, causal, workspace):
        ref = get_backend("ref")
        ref.attention_inputs(q_out, kv, qkv, qk, step)
        ref.attention(out, q_out, kv, step, 0.5 * scale, causal, workspace)  # the wrong scale


registry().register(Toy())
"""


def test_broken_toy_backend_fails_conformance(pytester):
    pytester.makeconftest(textwrap.dedent(TOY))
    pytester.makepyfile(test_suite="from tileinfer.testing.conformance import *\n")
    result = pytester.runpytest("--tileinfer-backend", "toy", "-k",
                                "rmsnorm or linear or attention_with_inputs", "-p", "no:randomly",
                                "-q")
    outcomes = result.parseoutcomes()
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    # Every rmsnorm (12) and linear_swiglu (12) case fails; attention_with_inputs fails wherever
    # the scale matters: every case but the first token's (context 1), 48 of 60.
    assert sum("test_rmsnorm[" in line for line in failed) == 12
    assert sum("test_linear_swiglu[" in line for line in failed) == 12
    assert sum("test_attention_with_inputs[" in line for line in failed) == 48
    # The correct ops and the ref fallbacks pass: linear, linear_xielu, add_rmsnorm.
    assert not [line for line in failed if "test_linear[" in line or "test_add_rmsnorm" in line]
    assert outcomes.get("passed", 0) >= 48 + 1 + 12 + 12
    # Skipped: only the batch-invariant linear cases of bf16 and INT8 weights (4 ops x 2 weight
    # dtypes x 2 widths), the FP8 linear cases the -k selects (18 linear, 16 MLP, 6 row checks)
    # and the weight-only e4m3 ones (24 linear, 6 + 6 MLP, 4 row checks, 8 batch-invariant),
    # since the toy declares neither batch invariance nor either FP8 product, and the optional
    # Gemma norms' cases (8 + 2 + 4) and the e4m3-input ops' (5 norm, 12 linear), which it does
    # not implement; it implements attention_with_inputs itself.
    assert outcomes.get("skipped", 0) == 16 + 40 + 48 + 14 + 17
