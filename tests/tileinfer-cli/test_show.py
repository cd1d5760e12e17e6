"""``tileinfer show MODEL [--json]`` and ``tileinfer list --json``, against what the model's own
files say (the weights loaded with safetensors, the GGUF read with the gguf package)."""

import json
import shutil

import pytest

from cli_helpers import assert_one_line_error, tileinfer


def show(env, *args):
    result = tileinfer("show", *args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_show_json_matches_the_files(tiny_home, tiny_gguf_file):
    import gguf
    from safetensors.torch import load_file

    from tileinfer.io.chat_template import load_chat_template

    info = json.loads(show(tiny_home, "tiny", "--json"))
    folder = info["path"]
    weights = load_file(f"{folder}/model.safetensors")
    assert info["parameters"] == sum(t.numel() for t in weights.values())
    assert info["weights_dtypes"] == {"BF16": info["parameters"]}
    assert (info["architecture"], info["context_length"], info["dtype"]) == (
        "LlamaForCausalLM", 256, "bfloat16")
    assert info["kind"] == "imported" and info["quantization"] is None
    assert info["chat_template"] == load_chat_template(folder)
    reader = gguf.GGUFReader(tiny_gguf_file)
    assert info["gguf_source"]["tensor_types"] == {"F32": len(reader.tensors)}
    assert info["generation_defaults"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0,
                                           "min_p": 0.0, "repetition_penalty": 1.0,
                                           "stop_ids": [260, 262]}  # <|endoftext|>, <|im_end|>
    assert info["license"] is None


def test_show_text(tiny_home):
    out = show(tiny_home, "tiny")
    assert out.startswith("tiny  (imported)\n")
    assert "  context length   256\n" in out
    assert "  chat template    3 lines:\n    | {% for m in messages %}<|im_start|>" in out
    assert "  license          not stated in the model's files" in out


@pytest.mark.parametrize("files,expected", [
    ({"README.md": "---\nlanguage: en\nlicense: apache-2.0\n---\n# A model\n"}, "apache-2.0"),
    ({"LICENSE": "MIT License\n\nCopyright ..."}, "MIT License (LICENSE)"),
    ({"README.md": "---\nlicense: 'llama3.2'\n---\n", "LICENSE": "other"}, "llama3.2"),
])
def test_license_from_the_folders_files(tiny_home, tmp_path, files, expected):
    folder = tmp_path / "m"
    shutil.copytree(f"{tiny_home['TILEINFER_HOME']}/models/tiny", folder)
    for name, text in files.items():
        (folder / name).write_text(text)
    info = json.loads(show(tiny_home, str(folder), "--json"))
    assert info["license"] == expected and info["kind"] == "folder"


def test_license_from_the_gguf_file(smollm2_dir, tmp_path):
    home = {"TILEINFER_HOME": str(smollm2_dir.parent.parent)}
    info = json.loads(show(home, "--json"))
    assert info["license"] == "apache-2.0" and info["kind"] == "default, imported"
    # An import made before import.json kept the license: read from the GGUF file itself.
    folder = tmp_path / "older"
    shutil.copytree(smollm2_dir, folder, copy_function=shutil.copy)
    imported = json.loads((folder / "import.json").read_text())
    older = {k: imported[k] for k in ("source", "source_size", "importer_version")}
    (folder / "import.json").write_text(json.dumps(older))
    assert json.loads(show(home, str(folder), "--json"))["license"] == "apache-2.0"


def test_list_json(tiny_home):
    result = tileinfer("list", "--json", env={**tiny_home, "HF_HUB_CACHE": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["tiny"]["kind"] == "imported"
    assert rows["tiny"]["path"].endswith("/models/tiny") and rows["tiny"]["size_bytes"] > 0


def test_show_unknown_model_is_one_line(tiny_home):
    assert_one_line_error(tileinfer("show", "nosuchmodel", env=tiny_home),
                          "'nosuchmodel' is not a model folder, an imported model or a pulled")


def test_show_of_a_folder_that_is_not_a_model_is_one_line(tiny_home, tmp_path):
    # Before: "architecture None: None layers ... parameters 0" and exit status 0.
    (tmp_path / "notes").mkdir()
    assert_one_line_error(tileinfer("show", str(tmp_path / "notes"), env=tiny_home),
                          r"no config\.json in .*notes: not a model folder$")


def test_show_of_a_gguf_file_reads_it_without_importing(tiny_home, tiny_gguf_file, tmp_path):
    import gguf

    # Before: show converted the file into the models home without a word.
    home = {"TILEINFER_HOME": str(tmp_path / "fresh")}
    result = tileinfer("show", str(tiny_gguf_file), "--json", env=home)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert not (tmp_path / "fresh").exists()  # nothing imported, nothing written
    info = json.loads(result.stdout)
    assert info["kind"] == "a GGUF file, not imported: run, chat and import convert it"
    assert info["path"] == str(tiny_gguf_file.resolve())
    assert info["size_bytes"] == tiny_gguf_file.stat().st_size
    reader = gguf.GGUFReader(tiny_gguf_file)
    assert info["weights_dtypes"] == {"F32": sum(int(t.n_elements) for t in reader.tensors)}
    # The rest is what show says of the file's import.
    imported = json.loads(show(tiny_home, "tiny", "--json"))
    same = ("architecture", "model_type", "parameters", "layers", "hidden_size", "vocab_size",
            "context_length", "dtype", "quantization", "gguf_source", "chat_template",
            "generation_defaults", "license")
    assert {k: info[k] for k in same} == {k: imported[k] for k in same}
    text = show(home, str(tiny_gguf_file))
    assert "  dtype            bfloat16 once imported (weights in the file: F32 " in text
    assert "  quantization     none; a GGUF of F32 x" in text and "dequantized on import" in text


def test_show_of_an_imported_gguf_file_shows_its_import(tiny_gguf_file, tmp_path):
    home = {"TILEINFER_HOME": str(tmp_path / "home")}
    assert tileinfer("import", str(tiny_gguf_file), env=home).returncode == 0
    info = json.loads(show(home, str(tiny_gguf_file), "--json"))
    assert info["kind"] == "imported from a GGUF file"
    assert info["path"] == str(tmp_path / "home" / "models" / "tiny")


def test_show_of_a_file_that_is_not_gguf_is_one_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF but truncated")
    home = {"TILEINFER_HOME": str(tmp_path / "home")}
    assert_one_line_error(tileinfer("show", str(bad), env=home),
                          r"broken\.gguf is not a readable GGUF file")
    assert not (tmp_path / "home").exists()
