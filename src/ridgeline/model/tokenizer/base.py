"""The tokenizer interface the engine uses, with the parts every vocabulary shares: BOS, decoding, chat templates."""

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from ridgeline.model.tokenizer.chat_template import GEMMA_TEMPLATE, render_chat_template
from ridgeline.model.tokenizer.valid_text import check_text

# Tokens that end a turn although the file may not call them EOS; llama.cpp stops on these by their text too.
END_OF_GENERATION_TEXTS = (
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
)


def end_of_generation_ids(declared: Iterable[int | None], token_id: Callable[[str], int | None]) -> frozenset[int]:
    """The declared EOS/EOT ids plus every known end-of-turn token the vocabulary has."""
    found = (token_id(text) for text in END_OF_GENERATION_TEXTS)
    return frozenset(i for i in (*declared, *found) if i is not None)


class Tokenizer(ABC):
    """Text <-> token ids for one model. Subclasses say how raw text is split and what bytes each token stands for."""

    def __init__(
        self,
        *,
        vocab_size: int,
        bos_id: int | None,
        eos_id: int | None,
        eos_ids: frozenset[int],
        add_bos: bool,
        chat_template: str | None,
        strip_leading_space: bool = False,
        split_special_tokens: bool = False,
    ) -> None:
        self.vocab_size = vocab_size
        self.bos_id = bos_id
        self.eos_id = eos_id  # the one EOS the chat template calls eos_token
        self.eos_ids = eos_ids  # every token that ends generation
        self.add_bos = add_bos and bos_id is not None
        self.chat_template = chat_template  # the file's own; None when it has none
        # Vocabularies that prepend a space when encoding drop it again when decoding from the start.
        self.strip_leading_space = strip_leading_space
        # Whether special-token text in a prompt ("<bos>", "<start_of_turn>") stays plain text by default. False, as
        # in Hugging Face tokenizers, vLLM and llama.cpp (parse_special): such text becomes the special token.
        # True only where the tokenizer files ask for it (tokenizer_config.json's split_special_tokens).
        self.split_special_tokens = split_special_tokens

    @abstractmethod
    def encode_text(self, text: str, special: bool) -> list[int]:
        """Token ids of text, without BOS; special=True parses control-token text such as <start_of_turn>."""

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (a byte-fallback token is one byte, possibly part of a UTF-8 character)."""

    @abstractmethod
    def is_special(self, token_id: int) -> bool:
        """True for control tokens (BOS, <end_of_turn>, ...) that decode(skip_special=True) leaves out."""

    def encode(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        ids = self.encode_text(check_text(text), special)
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        data = b"".join(self.token_bytes(i) for i in ids if not (skip_special and self.is_special(i)))
        text = data.decode("utf-8", errors="replace")
        return text[1:] if self.strip_leading_space and text.startswith(" ") else text

    @property
    def effective_chat_template(self) -> str:
        """The template chat requests are rendered with: the file's own, else the built-in Gemma one."""
        return self.chat_template or GEMMA_TEMPLATE

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        """The chat prompt as text, to be encoded with special=True (encode adds the BOS, so the text has none).
        `tools` reach templates that have a tool section (ridgeline.tool_calls presents them to those without)."""
        bos_token = self.token_text(self.bos_id)
        text = render_chat_template(
            self.effective_chat_template,
            messages,
            bos_token=bos_token,
            eos_token=self.token_text(self.eos_id),
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )
        if self.add_bos and bos_token and text.startswith(bos_token):
            text = text[len(bos_token) :]  # templates write the BOS too; two would confuse the model
        return text

    def token_text(self, token_id: int | None) -> str:
        """A token as text (a special token's own text, e.g. <eos>); empty for None."""
        return "" if token_id is None else self.token_bytes(token_id).decode("utf-8", errors="replace")
