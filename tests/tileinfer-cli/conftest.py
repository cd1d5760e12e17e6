"""A tiny random Llama imported as ``tiny`` into a TileInfer home of its own, for CLI tests that
need a model that loads in a blink (its answers are noise)."""

import pytest

from cli_helpers import gguf_helpers


@pytest.fixture(scope="session")
def tiny_gguf_file(tmp_path_factory):
    helpers = gguf_helpers()
    return helpers.write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", helpers.tiny_llama())


@pytest.fixture
def tiny_home(tmp_path, tiny_gguf_file):
    """{"TILEINFER_HOME": ...} of a fresh home holding the tiny model as ``tiny``."""
    from tileinfer.io.gguf_import import import_gguf

    home = tmp_path / "home"
    import_gguf(tiny_gguf_file, home / "models" / "tiny")
    return {"TILEINFER_HOME": str(home)}
