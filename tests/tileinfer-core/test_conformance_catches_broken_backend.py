"""A deliberately wrong toy backend must FAIL the conformance suite: the suite can fail."""

import textwrap

pytest_plugins = ["pytester"]

TOY = """
import torch
from tileinfer.backend.registry import BackendInfo, registry
from tileinfer.backend.hookspecs import hookimpl


class Toy:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="toy", available=True, devices=("cpu",))

    @hookimpl
    def rmsnorm(self, out, x, weight, eps):
        out.copy_(x * weight)  # forgets to normalize

    @hookimpl
    def silu_mul(self, out, gate_up):
        out[:-1] = 0  # leaves the last row unwritten

    @hookimpl
    def linear(self, out, x, weight, weight_scale):
        w = weight.float() if weight_scale is None else weight.float() * weight_scale[:, None]
        y = x.float() @ w.T
        if weight_scale is None:  # a float weight's product is rounded to x's dtype first
            y = y.to(x.dtype)
        out.copy_(y.to(out.dtype))  # correct


registry().register(Toy())
"""


def test_broken_toy_backend_fails_conformance(pytester):
    pytester.makeconftest(textwrap.dedent(TOY))
    pytester.makepyfile(test_suite="from tileinfer.testing.conformance import *\n")
    result = pytester.runpytest("--tileinfer-backend", "toy", "-k", "rmsnorm or silu_mul or linear",
                                "-p", "no:randomly", "-q")
    outcomes = result.parseoutcomes()
    # Every rmsnorm and silu_mul case fails; the correct linear cases pass.
    result.stdout.fnmatch_lines(["*FAILED*test_rmsnorm*", "*FAILED*test_silu_mul*"])
    assert outcomes.get("failed", 0) >= 10 + 6
    assert outcomes.get("passed", 0) >= 20
    assert not [line for line in result.outlines if "FAILED" in line and "test_linear[" in line]
