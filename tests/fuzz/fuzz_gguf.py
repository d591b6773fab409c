#!/usr/bin/env python
"""Coverage-guided fuzzing (atheris/libFuzzer) of the GGUF path: file bytes -> header check -> gguf's reader ->
config -> tensor shapes -> tokenizer (built, then used to encode and decode).

    python tests/fuzz/fuzz_gguf.py [-runs=N | -max_total_time=S] [-seed=N] [EXTRA_CORPUS_DIR ...]

Every input must load, or end in ModelLoadError with a one-line message. Anything else (another exception,
a hang past -timeout, RSS past -rss_limit_mb) is a crash: libFuzzer stops and writes the input as
crash-<sha1> (or timeout-/oom-) under the printed work directory; keep it as a seed mutation in
seeds.CRASHER_GGUFS (the repository tracks no model files). Starts from small valid files (seeds.py) and the
crashers already found.
"""

import sys
import tempfile
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

with atheris.instrument_imports(include=["ridgeline", "gguf"]):
    from ridgeline.errors import ModelLoadError
    from ridgeline.model.checkpoint import read_checkpoint

from seeds import write_crasher_ggufs, write_seed_ggufs  # noqa: E402

WORK = Path(tempfile.mkdtemp(prefix="ridgeline-fuzz-gguf-"))
INPUT = WORK / "input.gguf"


def load(path: Path) -> None:
    """What ridgeline does with a model file before serving it, minus building the layers."""
    try:
        checkpoint = read_checkpoint(path)
        tokenizer = checkpoint.load_tokenizer()
        tokenizer.decode(range(-1, tokenizer.vocab_size + 1))
        tokenizer.encode("ab a <s></s>\u00e9", special=True)
    except ModelLoadError as error:
        if "\n" in str(error):
            raise AssertionError(f"ModelLoadError spans lines: {error!r}") from None


def test_one_input(data: bytes) -> None:
    # A new file each time: a memory map of the previous input must never see its file shrink under it.
    INPUT.unlink(missing_ok=True)
    INPUT.write_bytes(data)
    load(INPUT)


def main(argv: list[str]) -> None:
    options = [a for a in argv[1:] if a.startswith("-")]
    corpora = [a for a in argv[1:] if not a.startswith("-")]
    seeds = write_seed_ggufs(WORK / "seeds")[0].parent
    crashers = write_crasher_ggufs(WORK / "crashers")[0].parent
    corpus = WORK / "corpus"  # new inputs go here, not into the repository
    corpus.mkdir()
    defaults = ["-timeout=20", "-rss_limit_mb=4096", f"-artifact_prefix={WORK}/", "-print_final_stats=1"]
    print(f"fuzz_gguf: work directory {WORK}", file=sys.stderr)
    atheris.Setup([argv[0], *defaults, *options, str(corpus), str(seeds), str(crashers), *corpora], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
