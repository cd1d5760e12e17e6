"""``tileinfer backends`` tells the truth about this machine (a backend none of whose devices is
present is unavailable, whatever it says), lists a name several distributions claim once, and
errors speak in the command line's words (flags, an install hint)."""

import os
import textwrap

import pytest
import torch

from cli_helpers import assert_one_line_error, tileinfer
from tileinfer_cli.cli_words import in_cli_words

PLUGIN = """
    from tileinfer.backend import BackendInfo, hookimpl

    @hookimpl
    def tileinfer_backend_info():
        return BackendInfo(name={name!r}, available=True, devices={devices!r})
"""


def install(site, dist, name, module, devices=("cpu",)):
    (site / f"{module}.py").write_text(textwrap.dedent(PLUGIN.format(name=name,
                                                                     devices=devices)))
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"  # the folder's name: NAME-VERSION
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tileinfer]\n{name} = {module}\n")


def backends(site):
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    result = tileinfer("backends", env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: cuda runs here")
def test_backend_without_its_devices_is_unavailable(tmp_path):
    # Before: "cudaonly available" on a machine without a GPU.
    install(tmp_path, "cudaonly", "cudaonly", "cudaonly", devices=("cuda",))
    lines = backends(tmp_path)
    assert ("cudaonly unavailable: runs on cuda (BackendInfo.devices) and none is present here"
            in lines)
    assert "ref      available" in lines


def test_a_name_claimed_twice_is_listed_once(tmp_path):
    # Before: the name came twice (or three times), once per claimant.
    install(tmp_path, "tileinfer-backend-dupc", "dupc", "dupc_own")
    install(tmp_path, "other-dupc", "dupc", "dupc_other")
    install(tmp_path, "dupb-one", "dupb", "dupb_one")
    install(tmp_path, "dupb-two", "dupb", "dupb_two")
    lines = backends(tmp_path)
    assert [line.split()[0] for line in lines if not line.startswith(" ")].count("dupc") == 1
    assert [line.split()[0] for line in lines if not line.startswith(" ")].count("dupb") == 1
    assert "dupc     available" in lines
    assert ("         also claimed by other-dupc 0.1: entry point dupc = dupc_other: not used "
            "(this one, tileinfer-backend-dupc 0.1: entry point dupc = dupc_own, is)") in lines
    dupb = next(line for line in lines if line.startswith("dupb"))
    assert "unavailable: invalid plugin: backend name 'dupb' is claimed by several" in dupb


def test_unknown_backend_of_our_own_gets_an_install_hint():
    message = "unknown backend 'cuda'; installed backends: ref, triton"
    assert in_cli_words(message) == (message + "; install it with: pip install "
                                     "tileinfer-backend-cuda (or pip install "
                                     "\"tileinfer-cli[cuda]\")")
    other = "unknown backend 'nope'; installed backends: ref"
    assert in_cli_words(other) == other
    filtered = "unknown backend 'cuda' (TILEINFER_BACKENDS is set); installed backends: ref"
    assert in_cli_words(filtered) == filtered  # installed, but left out on purpose


def test_max_len_errors_name_the_flags(tiny_home):
    # Before: "... or insist with allow_long=True (tileinfer: --allow-long-context)".
    assert_one_line_error(
        tileinfer("run", "-m", "tiny", "--max-len", "300", "hi", env=tiny_home),
        r"^tileinfer: error: --max-len 300 exceeds the model's 256 positions \(config field "
        r"'max_position_embeddings'\); use --max-len 256 or less, or insist with "
        r"--allow-long-context$")
    long = tileinfer("run", "-m", "tiny", "--max-len", "300", "--allow-long-context", "-n", "1",
                     "hi", env=tiny_home)
    assert long.returncode == 0, long.stderr
    assert long.stderr.startswith("tileinfer: warning: --max-len 300 exceeds the model's 256 "
                                  "positions")
    assert "allow_long" not in long.stderr and "max_len" not in long.stderr
