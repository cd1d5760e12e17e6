"""A GGUF file's SentencePiece vocabulary (``tokenizer.ggml.model`` "llama": Llama 2, Mistral 7B,
TinyLlama, ...) as a ``tokenizers`` BPE tokenizer that splits text as llama.cpp does.

llama.cpp's SentencePiece tokenizer writes spaces as "▁", puts one "▁" before the text (and before
the text after each special token) when ``tokenizer.ggml.add_space_prefix`` is on, then merges the
adjacent pair whose joined piece is in the vocabulary with the highest score, again and again
(the leftmost pair among equal scores); characters outside the vocabulary become their UTF-8
bytes' ``<0xXX>`` tokens. A BPE model does the same when its merges are every split (left, right)
of every piece whose halves are both pieces, ranked by the joined piece's score (highest first;
the lower id first among equal scores), with byte fallback.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers

from .gguf_reader import GGUFImportError, GGUFMetadata

SPACE = "\u2581"  # "▁", SentencePiece's visible space
# GGUF token types (llama.cpp's llama_token_type) that never join a merge.
_UNKNOWN, _CONTROL, _UNUSED, _BYTE = 2, 3, 5, 6


def sentencepiece_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's highest-score-first merging (module docstring)."""
    ids = {t: i for i, t in enumerate(tokens)}
    joinable = [ty not in (_UNKNOWN, _CONTROL, _UNUSED, _BYTE) for ty in types]
    ranked = []
    for i, piece in enumerate(tokens):
        if not joinable[i] or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            a, b = ids.get(left), ids.get(right)
            if a is not None and b is not None and joinable[a] and joinable[b]:
                ranked.append((-scores[i], i, a, (left, right)))
    ranked.sort()
    return [pair for *_, pair in ranked]


def sentencepiece_tokenizer(meta: GGUFMetadata, tokens: list[str], types: list[int], unk: str | None) -> Tokenizer:
    """The BPE tokenizer of a GGUF SentencePiece vocabulary (without added or special tokens)."""
    scores = list(meta.require("tokenizer.ggml.scores"))
    if len(scores) != len(tokens):
        raise GGUFImportError(f"{meta.path}: {len(tokens)} tokens but {len(scores)} scores")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = sentencepiece_merges(tokens, [float(s) for s in scores], types)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    # Per piece of text between added tokens: a "▁" in front (if the file asks for it), spaces as "▁".
    steps = [normalizers.Replace(" ", SPACE)]
    if bool(meta.get("tokenizer.ggml.add_space_prefix", True)):
        steps.insert(0, normalizers.Prepend(SPACE))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if bool(meta.get("tokenizer.ggml.add_space_prefix", True)) else [])
    )
    return tok
