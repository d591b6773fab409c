"""`ridgeline quantize`: a GGUF file requantised to one format, to serve one model as several tiers.

Every 2-D weight matrix is dequantised to f32 and quantised again with gguf's own quantisers (Q4_K and Q6_K,
which gguf cannot write, by kquants.py, checked against gguf's dequantisers); what must stay
precise stays as stored: 1-D tensors (norms, biases, RoPE factors) and any matrix whose rows do not split into
the format's blocks. All metadata is copied, with general.file_type updated.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants
from gguf.constants import GGML_QUANT_SIZES

from ridgeline.errors import RidgelineError
from ridgeline.model.quant.kquants import quantize_q4_k, quantize_q6_k

FORMATS = {
    "q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (GGMLQuantizationType.Q4_1, LlamaFileType.MOSTLY_Q4_1),
    "q5_0": (GGMLQuantizationType.Q5_0, LlamaFileType.MOSTLY_Q5_0),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q4_k": (GGMLQuantizationType.Q4_K, LlamaFileType.MOSTLY_Q4_K_M),
    "q6_k": (GGMLQuantizationType.Q6_K, LlamaFileType.MOSTLY_Q6_K),
}
OWN_QUANTISERS = {GGMLQuantizationType.Q4_K: quantize_q4_k, GGMLQuantizationType.Q6_K: quantize_q6_k}
HEADER_FIELDS = ("GGUF.", "general.architecture")  # the writer writes these itself


@dataclass(frozen=True)
class QuantizeReport:
    path: Path
    qtype: str
    bytes_before: int
    bytes_after: int
    tensors_requantized: int
    tensors_kept: list[str]  # kept as stored, and why


def _metadata(reader: GGUFReader, writer: GGUFWriter, file_type: LlamaFileType) -> None:
    for name, field in reader.fields.items():
        if name.startswith(HEADER_FIELDS) or name == "general.file_type":
            continue
        main = field.types[0]
        sub = field.types[-1] if main == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main, sub_type=sub)
    writer.add_file_type(int(file_type))


def quantize_gguf(source: str | Path, destination: str | Path, fmt: str) -> QuantizeReport:
    if fmt not in FORMATS:
        raise RidgelineError(f"unknown quantisation type {fmt!r} (choose from {', '.join(FORMATS)})")
    qtype, file_type = FORMATS[fmt]
    source, destination = Path(source), Path(destination)
    if not source.is_file():
        raise RidgelineError(f"no such GGUF file: {source}")
    if source.resolve() == destination.resolve():
        raise RidgelineError("the output must be a different file from the input")
    reader = GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(destination, architecture)
    _metadata(reader, writer, file_type)
    block = GGML_QUANT_SIZES[qtype][0]
    done, kept = 0, []
    for tensor in reader.tensors:
        shape = [int(n) for n in reversed(tensor.shape.tolist())]  # rows first, as numpy holds them
        if len(shape) < 2 or shape[-1] % block:
            kept.append(f"{tensor.name} ({'1-D' if len(shape) < 2 else f'rows of {shape[-1]} not in blocks of {block}'})")
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
            continue
        weights = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        packed = OWN_QUANTISERS[qtype](weights) if qtype in OWN_QUANTISERS else quants.quantize(weights, qtype)
        writer.add_tensor(tensor.name, packed, raw_shape=packed.shape, raw_dtype=qtype)
        done += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return QuantizeReport(destination, fmt, source.stat().st_size, destination.stat().st_size, done, kept)

