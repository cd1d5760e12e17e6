"""Token log-probabilities in the two OpenAI shapes.

The engine reports, per generated token, ``(token id, its log-probability, [(id, logprob), ...]
the k most likely)`` from the step's raw logits (the model's distribution, before temperature,
top-k and top-p). A token's text is its own decoded bytes; a token holding part of a multi-byte
character shows U+FFFD there, and ``bytes`` gives its exact bytes (chat shape).
"""

from __future__ import annotations


class TokenTexts:
    """Each token id's (text, bytes), decoded once."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        found = self._cache.get(token)
        if found is None:
            try:
                raw = self.tokenizer.decode_bytes([token])
            except ValueError:  # beyond the tokenizer's vocabulary
                raw = b""
            found = self._cache[token] = (raw.decode("utf-8", errors="replace"), list(raw))
        return found


def chat_entries(texts: TokenTexts, items) -> list[dict]:
    """The ``logprobs.content`` list of a chat choice for items (token, logprob, tops)."""
    out = []
    for token, logprob, tops in items:
        text, raw = texts(token)
        out.append({"token": text, "logprob": logprob, "bytes": raw,
                    "top_logprobs": [{"token": texts(t)[0], "logprob": lp, "bytes": texts(t)[1]}
                                     for t, lp in tops]})
    return out


def completion_logprobs(texts: TokenTexts, items, offset: int = 0) -> dict:
    """The legacy completions ``logprobs`` object; text_offset counts from offset (the length of
    the text before these tokens). An echoed prompt's first token has logprob and tops None:
    null in both lists."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for token, logprob, tops in items:
        text = texts(token)[0]
        tokens.append(text)
        token_logprobs.append(logprob)
        top.append(None if tops is None else {texts(t)[0]: lp for t, lp in tops})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets}
