"""``POST /v1/embeddings``: OpenAI's embeddings, from the served model's final hidden states.

Each input (a text, or token ids; or a list of them) is run as a prompt of its own by the
engine (``hidden_state=True``: the prompt only, no token sampled), and its embedding is its last
token's final hidden state (after the final norm), L2-normalized: the last-token pooling of the
decoder embedding models (Qwen3-Embedding, gte-Qwen2, e5-mistral), which end their inputs with
the tokenizer's end token (a text is encoded with the tokenizer's special tokens, as
sentence-transformers encodes it). A query's instruction is the client's to write into the text
(Qwen3-Embedding's "Instruct: ...\\nQuery: ..."). ``dimensions`` keeps the first that many values
before the normalization (Matryoshka embeddings); ``encoding_format: "base64"`` (what the
``openai`` client asks for) sends the float32 values' little-endian bytes.

A chat model serves them too, but its hidden states were never trained to be compared: an
embedding model is what this endpoint is for.
"""

from __future__ import annotations

import base64
import struct
from typing import Literal

from pydantic import Field

from ..embedding import embedding
from .errors import bad_request
from .prepare import Plan, token_prompts
from .strict import Strict


class EmbeddingRequest(Strict):
    model: str | None = None
    input: str | list[int] | list[str] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=256)


def plan_embeddings(served, req: EmbeddingRequest) -> Plan:
    """Each input as a prompt that only runs (max_tokens 0) and reports its hidden state."""
    from tileinfer import SamplingParams

    if served.hidden_size and req.dimensions is not None and req.dimensions > served.hidden_size:
        raise bad_request(f"dimensions is {req.dimensions}; this model's embeddings have "
                          f"{served.hidden_size}", "dimensions")
    prompts = token_prompts(served, req.input, param="input")
    for i, ids in enumerate(prompts):
        if len(ids) > served.max_len:
            raise bad_request(f"input {i} has {len(ids)} tokens; this model's context is "
                              f"{served.max_len} tokens", "input", "context_length_exceeded")
    return Plan(prompts=prompts, max_tokens=[0] * len(prompts), sampling=SamplingParams(0.0),
                seed=None, stops=[], stop_ids=[], n=1, logprobs=None, stream=False,
                include_usage=False, hidden_state=True)


class EmbeddingsFormat:
    def __init__(self, model_name: str):
        self.model_name = model_name

    def response(self, job) -> dict:
        req, data = job.request, []
        for c in job.choices:
            values = embedding(c.hidden, req.dimensions)
            if req.encoding_format == "base64":
                packed = struct.pack(f"<{len(values)}f", *values)
                values = base64.b64encode(packed).decode("ascii")
            data.append({"object": "embedding", "index": c.index, "embedding": values})
        tokens = job.plan.prompt_tokens
        return {"object": "list", "data": data, "model": self.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
