"""`GET /tokenizer_info`: the served tokenizer's configuration, shaped as vLLM serves it (the keys of a Hugging
Face tokenizer_config.json, plus `tokenizer_class`), so that clients which tokenize through the server (lm-eval's
`tokenizer_backend=remote`) need no tokenizer files of their own. Tokens are given as text; their ids come from
`/tokenize`."""

from pydantic import BaseModel, ConfigDict

from ridgeline.model.tokenizer import Tokenizer


class TokenizerInfo(BaseModel):
    model_config = ConfigDict(extra="allow")  # as vLLM's: a tokenizer config may carry more keys

    tokenizer_class: str
    bos_token: str | None
    eos_token: str | None
    unk_token: str | None
    pad_token: str | None
    add_bos_token: bool
    add_eos_token: bool
    model_max_length: int
    chat_template: str


def tokenizer_info(tokenizer: Tokenizer, max_model_len: int) -> TokenizerInfo:
    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tokenizer.token_text(token_id)

    return TokenizerInfo(
        tokenizer_class=type(tokenizer).__name__,
        bos_token=text(tokenizer.bos_id),
        eos_token=text(tokenizer.eos_id),
        unk_token=text(getattr(tokenizer, "unknown_id", None)),
        pad_token=None,  # GGUF files may name one, but nothing here pads: clients pad themselves
        add_bos_token=tokenizer.add_bos,
        add_eos_token=False,
        model_max_length=max_model_len,
        chat_template=tokenizer.effective_chat_template,
    )
