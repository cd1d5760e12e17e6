"""--rope-scaling: a RoPE dict in config.json's form replaces the model's at load time (YaRN for
longer contexts), YaRN's stretch lets --max-len reach factor x the original context without
--allow-long-context, and a bad value is one line of error."""

from __future__ import annotations

import json

from cli_helpers import assert_one_line_error, tileinfer

YARN = json.dumps({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256})


def test_yarn_override_runs_and_stretches_max_len(tiny_home):
    # The tiny model has 256 positions: 512 is refused without the override (see
    # test_backends_cmd.py) and within YaRN's stretch with it.
    result = tileinfer("run", "-m", "tiny", "--rope-scaling", YARN, "--max-len", "512", "-n", "2",
                       "--json", "hi", env=tiny_home)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
    assert len(json.loads(result.stdout)["tokens"]) == 2
    assert_one_line_error(
        tileinfer("run", "-m", "tiny", "--rope-scaling", YARN, "--max-len", "513", "hi",
                  env=tiny_home),
        r"^tileinfer: error: --max-len 513 exceeds the model's 512 positions")


def test_bad_rope_scaling_is_one_line(tiny_home):
    assert_one_line_error(tileinfer("run", "-m", "tiny", "--rope-scaling", "yarn", "hi",
                                    env=tiny_home),
                          r"^tileinfer run: error: argument --rope-scaling: yarn is not a "
                          r"JSON object")
    assert_one_line_error(
        tileinfer("run", "-m", "tiny", "--rope-scaling", '{"rope_type": "yarn"}', "hi",
                  env=tiny_home),
        r"^tileinfer: error: .*'rope_scaling.factor' is required for yarn RoPE scaling")
