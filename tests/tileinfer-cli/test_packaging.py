"""The distributions' metadata (issue 20): what each installs, its bounds, its license, README,
classifiers and extras. The install itself, from built wheels in a fresh virtual environment, is
checked by .ci/run."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
DISTS = ["tileinfer-core", "tileinfer-backend-ref", "tileinfer-backend-triton",
         "tileinfer-backend-cuda", "tileinfer-cli"]
OURS = set(DISTS)


def project(dist):
    return tomllib.loads((REPO / "packages" / dist / "pyproject.toml").read_text())["project"]


def requirements(dist, extra=None):
    p = project(dist)
    reqs = p["dependencies"] if extra is None else p["optional-dependencies"][extra]
    return {r.name.lower(): r for r in map(Requirement, reqs)}


@pytest.mark.parametrize("dist", ["tileinfer-backend-triton", "tileinfer-backend-cuda"])
def test_gpu_backends_bring_the_ref_backend(dist):
    # Before: `pip install tileinfer-core tileinfer-backend-triton` could not run a model: the
    # registry takes the ops a backend lacks from ref, which nothing installed.
    assert "tileinfer-backend-ref" in requirements(dist)


@pytest.mark.parametrize("dist", DISTS)
def test_our_distributions_pin_each_other_to_the_minor_series(dist):
    version = Version(project(dist)["version"])
    for name, req in requirements(dist).items():
        if name in OURS:
            assert version in req.specifier
            assert Version(f"{version.major}.{version.minor + 1}") not in req.specifier, req
    for extra in project(dist).get("optional-dependencies", {}):
        for name, req in requirements(dist, extra).items():
            if name in OURS:
                assert version in req.specifier
                assert Version(f"{version.major}.{version.minor + 1}") not in req.specifier, req


def test_triton_is_held_to_the_tested_minor_series():
    # Before: triton>=3.3 let pip take 3.9, under whose interpreter linear fails.
    spec = requirements("tileinfer-backend-triton")["triton"].specifier
    assert Version("3.6.0") in spec and Version("3.6.5") in spec
    assert Version("3.7.0") not in spec and Version("3.9.0") not in spec


@pytest.mark.parametrize("name", ["cuda-bindings", "nvidia-cuda-nvrtc"])
def test_cuda_libraries_are_held_to_the_tested_major(name):
    spec = requirements("tileinfer-backend-cuda")[name].specifier
    assert Version("13.0") in spec and Version("13.9") in spec and Version("14.0") not in spec


@pytest.mark.parametrize("dist", DISTS)
def test_every_distribution_has_license_readme_and_classifiers(dist):
    p = project(dist)
    folder = REPO / "packages" / dist
    assert p["license"] == "MIT" and p["license-files"] == ["LICENSE"]
    assert (folder / "LICENSE").read_text().startswith("MIT License")
    readme = (folder / p["readme"]).read_text()
    assert len(readme.splitlines()) > 10, f"{dist}'s README (its PyPI page) is nearly empty"
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in p["classifiers"])
    assert any(c.startswith("Topic ::") for c in p["classifiers"])


def test_cli_extras_bring_the_gpu_backends():
    assert "tileinfer-backend-triton" in requirements("tileinfer-cli", "triton")
    assert "tileinfer-backend-cuda" in requirements("tileinfer-cli", "cuda")


def test_example_backend_declares_its_entry_point():
    example = tomllib.loads((REPO / "examples" / "tileinfer-backend-example" /
                             "pyproject.toml").read_text())["project"]
    assert example["entry-points"]["tileinfer"] == {"example": "tileinfer_backend_example"}
