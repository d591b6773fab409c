"""Run the quantised-weight kernels (csrc/quant_kernels.cpp) on a CPU without AVX-512, for correctness only.

The compiled kernels need AVX-512 VNNI; where it is missing `compiled()` is None and tests skip them. This builds
quant_kernels.cpp with SIMDe (`apt-get install libsimde-dev`) emulating the AVX-512 intrinsics, plus scalar
stand-ins for the few SIMDe 0.7 lacks (include/immintrin.h), and hands it to the tests as `compiled()`:

    PYTHONPATH=src:scripts/emulated_kernels pytest -p emulated_kernels tests/test_kernels.py tests/test_quantized_linear.py

Emulated intrinsics are slow (a build takes minutes, run it under the CPU lock) and say nothing about speed.
"""

import functools
from pathlib import Path

from torch.utils.cpp_extension import load

HERE = Path(__file__).resolve().parent
BUILD = Path.home() / ".cache" / "ridgeline" / "emulated_kernels"
BUILD.mkdir(parents=True, exist_ok=True)
module = load(name="ridgeline_emulated_kernels", sources=[str(HERE / "harness.cpp")], extra_include_paths=[str(HERE / "include")],
              extra_cflags=["-O1", "-ffp-contract=off", "-fopenmp", "-w"], extra_ldflags=["-fopenmp"],
              build_directory=str(BUILD), verbose=False)

import ridgeline.model.native as native  # noqa: E402  (after the build: kernels.py binds compiled() on import)

native.compiled = functools.cache(lambda: module)
native.missing_cpu_flags = lambda: []  # tests/compiled_kernels.py skips on the CPU's flags: these stand in for them
