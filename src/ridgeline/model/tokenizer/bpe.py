"""GPT-2-style byte-level BPE from GGUF metadata (`tokenizer.ggml.model = gpt2`, as in Llama 3 and Qwen2).

The file stores the byte-level vocabulary and merges; which regex splits text into words first is only
named (`tokenizer.ggml.pre`), so the patterns llama.cpp uses for those names are kept here.
"""

from gguf import TokenType
from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE
from tokenizers.pre_tokenizers import ByteLevel, PreTokenizer, Sequence, Split

from ridgeline.errors import UnsupportedError

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")  # the same, but every digit on its own

# Name in `tokenizer.ggml.pre` -> the regexes applied one after another (matches and the gaps between
# them both become words), and whether a word that is itself a token skips the merges (Llama 3 does).
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "gpt2": ((_GPT2,), False),
    "llama-bpe": ((_LLAMA3,), True),
    "llama3": ((_LLAMA3,), True),
    "qwen2": ((_QWEN2,), False),
    "deepseek-r1-qwen": ((_QWEN2,), False),
    # SmolLM (and StarCoder, Refact, Command R): every digit apart, then GPT-2's words without its last `\s+`.
    "smollm": ((r"\p{N}", _GPT2.removesuffix(r"|\s+")), False),
    # llama.cpp's choice when a file names none: punctuation runs and digit triples split apart.
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False),
}


def byte_level_bpe(tokens: list[str], merges: list[str], types: list[int], pre: str) -> BackendTokenizer:
    """A `tokenizers` BPE with the named pre-tokenizer; control tokens become special added tokens."""
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedError(
            f"unsupported BPE pre-tokenizer {pre!r} (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    patterns, ignore_merges = PRE_TOKENIZERS[pre]
    model = BPE(
        vocab={token: token_id for token_id, token in enumerate(tokens)},
        merges=[tuple(merge.split(" ", 1)) for merge in merges],
        ignore_merges=ignore_merges,
    )
    backend = BackendTokenizer(model)
    splits: list[PreTokenizer] = [Split(Regex(pattern), behavior="isolated") for pattern in patterns]
    backend.pre_tokenizer = Sequence([*splits, ByteLevel(add_prefix_space=False, use_regex=False)])
    # User-defined tokens are matched as whole words always, control tokens only when special text is parsed.
    backend.add_tokens(_added(tokens, types, TokenType.USER_DEFINED, special=False))
    backend.add_special_tokens(_added(tokens, types, TokenType.CONTROL, special=True))
    return backend


def _added(tokens: list[str], types: list[int], kind: TokenType, special: bool) -> list[AddedToken]:
    return [
        AddedToken(token, special=special, normalized=False)
        for token, token_type in zip(tokens, types)
        if token_type == kind
    ]
