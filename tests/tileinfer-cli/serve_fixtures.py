"""Fixtures shared by the tests of a served tiny random model (each module brings its own
``folder`` and ``server``): the official openai client and an httpx client on that server, and
the same random weights offline (float32, ref) to compare its answers with."""

import httpx
import openai
import pytest
import torch

from tileinfer import load_config, load_tokenizer
from tileinfer.model.random_weights import random_model

MAX_LEN = 512  # the tiny config's max_position_embeddings
TIMEOUT = 120


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=TIMEOUT,
                         max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def offline(folder):
    model = random_model(load_config(folder), dtype=torch.float32, backend="ref", device="cpu",
                         max_len=MAX_LEN, seed=0)
    return model, load_tokenizer(folder)
