"""`ridgeline synth`: a random-weight GGUF of a catalogued shape loads in gguf's reader and in ridgeline with the
tensors, shapes and types its plan names (llama.cpp's names and Q4_K_M mix); the same options write the same
bytes; its random blocks dequantise centred, at the spread asked for; a forward pass gives finite logits; and
the borrowed tokenizer, padded or cut to the shape's vocabulary, still tokenizes as SmolLM2's does.

Files are cut to one layer and a 1,024-token vocabulary so that each test takes seconds; the layer itself is the
shape's full width (a Qwen2.5-1.5B layer is 1536 x 8960)."""

import hashlib
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from ridgeline.engine.assemble import assemble_model
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.model.attention_batch import ForwardChunk
from ridgeline.model.checkpoint import read_checkpoint
from ridgeline.model.synth.blocks import BLOCK_TYPES, random_rows
from ridgeline.model.synth.plan import uses_more_bits, tensor_plan, weights_choice
from ridgeline.model.synth.writer import SynthOptions, write_synth
from ridgeline.model.transformer import ModelOptions
from ridgeline.napkin.model_specs import model_spec

RIDGELINE = str(Path(sys.executable).parent / "ridgeline")
VOCAB = 1024
# One of each architecture the writer lays out, in the type each is usually run in
CASES = [("qwen2.5-1.5b", "q4_k_m"), ("llama-3.2-1b", "q8_0"), ("qwen3-8b", "q4_0"), ("qwen3-30b-a3b", "q4_k_m"),
         ("gpt-oss-20b", "mxfp4")]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: f"{case[0]}-{case[1]}")
def synth(request, tmp_path_factory):
    options = SynthOptions(*request.param, layers=1, vocab=VOCAB)
    return options, write_synth(tmp_path_factory.mktemp("synth") / options.file_name, options)


def test_gguf_reads_the_planned_tensors_with_their_shapes_and_types(synth):
    options, path = synth
    spec, choice, layers, vocab = options.resolved()
    plan = {t.name: t for t in tensor_plan(spec, choice, layers, vocab)}
    reader = gguf.GGUFReader(path)
    assert {t.name for t in reader.tensors} == set(plan)
    for tensor in reader.tensors:
        planned = plan[tensor.name]
        assert tuple(reversed(tensor.shape.tolist())) == planned.shape, tensor.name
        assert tensor.tensor_type == planned.qtype, tensor.name
    assert reader.fields["general.architecture"].contents() == spec.architecture
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == VOCAB
    assert reader.fields[f"{spec.architecture}.block_count"].contents() == 1


def test_ridgeline_loads_the_shape_and_a_forward_pass_gives_finite_logits(synth):
    options, path = synth
    spec = model_spec(options.shape)
    runner = assemble_model(path, ModelOptions(weights="quantized"), KVCacheConfig(block_size=16, dtype="bf16"),
                            num_blocks=2).runner
    config = runner.model.config
    assert (config.architecture, config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim) == (
        spec.architecture, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim)
    assert (config.num_layers, config.vocab_size, config.num_experts) == (1, VOCAB, spec.num_experts)
    prompt = [5, 17, 99, 3, 250, 42, 42, 7, 300, 11, 64, 128]
    logits = runner.run([ForwardChunk(prompt, 0, runner.kv_cache.group_tables([0, 1]), all_logits=True)])[0]
    assert logits.shape == (len(prompt), VOCAB)
    assert torch.isfinite(logits).all()
    # spread as planned (plan.LOGIT_STD = 3): a peaked softmax, neither a one-hot nor a flat one
    assert 1.0 < logits.std().item() < 10.0


def test_q4_k_m_gives_llama_cpps_more_bits_layers_q6_k():
    spec = model_spec("llama-3.1-8b")
    plan = {t.name: t.qtype for t in tensor_plan(spec, weights_choice("q4_k_m"), spec.num_layers, 1024)}
    more = [i for i in range(32) if uses_more_bits(i, 32)]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    for i in range(32):
        expected = T.Q6_K if i in more else T.Q4_K
        assert plan[f"blk.{i}.attn_v.weight"] == plan[f"blk.{i}.ffn_down.weight"] == expected
        assert plan[f"blk.{i}.attn_q.weight"] == plan[f"blk.{i}.ffn_gate.weight"] == T.Q4_K
    assert plan["output.weight"] == T.Q6_K and plan["token_embd.weight"] == T.Q4_K


def test_rows_no_k_quant_divides_fall_back_to_q8_0():
    spec = model_spec("gpt-oss-20b")  # 2880-wide rows: not a multiple of 256
    plan = {t.name: t.qtype for t in tensor_plan(spec, weights_choice("q4_k_m"), 1, 1024)}
    assert plan["blk.0.attn_q.weight"] == plan["blk.0.ffn_gate_exps.weight"] == T.Q8_0
    mxfp4 = {t.name: t.qtype for t in tensor_plan(spec, weights_choice("mxfp4"), 1, 1024)}
    assert mxfp4["blk.0.ffn_down_exps.weight"] == T.MXFP4 and mxfp4["blk.0.attn_q.weight"] == T.Q8_0


def test_same_options_write_the_same_bytes_and_another_seed_does_not(tmp_path):
    def digest(seed: int, name: str) -> str:
        path = write_synth(tmp_path / name, SynthOptions("qwen2.5-1.5b", "q4_k_m", layers=1, seed=seed, vocab=VOCAB))
        return hashlib.sha256(path.read_bytes()).hexdigest()

    first = digest(0, "a.gguf")
    assert digest(0, "b.gguf") == first
    assert digest(1, "c.gguf") != first


@pytest.mark.parametrize("qtype", [*BLOCK_TYPES, T.F16], ids=lambda t: t.name)
def test_random_blocks_dequantise_centred_at_the_spread_asked_for(qtype):
    std = 4096**-0.5
    rows = random_rows(qtype, 64, 4096, std, np.random.default_rng(7))
    weights = rows.astype(np.float32) if qtype == T.F16 else dequantize(rows, qtype)
    assert weights.shape == (64, 4096) and np.isfinite(weights).all()
    # MXFP4's scale is a power of two: within a factor of sqrt(2) of the target, the others within 5 %
    assert weights.std() == pytest.approx(std, rel=0.45 if qtype == T.MXFP4 else 0.05)
    assert abs(weights.mean()) < 0.02 * std  # centred: forty layers of uncancelled means would blow up


@pytest.mark.parametrize("vocab", [VOCAB, 60_000])  # cut below SmolLM2's 49,152 tokens, and padded above
def test_the_borrowed_tokenizer_tokenizes_as_smollm2s(tmp_path, vocab):
    options = SynthOptions("qwen2.5-1.5b", "q8_0", layers=1, vocab=vocab)
    synthetic = read_checkpoint(str(write_synth(tmp_path / "m.gguf", options))).load_tokenizer()
    smollm2 = read_checkpoint("smollm2").load_tokenizer()
    text = "The quick brown fox jumps over the lazy dog, 12345 times."
    ids = synthetic.encode(text, add_bos=False)
    assert all(0 <= i < vocab for i in ids)
    assert synthetic.decode(ids) == text
    if vocab > 49_152:
        assert ids == smollm2.encode(text, add_bos=False)
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    kept = set(tokens)
    for merge in reader.fields["tokenizer.ggml.merges"].contents():
        left, right = merge.split(" ")
        assert left in kept and right in kept and left + right in kept
    if vocab > 49_152:
        assert tokens[-1] == f"[PAD{vocab - 1}]"


@pytest.mark.parametrize(("args", "fragment"), [
    (["--shape", "llama-9000"], "unknown shape 'llama-9000'"),
    (["--shape", "llama-3.2-1b", "--weights", "q3_xyz"], "unknown weights type 'q3_xyz'"),
    (["--shape", "llama-3.2-1b", "--weights", "mxfp4"], "has none"),
    (["--shape", "llama-3.2-1b", "--layers", "17"], "between 1 and 16"),
    (["--shape", "gemma-3-270m"], "cannot write the gemma3 architecture"),
])
def test_bad_options_are_one_line_errors(tmp_path, args, fragment):
    result = subprocess.run([RIDGELINE, "synth", *args, "--output", str(tmp_path / "x.gguf")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], result.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_the_command_writes_the_file_it_names(tmp_path):
    out = tmp_path / "m.gguf"
    result = subprocess.run([RIDGELINE, "synth", "--shape", "llama-3.2-1b", "--weights", "q4_0", "--layers", "1",
                             "--vocab", str(VOCAB), "--output", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout
    reader = gguf.GGUFReader(out)
    assert {t.tensor_type for t in reader.tensors if t.name == "blk.0.attn_q.weight"} == {T.Q4_0}


def test_bench_latency_measures_a_shape_from_a_file_it_writes_once(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from ridgeline.cli import register_commands
    from ridgeline.cli.app import app
    from ridgeline.model.synth import writer

    monkeypatch.setattr(writer, "cache_dir", lambda: tmp_path)
    register_commands(["bench", "latency"])
    args = ["bench", "latency", "--shape", "qwen2.5-1.5b", "--weights", "q4_k_m", "--layers", "1", "-p", "8", "-n", "2",
            "-r", "1", "--threads", "2", "--json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    (written,) = tmp_path.glob("*.gguf")
    assert written.name == "synth-qwen2.5-1.5b-l1-seed0.Q4_K_M.gguf"
    (result,) = json.loads(first.stdout[first.stdout.index("["):])
    assert result["weights"] == "quantized" and result["tg_tok_s"]["mean"] > 0 and result["pp_tok_s"]["mean"] > 0
    modified = written.stat().st_mtime_ns
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert written.stat().st_mtime_ns == modified  # the same shape, type and seed: the file is reused
    clash = CliRunner().invoke(app, ["bench", "latency", "--shape", "qwen2.5-1.5b", "--model", "smollm2"])
    assert clash.exit_code != 0 and "two models" in str(clash.exception)


def test_writing_holds_a_chunk_not_the_model(tmp_path):
    """Six layers of Llama-3.2-1B in Q8_0 (0.66 GB, a 0.28 GB embedding) written by a fresh process whose peak RSS
    grows by a few chunks (writer.CHUNK_BYTES = 32 MB), not by the file's size."""
    script = f"""
import resource
from ridgeline.model.synth.writer import SynthOptions, write_synth
from ridgeline.model.synth.tokenizer import tokenizer_fields
from ridgeline.model.synth.blocks import unit_std
from gguf import GGMLQuantizationType as T
tokenizer_fields(128256), unit_std(T.Q8_0)  # imports, the borrowed tokenizer and the scale probe: not the model
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
write_synth({str(tmp_path / "m.gguf")!r}, SynthOptions("llama-3.2-1b", "q8_0", layers=6))
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    before, after = (int(v) * 1024 for v in done.stdout.split())
    size = (tmp_path / "m.gguf").stat().st_size
    assert size > 600e6
    assert after - before < 200e6, f"peak RSS grew {(after - before) / 1e6:.0f} MB writing {size / 1e6:.0f} MB"


def test_a_file_cut_to_fewer_layers_holds_the_whole_files_first_layers(tmp_path):
    spec = model_spec("llama-3.1-8b")  # 32 layers: layer 5 is not a "more bits" layer of the whole, layer 6 is
    whole = {t.name: t for t in tensor_plan(spec, weights_choice("q4_k_m"), spec.num_layers, VOCAB)}
    cut = {t.name: t for t in tensor_plan(spec, weights_choice("q4_k_m"), 7, VOCAB)}
    assert all(whole[name] == planned for name, planned in cut.items())
    assert cut["blk.5.ffn_down.weight"].qtype == T.Q4_K and cut["blk.6.ffn_down.weight"].qtype == T.Q6_K

    def layer_0(layers: int) -> dict[str, bytes]:
        path = write_synth(tmp_path / f"{layers}.gguf", SynthOptions("qwen2.5-1.5b", "q4_k_m", layers=layers, vocab=VOCAB))
        return {t.name: t.data.tobytes() for t in gguf.GGUFReader(path).tensors if t.name.startswith("blk.0.")}

    assert layer_0(1) == layer_0(2)
