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

from gguf import TokenType
from tokenizers import Tokenizer, decoders, models, normalizers

from .gguf_reader import GGUFImportError, GGUFMetadata

SPACE = "\u2581"  # "▁", SentencePiece's visible space
# GGUF token types (llama.cpp's llama_token_type) that never join a merge.
_NOT_JOINED = (TokenType.UNKNOWN, TokenType.CONTROL, TokenType.UNUSED, TokenType.BYTE)


def sentencepiece_merges(vocab: dict[str, int], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's highest-score-first merging (module docstring).
    vocab: piece -> id, in id order."""
    joinable = [ty not in _NOT_JOINED for ty in types]
    ranked = []
    for piece, i in vocab.items():
        if not joinable[i] or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            a, b = vocab.get(left), vocab.get(right)
            if a is not None and b is not None and joinable[a] and joinable[b]:
                ranked.append((-scores[i], i, a, (left, right)))
    ranked.sort()
    return [pair for *_, pair in ranked]


def sentencepiece_tokenizer(meta: GGUFMetadata, vocab: dict[str, int], types: list[int], unk: str | None) -> Tokenizer:
    """The BPE tokenizer of a GGUF SentencePiece vocabulary (piece -> id, in id order; without
    added or special tokens)."""
    scores = list(meta.require("tokenizer.ggml.scores"))
    if len(scores) != len(vocab):
        raise GGUFImportError(f"{meta.path}: {len(vocab)} tokens but {len(scores)} scores")
    merges = sentencepiece_merges(vocab, [float(s) for s in scores], types)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    # Per piece of text between added tokens: a "▁" in front (if the file asks for it), spaces as "▁".
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.normalizer = normalizers.Sequence(([normalizers.Prepend(SPACE)] if prefix else []) + [normalizers.Replace(" ", SPACE)])
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else [])
    )
    return tok
