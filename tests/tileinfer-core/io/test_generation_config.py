"""generation_defaults against transformers' reading of the same generation_config.json."""

import json
import shutil

import pytest
from transformers import GenerationConfig

from tileinfer.backend.sampling import SamplingParams
from tileinfer.io.generation_config import generation_defaults


def transformers_reading(folder):
    """What transformers' generate would use: its GenerationConfig with its defaults filled in.
    Its repetition penalty applies whether it samples or not; min_p only when it samples."""
    config = GenerationConfig.from_pretrained(folder)
    defaults = GenerationConfig._get_default_generation_params()

    def value(name):
        v = getattr(config, name)
        return defaults[name] if v is None else v

    eos = config.eos_token_id
    if eos is None:  # no EOS in generation_config.json: the model config's (ours by design)
        eos = json.loads((folder / "config.json").read_text()).get("eos_token_id")
    stop = [] if eos is None else list(eos) if isinstance(eos, list) else [eos]
    penalty = config.repetition_penalty if config.repetition_penalty is not None else 1.0
    if not value("do_sample"):
        return SamplingParams(repetition_penalty=penalty), stop
    return SamplingParams(temperature=value("temperature"), top_k=value("top_k"), top_p=value("top_p"),
                          min_p=config.min_p or 0.0, repetition_penalty=penalty), stop


def make_folder(tmp_path, generation, config=None):
    (tmp_path / "config.json").write_text(json.dumps(config or {"model_type": "llama", "eos_token_id": 7}))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_llama32_authors_settings(shared_dir, tmp_path):
    src = shared_dir / "fixtures" / "models" / "Llama-3.2-1B-Instruct-resaved"
    for name in ("config.json", "generation_config.json"):
        shutil.copy(src / name, tmp_path / name)
    sampling, stop = generation_defaults(tmp_path)
    assert (sampling, stop) == transformers_reading(tmp_path)
    assert sampling == SamplingParams(temperature=0.6, top_k=50, top_p=0.9)  # top_k: transformers' default
    assert stop == [128001, 128008, 128009]


@pytest.mark.parametrize(
    "generation",
    [
        {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "eos_token_id": [5, 6]},
        {"do_sample": True},
        {"do_sample": True, "top_k": 0, "eos_token_id": 3},
        {"do_sample": False, "temperature": 0.6, "top_p": 0.9, "eos_token_id": 3},  # greedy despite the values
        {"temperature": 0.6, "eos_token_id": 3},  # do_sample unset: greedy
        {"bos_token_id": 1},  # no eos here: config.json's
        # Qwen2.5-0.5B-Instruct's
        {"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
         "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8, "top_k": 20},
        {"repetition_penalty": 1.05, "min_p": 0.1, "eos_token_id": 3},  # greedy: the penalty, not min_p
        {"do_sample": True, "min_p": 0.05, "repetition_penalty": None},
    ],
)
def test_matches_transformers(tmp_path, generation):
    folder = make_folder(tmp_path, generation)
    assert generation_defaults(folder) == transformers_reading(folder)


def test_without_generation_config_greedy_and_config_eos(shared_dir, tmp_path):
    src = shared_dir / "fixtures" / "models" / "Qwen3-0.6B" / "config.json"
    shutil.copy(src, tmp_path / "config.json")
    assert generation_defaults(tmp_path) == (SamplingParams(), [json.loads(src.read_text())["eos_token_id"]])


def test_config_argument_is_used_instead_of_config_json(tmp_path):
    folder = make_folder(tmp_path, None)

    class Config:
        eos_token_ids = (11, 12)

    assert generation_defaults(folder, Config()) == (SamplingParams(), [11, 12])
    assert generation_defaults(folder, {"eos_token_id": 4}) == (SamplingParams(), [4])


def test_imported_smollm2(smollm2_dir):
    # <|im_end|> (the file's eos) and <|endoftext|>, where llama.cpp ends a generation too
    assert generation_defaults(smollm2_dir) == (SamplingParams(), [0, 2])


@pytest.mark.parametrize(
    "generation, match",
    [
        ({"do_sample": True, "top_p": 0.0}, "top_p"),
        ({"do_sample": True, "temperature": -1}, "temperature"),
        ({"eos_token_id": "</s>"}, "eos_token_id"),
    ],
)
def test_bad_values_are_clear_errors(tmp_path, generation, match):
    folder = make_folder(tmp_path, generation)
    with pytest.raises(ValueError, match=match):
        generation_defaults(folder)


def test_malformed_json(tmp_path):
    make_folder(tmp_path, None)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="generation_config.json is not valid JSON"):
        generation_defaults(tmp_path)


def test_sampling_settings_are_the_values_set_whatever_do_sample(tmp_path):
    from tileinfer.io.generation_config import sampling_settings

    assert sampling_settings(tmp_path) == {}
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"do_sample": False, "temperature": 0.6, "top_k": 20.0,
                                "top_p": None, "eos_token_id": 2}))
    found = sampling_settings(tmp_path)
    assert found == {"temperature": 0.6, "top_k": 20} and isinstance(found["top_k"], int)
    for bad in ({"temperature": "hot"}, {"top_k": 2.5}, {"top_p": True}):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="generation_config.json"):
            sampling_settings(tmp_path)
