"""Which kernel path the suite tests here, and the rule for tests of the compiled one.

A CPU without the kernels' flags (AVX2, FMA and F16C at least) runs everything through torch: those tests skip.
A CPU with the flags must have the kernels: a failed build there fails the tests instead of skipping them
quietly, and the run's summary says which path was tested.
"""

import functools

import pytest

from ridgeline.model import native


def require_compiled():
    """The extension module, or a test failure saying why it is missing on a CPU that can run it."""
    module = native.compiled()
    if module is None:
        pytest.fail(f"compiled kernels failed to build on a CPU with {', '.join(native.REQUIRED_CPU_FLAGS)}: "
                    f"{native.build_error or 'no reason recorded'}", pytrace=False)
    return module


def needs_compiled(test):
    """Skip where the CPU lacks the flags; elsewhere run the test only once the kernels are built."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        require_compiled()
        return test(*args, **kwargs)

    missing = native.missing_cpu_flags()
    return pytest.mark.skipif(bool(missing), reason=f"this CPU lacks {', '.join(missing)}")(run)


def build_failed() -> bool:
    """Whether this run asked for the kernels on a CPU that has the flags and got none."""
    return not native.missing_cpu_flags() and native.compiled.cache_info().currsize > 0 and native.compiled() is None


def cpu_line() -> str:
    """The run's header: which path this CPU can test, known before anything is built."""
    missing = native.missing_cpu_flags()
    if missing:
        return f"compiled kernels: this CPU lacks {', '.join(missing)}; their tests skip and the torch path is tested"
    return (f"compiled kernels: this CPU builds them for {native.kernel_target().name}; they are built on first use and "
            "a failed build fails the run")


def kernel_paths_line() -> str:
    """One line on the kernel path this run tested (kernels are built on first use, so ask after the run)."""
    missing = native.missing_cpu_flags()
    if missing:
        return f"compiled kernels: not available (CPU lacks {', '.join(missing)}); the torch path was tested"
    if native.compiled.cache_info().currsize == 0:
        return "compiled kernels: not used by the tests that ran"
    if build_failed():
        return f"compiled kernels: BUILD FAILED on a CPU with the flags ({native.build_error}); the run fails"
    return f"compiled kernels: built ({native.kernel_target().name}) and tested, beside the torch path"
