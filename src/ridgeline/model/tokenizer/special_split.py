"""Cut special-token text out of a prompt before the subword tokenizer sees it, in llama.cpp's order."""


def split_on_special(text: str, specials: list[tuple[str, int]]) -> list[str | int]:
    """Raw-text pieces and token ids, in order. `specials` is (text, id), longest text first.

    As llama.cpp does it: each special token in turn is cut out of every raw piece left so far, left to
    right without overlaps, so a longer token wins over a shorter one wherever they compete.
    """
    parts: list[str | int] = [text] if text else []
    for piece, token_id in specials:
        if piece not in text:  # cheap pre-check: most of a big vocabulary's specials never occur
            continue
        split: list[str | int] = []
        for part in parts:
            if isinstance(part, int) or piece not in part:
                split.append(part)
                continue
            for index, chunk in enumerate(part.split(piece)):
                if index:
                    split.append(token_id)
                if chunk:
                    split.append(chunk)
        parts = split
    return parts
