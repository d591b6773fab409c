"""Random-weight GGUF files of catalogued model shapes (`ridgeline synth`): to measure a model's speed and memory
before downloading it. plan.py names the tensors and their types, blocks.py makes their bytes, tokenizer.py
fits a bundled tokenizer to the shape's vocabulary, writer.py writes the file tensor by tensor."""
