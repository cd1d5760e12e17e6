"""tokenizer.json and generation_config.json contents from a GGUF file's metadata: the byte-level
BPE vocabulary and merges, or the SentencePiece vocabulary (``gguf_sentencepiece``), and the token
types, rebuilt with ``tokenizers``."""

from __future__ import annotations

from gguf import TokenType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from .gguf_reader import GGUFImportError, GGUFMetadata
from .gguf_sentencepiece import sentencepiece_tokenizer

# Pre-tokenizers of byte-level BPE vocabularies, by tokenizer.ggml.pre (the names llama.cpp gives
# them in llama-vocab.cpp), written the way those models' own tokenizer.json files write them.
_GPT2 = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
# SmolLM, StarCoder: every digit on its own, then the GPT-2 split.
_DIGITS_THEN_GPT2 = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _GPT2])
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = pre_tokenizers.Sequence(
    [
        pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ]
)
# Qwen2 and Qwen2.5: Llama 3's split, but every digit on its own.
_QWEN2_PATTERN = _LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
_QWEN2 = pre_tokenizers.Sequence(
    [
        pre_tokenizers.Split(Regex(_QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ]
)
# name -> (pre-tokenizer, BPE ignore_merges as llama.cpp sets it for that name)
_PRE_TOKENIZERS = {
    "gpt-2": (_GPT2, False),
    "gpt2": (_GPT2, False),
    "smollm": (_DIGITS_THEN_GPT2, False),
    "starcoder": (_DIGITS_THEN_GPT2, False),
    "llama-bpe": (_LLAMA3, True),
    "llama3": (_LLAMA3, True),
    "qwen2": (_QWEN2, False),
}

# GGUF token types (llama.cpp's llama_token_type) of the tokens matched whole in the text.
_ADDED = (TokenType.UNKNOWN, TokenType.CONTROL, TokenType.USER_DEFINED)


def _byte_level_tokenizer(meta: GGUFMetadata, vocab: dict, unk: str | None) -> Tokenizer:
    """The byte-level BPE tokenizer of a "gpt2" vocabulary, split by tokenizer.ggml.pre's rules."""
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFImportError(
            f"{meta.path}: pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    pre_tokenizer, ignore_merges = _PRE_TOKENIZERS[pre]
    merges = []
    for merge in meta.require("tokenizer.ggml.merges"):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise GGUFImportError(f"{meta.path}: malformed merge {merge!r}")
        merges.append(tuple(pair))
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    return tok


def _strips_whitespace_after(meta: GGUFMetadata):
    """Which added tokens take the whitespace after them along (rstrip): as llama.cpp decides it,
    by the model's name, Phi-3's special tokens but <unk>, <s> and <|endoftext|> (Phi-3's own
    tokenizer files mark the same ones); no token of any other model."""
    name = str(meta.get("general.name", "")).lower()
    if "phi-3" not in name and "phi3" not in name:
        return lambda token: False
    return lambda token: token not in ("<unk>", "<s>", "<|endoftext|>")


def build_tokenizer(meta: GGUFMetadata) -> tuple[Tokenizer, dict]:
    """tokenizer.json content from the GGUF vocabulary, and the special token strings."""
    kind = meta.require("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise GGUFImportError(
            f"{meta.path}: tokenizer model {kind!r} is not supported (byte-level BPE, 'gpt2', and "
            "SentencePiece, 'llama', are)"
        )
    tokens = list(meta.require("tokenizer.ggml.tokens"))
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    if len(types) != len(tokens):
        raise GGUFImportError(f"{meta.path}: {len(tokens)} tokens but {len(types)} token types")

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if i is None:
            return None
        if not 0 <= int(i) < len(tokens):
            raise GGUFImportError(f"{meta.path}: tokenizer.ggml.{key}_token_id {i} is outside the vocabulary")
        return tokens[int(i)]

    named = {"bos_token": token("bos"), "eos_token": token("eos"), "unk_token": token("unknown"), "pad_token": token("padding")}
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFImportError(f"{meta.path}: the vocabulary repeats tokens")
    if kind == "llama":
        tok = sentencepiece_tokenizer(meta, vocab, types, named["unk_token"])
    else:
        tok = _byte_level_tokenizer(meta, vocab, named["unk_token"])
    # Control and unknown tokens are special (skipped by skip_special_tokens); user-defined ones
    # are plain added tokens. All match whole in the text before BPE runs, as in llama.cpp.
    strips = _strips_whitespace_after(meta)
    tok.add_tokens(
        [
            AddedToken(t, special=ty != TokenType.USER_DEFINED, normalized=False, rstrip=strips(t))
            for t, ty in zip(tokens, types)
            if ty in _ADDED
        ]
    )
    # llama.cpp adds BOS to a SentencePiece vocabulary's text unless the file says not to.
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    for flag, key in ((add_bos, "bos_token"), (add_eos, "eos_token")):
        if flag and named[key] is None:
            raise GGUFImportError(f"{meta.path}: the file asks to add a {key} but names none")
    if add_bos or add_eos:
        bos, eos = named["bos_token"], named["eos_token"]
        single = ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
        pair = single + ([f"{bos}:1"] if add_bos else []) + ["$B:1"] + ([f"{eos}:1"] if add_eos else [])
        specials = {t: vocab[t] for t, on in ((bos, add_bos), (eos, add_eos)) if on}
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(specials.items()))
    elif kind == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    flags = {"add_bos_token": add_bos, "add_eos_token": add_eos}
    return tok, {**{k: v for k, v in named.items() if v is not None}, **flags}


# Token texts that end a generation in llama.cpp whatever the file's eos id (from llama-vocab.cpp's
# list): chat models end a turn with one of them.
END_OF_GENERATION_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                           "<EOT>", "_<EOT>", "<|end_of_text|>")


def end_of_generation_ids(meta: GGUFMetadata, tokenizer: Tokenizer) -> list[int]:
    """The ids that end a generation, as llama.cpp takes them from a GGUF file: its eos, end of
    turn (eot) and end of message (eom) ids, and the tokens of END_OF_GENERATION_TEXTS."""
    ids = {meta.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")}
    ids |= {tokenizer.token_to_id(text) for text in END_OF_GENERATION_TEXTS}
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    return sorted(int(i) for i in ids if i is not None and 0 <= int(i) < size)


def generation_config_from(meta: GGUFMetadata, config: dict, stop_ids: list[int]) -> dict:
    """generation_config.json: the special ids, the tokens that end a generation
    (``end_of_generation_ids``) and the sampling settings some files carry."""
    out = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    if len(stop_ids) > 1 or (stop_ids and stop_ids[0] != out.get("eos_token_id")):
        out["eos_token_id"] = stop_ids if len(stop_ids) > 1 else stop_ids[0]
    # Sampling settings some GGUF files carry (general.sampling.*), in generation_config terms.
    temp = meta.get("general.sampling.temp")
    top_k = meta.get("general.sampling.top_k")
    top_p = meta.get("general.sampling.top_p")
    if temp is not None or top_k is not None or top_p is not None:
        out["do_sample"] = temp is None or float(temp) > 0
        if temp is not None:
            out["temperature"] = float(temp)
        if top_k is not None:
            out["top_k"] = int(top_k)
        if top_p is not None:
            out["top_p"] = float(top_p)
    return out
