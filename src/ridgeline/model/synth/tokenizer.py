"""A real tokenizer for a synthetic model, borrowed from the bundled SmolLM2-135M (byte-level BPE, 49,152 tokens)
and sized to the shape's vocabulary, so that prompts tokenize and outputs detokenize as in any served model.

Both ridgeline and llama.cpp take the vocabulary size from the embedding's rows and llama.cpp insists that the
token list is exactly that long, so the list is made to fit the shape rather than the other way round:
- a larger vocabulary (Llama 3's 128,256, Qwen's 151,936) is padded with `[PAD<id>]` tokens of type UNUSED, as
  Hugging Face's GGUF converter pads a model whose embedding outgrows its tokenizer. Nothing ever encodes to
  them; a random model may still sample one, which detokenizes to its name.
- a smaller one (Llama 2's 32,000; a test's cut vocabulary) keeps the first tokens and the merges that stay
  inside them, so every kept merge still names kept tokens.
"""

import functools
from dataclasses import dataclass

import gguf

from ridgeline.errors import RidgelineError

TOKENIZER_SOURCE = "smollm2"  # resolve_model_path's name for the bundled SmolLM2-135M-Instruct GGUF
MIN_VOCAB = 512  # the special tokens, the 256 byte tokens and some merges: below this the BPE has no alphabet


@dataclass(frozen=True)
class TokenizerField:
    key: str
    value: object
    vtype: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None


@functools.cache
def _borrowed() -> tuple[TokenizerField, ...]:
    from ridgeline.model.checkpoint import resolve_model_path

    reader = gguf.GGUFReader(resolve_model_path(TOKENIZER_SOURCE))
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            fields.append(TokenizerField(key, field.contents(), vtype,
                                         field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None))
    return tuple(fields)


def tokenizer_fields(vocab_size: int) -> list[TokenizerField]:
    """The borrowed tokenizer's GGUF metadata with exactly `vocab_size` tokens."""
    if vocab_size < MIN_VOCAB:
        raise RidgelineError(f"a vocabulary of {vocab_size} tokens is too small for the borrowed tokenizer "
                             f"(at least {MIN_VOCAB})")
    fields = {f.key: f for f in _borrowed()}
    tokens = list(fields["tokenizer.ggml.tokens"].value)
    types = list(fields["tokenizer.ggml.token_type"].value)
    merges = list(fields["tokenizer.ggml.merges"].value)
    if vocab_size >= len(tokens):
        extra = range(len(tokens), vocab_size)
        tokens += [f"[PAD{i}]" for i in extra]
        types += [int(gguf.TokenType.UNUSED)] * len(extra)
    else:
        tokens, types = tokens[:vocab_size], types[:vocab_size]
        kept = set(tokens)
        merges = [m for m in merges if "".join(m.split(" ")) in kept and all(p in kept for p in m.split(" "))]
    fields["tokenizer.ggml.tokens"] = _with(fields["tokenizer.ggml.tokens"], tokens)
    fields["tokenizer.ggml.token_type"] = _with(fields["tokenizer.ggml.token_type"], types)
    fields["tokenizer.ggml.merges"] = _with(fields["tokenizer.ggml.merges"], merges)
    for key, field in fields.items():  # special token ids must name tokens that exist
        if key.endswith("_token_id") and int(field.value) >= vocab_size:
            raise RidgelineError(f"{key} {field.value} is outside a vocabulary of {vocab_size}")
    return list(fields.values())


def _with(field: TokenizerField, value: list) -> TokenizerField:
    return TokenizerField(field.key, value, field.vtype, field.sub_type)
