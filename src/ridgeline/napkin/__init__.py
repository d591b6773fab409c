"""The napkin model: rooflines, the hardware catalogue, model shapes and advice, as plain arithmetic.

It reads figures it is given (catalogued machines, built-in model specs, a ModelShape) and never imports the
engine, the server or the model runtime (tests/test_layering.py checks), so it runs anywhere, without torch.
"""
