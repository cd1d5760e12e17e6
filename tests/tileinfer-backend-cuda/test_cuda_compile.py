"""The CUDA backend's kernels compile to sm_90 cubins with NVRTC (no GPU needed), the compiler
reports errors with the file name and NVRTC's log, and cubins are cached on disk by content.

These run in CI: cuda-bindings and the NVRTC wheel are dependencies of tileinfer-backend-cuda,
so the workspace environment has them. A missing NVRTC fails here rather than skipping.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from cuda_builds import builds
from tileinfer_backend_cuda import compiler
from tileinfer_backend_cuda.ops import attention

ARCH = "sm_90"  # the H200
BUILDS = builds()


def _build_id(build):
    file, defines, extra = build
    parts = [f"{k}={v}" if v is not None else k for k, v in sorted(defines.items())]
    return file + ("[" + ",".join(parts + list(extra)) + "]")


def test_nvrtc_is_loadable_and_knows_sm90():
    major, _ = compiler.nvrtc_version()
    assert major >= 12
    assert 90 in compiler.supported_archs()
    assert compiler.arch_for((9, 0)) == "sm_90"


def test_every_kernel_file_has_a_build():
    files = {p.name for p in compiler.KERNEL_DIR.glob("*.cu")}
    assert files, f"no kernels in {compiler.KERNEL_DIR}"
    assert files == {file for file, _, _ in BUILDS}


@pytest.mark.parametrize("build", BUILDS, ids=_build_id)
def test_kernel_compiles_to_sm90_cubin(build):
    file, defines, extra = build
    try:
        cubin = compiler.compile_cubin(file, ARCH, defines, extra, use_cache=False)
    except compiler.CompileError as exc:  # show the whole NVRTC log
        pytest.fail(str(exc), pytrace=False)
    assert cubin[:4] == b"\x7fELF", "NVRTC must produce a cubin (ELF), not PTX"


@pytest.mark.parametrize("head_dim,m_tiles", [(64, 2), (128, 1), (128, 2), (256, 1)])
@pytest.mark.parametrize("kv_int8,smooth", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_decode_attention_smem_mirror_matches_the_kernel(head_dim, m_tiles, kv_int8, smooth):
    """attention_decode_smem_bytes (the launch's dynamic shared memory) equals the kernel's
    sizeof(SharedTiles): the kernel static_asserts it when given SMEM_BYTES."""
    stages = 3
    size = attention.attention_decode_smem_bytes(head_dim, bool(kv_int8), bool(smooth), stages,
                                                 m_tiles)
    defines = {"HEAD_DIM": head_dim, "KV_INT8": kv_int8, "SMOOTH": smooth, "M_TILES": m_tiles,
               "KV_STAGES": stages}
    compiler.compile_cubin("attention_decode.cu", ARCH, {**defines, "SMEM_BYTES": size},
                           attention.DECODE_OPTIONS, use_cache=False)
    with pytest.raises(compiler.CompileError, match="SharedTiles"):
        compiler.compile_cubin("attention_decode.cu", ARCH, {**defines, "SMEM_BYTES": size + 16},
                               attention.DECODE_OPTIONS, use_cache=False)


def test_compile_error_names_the_file_and_shows_the_log():
    with pytest.raises(compiler.CompileError) as info:
        compiler.compile_source("broken.cu", 'extern "C" __global__ void k() { undefined_thing(); }',
                                compiler.build_options(ARCH))
    message = str(info.value)
    assert "broken.cu" in message and "undefined_thing" in message


def test_cache_key_covers_defines_options_and_arch():
    base = compiler.cache_key("norm.cu", compiler.build_options(ARCH, {"VEC": 8}))
    assert base == compiler.cache_key("norm.cu", compiler.build_options(ARCH, {"VEC": 8}))
    assert base != compiler.cache_key("norm.cu", compiler.build_options(ARCH, {"VEC": 4}))
    assert base != compiler.cache_key("norm.cu", compiler.build_options("sm_80", {"VEC": 8}))
    assert base != compiler.cache_key("norm.cu", compiler.build_options(ARCH, {"VEC": 8}, ("-fmad=false",)))
    assert base != compiler.cache_key("elementwise.cu", compiler.build_options(ARCH, {"VEC": 8}))


def test_disk_cache_is_reused_across_processes(tmp_path):
    """A second process finds the cubin on disk and compiles nothing."""
    script = (
        "from tileinfer_backend_cuda import compiler\n"
        "c = compiler.compile_cubin('elementwise.cu', 'sm_90', {'DTYPE': 'bf16_t', 'VEC': 8})\n"
        "print(compiler.stats.compiled, compiler.stats.cache_hits, len(c))\n"
    )
    env = {**__import__("os").environ, "TILEINFER_CACHE": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    compiled1, hits1, size1 = map(int, first.stdout.split())
    compiled2, hits2, size2 = map(int, second.stdout.split())
    assert (compiled1, hits1) == (1, 0)
    assert (compiled2, hits2) == (0, 1)
    assert size1 == size2
    cubins = list((tmp_path / "cuda").glob("elementwise-sm_90-*.cubin"))
    assert len(cubins) == 1


def test_backend_reports_why_it_cannot_run_here():
    import torch
    from tileinfer.backend.registry import BackendError, get_backend, list_backends

    cuda = {b.name: b for b in list_backends()}.get("cuda")
    assert cuda is not None, "the cuda entry point is not installed"
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the backend is available")
    assert not cuda.available
    assert cuda.reason == "no CUDA GPU"
    with pytest.raises(BackendError, match="no CUDA GPU"):
        get_backend("cuda")


def test_kernels_ship_in_the_package():
    files = {p.name for p in compiler.KERNEL_DIR.iterdir()}
    assert "common.cuh" in files
    assert {"attention.cu", "gemv.cu", "gemv_rows.cu", "sampling.cu"} <= files


def test_package_ships_no_benchmark_code_and_short_modules():
    """The wheel holds the ops and the compiler: benchmarks and sweeps live in benchmarks/, the
    representative builds in tests/; no Python module of the package is over 400 lines."""
    root = compiler.KERNEL_DIR.parent
    modules = {p.relative_to(root).as_posix(): p for p in root.rglob("*.py")}
    assert {"__init__.py", "compiler.py", "ops/__init__.py", "ops/common.py", "ops/tuning.py"} <= set(modules)
    assert not {"bench.py", "variants.py", "ops.py"} & set(modules)
    too_long = {name: n for name, p in modules.items() if (n := len(p.read_text().splitlines())) > 400}
    assert not too_long, too_long
