"""Tokenizers: GGUF vocabularies (SentencePiece-style and byte-level BPE) and tokenizer.json, one interface."""

from ridgeline.model.tokenizer.base import Tokenizer
from ridgeline.model.tokenizer.detokenizer import IncrementalDetokenizer
from ridgeline.model.tokenizer.from_gguf import tokenizer_from_gguf
from ridgeline.model.tokenizer.hf import tokenizer_from_hf_dir

__all__ = ["IncrementalDetokenizer", "Tokenizer", "tokenizer_from_gguf", "tokenizer_from_hf_dir"]
