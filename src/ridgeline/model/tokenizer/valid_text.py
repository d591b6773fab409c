"""Text a tokenizer can encode: valid Unicode, i.e. no unpaired UTF-16 surrogates.

JSON lets a client write "\\ud800" and Python's json module turns it into a str holding a lone surrogate, which
no UTF-8 encoder accepts (SentencePiece-style merging raises UnicodeEncodeError, `tokenizers` a TypeError).
We refuse such text by name rather than replace it with U+FFFD: a replacement would silently change the prompt
or stop string the client sent, and the client can fix its own encoding once told where the bad character is.
"""

from typing import Any

from ridgeline.errors import RidgelineError


class InvalidTextError(RidgelineError):
    """Text that is not valid Unicode (an unpaired surrogate), so it has no UTF-8 bytes to tokenize."""


def unpaired_surrogate(text: str) -> int | None:
    """Index of the first lone surrogate in text, or None when text encodes as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def describe_invalid(text: str, index: int) -> str:
    return f"holds an unpaired UTF-16 surrogate (U+{ord(text[index]):04X}) at character {index}; text must be valid Unicode"


def check_text(text: str, what: str = "text") -> str:
    """text unchanged, or InvalidTextError naming `what` and where the bad character is."""
    index = unpaired_surrogate(text)
    if index is not None:
        raise InvalidTextError(f"{what} {describe_invalid(text, index)}")
    return text


def first_invalid(value: Any, where: str = "") -> str | None:
    """Where the first string inside a JSON-like value (dict keys too) is not valid Unicode, as a sentence
    naming its position ("[2] holds ..."), or None. The bad text itself is never quoted: it cannot be encoded
    into a response either."""
    if isinstance(value, str):
        index = unpaired_surrogate(value)
        return None if index is None else f"{where + ' ' if where else ''}{describe_invalid(value, index)}"
    if isinstance(value, dict):
        for number, (key, item) in enumerate(value.items()):
            found = first_invalid(key, f"{where} key #{number}".lstrip()) or first_invalid(item, f"{where}[{ascii(key)}]")
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = first_invalid(item, f"{where}[{i}]")
            if found:
                return found
    return None
