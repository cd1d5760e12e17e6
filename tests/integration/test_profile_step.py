"""benchmarks/profile_step.py's accounting of a profiled decode step (no GPU needed): kernel
names without templates or parameters, and attributed times that add up to the step's span."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_step.py"


@pytest.fixture(scope="module")
def profile_step():
    spec = importlib.util.spec_from_file_location("profile_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kernel_names_lose_templates_and_parameters(profile_step):
    assert profile_step.short_name("void at::native::vectorized_elementwise_kernel<4, Foo>(int, Bar)") \
        == "vectorized_elementwise_kernel"
    assert profile_step.short_name("_gemv_kernel") == "_gemv_kernel"


def test_attributed_times_add_up_to_the_span(profile_step, tmp_path):
    # Two replays of a step: a (0-10), b overlapping a's end (8-15, as with PDL), then a gap
    # before c (20-22); the second replay starts at 30. Attributed: b 5 and c 7 each time.
    events = []
    for base in (0.0, 30.0):
        for name, ts, dur in (("a(int)", 0, 10), ("b<1>", 8, 7), ("c", 20, 2)):
            events.append({"cat": "kernel", "name": name, "ts": base + ts, "dur": dur})
    events.append({"cat": "cpu_op", "name": "ignored", "ts": 0, "dur": 100})
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    kernels = profile_step.kernel_events(str(trace))
    assert [k[0] for k in kernels[:3]] == ["a", "b", "c"]
    rows, span = profile_step.summarize(kernels, replays=2)
    by_name = {r["kernel"]: r for r in rows}
    assert span == pytest.approx(26.0)  # (52 - 0) / 2: the gap between replays counts
    # the second replay's a (30-40) is attributed from c's end (22): the gap between replays
    assert by_name["a"]["attributed_us_per_step"] == pytest.approx((10 + 18) / 2)
    assert by_name["b"]["attributed_us_per_step"] == pytest.approx(5)
    assert by_name["c"]["attributed_us_per_step"] == pytest.approx(7)
    assert sum(r["attributed_us_per_step"] for r in rows) == pytest.approx(span)
    assert by_name["b"]["mean_us"] == pytest.approx(7) and by_name["c"]["calls_per_step"] == 1
