"""`tileinfer bench --shape` offers exactly the named shapes of random_weights (the parser lists
them without importing torch)."""

from tileinfer.model.random_weights import SHAPES
from tileinfer_cli import bench_cmd


def test_bench_offers_every_random_weight_shape():
    assert set(bench_cmd.SHAPES) == set(SHAPES)
