"""The suite's rule for the compiled kernels: skip where the CPU lacks their flags, fail where it has them and
the build fails, and say which path was tested."""

import functools
import inspect

import pytest
import torch.utils.cpp_extension
from compiled_kernels import build_failed, kernel_paths_line, needs_compiled

from ridgeline.model import native


def skip_condition(test) -> bool:
    return any(mark.args[0] for mark in test.pytestmark if mark.name == "skipif")


@pytest.fixture
def failing_build(monkeypatch, tmp_path):
    """A CPU with every flag and a compiler that fails, through the real compiled() (on a fresh cache)."""
    def no_compiler(**kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(native, "_cpu_flags", lambda: set(native.REQUIRED_CPU_FLAGS))
    monkeypatch.setattr(native, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(native, "build_error", None)
    monkeypatch.setattr(native, "compiled", functools.cache(native.compiled.__wrapped__))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)


def test_a_failed_build_on_a_cpu_with_the_flags_fails_the_test(failing_build):
    ran = []

    @needs_compiled
    def test():
        ran.append(True)

    assert not skip_condition(test)
    with pytest.warns(UserWarning, match="could not be built"):
        with pytest.raises(pytest.fail.Exception, match="Ninja is required"):
            test()
    assert not ran
    assert build_failed()
    assert "BUILD FAILED" in kernel_paths_line() and "Ninja is required" in kernel_paths_line()


def test_a_cpu_without_the_flags_skips_and_says_so(monkeypatch):
    monkeypatch.setattr(native, "_cpu_flags", lambda: {"fma", "f16c"})

    @needs_compiled
    def test():
        pass
    assert skip_condition(test)
    assert not build_failed()
    assert "CPU lacks avx2" in kernel_paths_line() and "torch path was tested" in kernel_paths_line()


def test_parametrised_tests_keep_their_parameters_and_fixtures():
    @needs_compiled
    @pytest.mark.parametrize("rows", [1, 3])
    def test(rows, tmp_path):
        pass

    assert [mark.name for mark in test.pytestmark].count("parametrize") == 1
    assert list(inspect.signature(test).parameters) == ["rows", "tmp_path"]


def test_the_best_instruction_set_the_cpu_has_is_built(monkeypatch):
    monkeypatch.setattr(native, "_cpu_flags", lambda: set(native.AVX512_VNNI.cpu_flags) | set(native.AVX2.cpu_flags))
    assert native.kernel_target() is native.AVX512_VNNI
    monkeypatch.setattr(native, "_cpu_flags", lambda: {"avx2", "fma", "f16c", "avx512f"})  # AVX-512 without VNNI
    assert native.kernel_target() is native.AVX2
    monkeypatch.setattr(native, "_cpu_flags", lambda: {"sse4_2", "fma", "f16c"})
    assert native.kernel_target() is None


def test_a_lock_left_by_a_process_killed_while_loading_does_not_hang_the_next(monkeypatch, tmp_path):
    # torch's load() marks its build folder with a plain lock file and deletes it when done; a worker killed inside
    # load() leaves it behind, and torch's own wait for it has no end. The next process must clear it (under our
    # flock nobody else is inside load()) before it calls load(). This runs on a private cache with a stand-in for
    # torch's loader: going through the real loader rebuilds whenever the shared cache was built from another
    # checkout (its build.ninja names other source paths), minutes that say nothing about the lock.
    target = native.AVX2
    build_dir = tmp_path / "torch_extensions" / f"kernels_{target.name}"
    build_dir.mkdir(parents=True)
    (build_dir / "lock").touch()
    library = build_dir / f"ridgeline_kernels_{target.name}.so"
    calls = []

    def torch_load(**kwargs):
        # torch's FileBaton would wait on this file for ever; here a leftover is a failure
        assert not (build_dir / "lock").exists(), "load() was called with a stale lock in the build folder"
        calls.append(kwargs["build_directory"])
        library.write_bytes(b"")
        return type("Module", (), {"__file__": str(library)})

    monkeypatch.setattr(native, "_cpu_flags", lambda: set(target.cpu_flags))
    monkeypatch.setattr(native, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(native, "compiled", functools.cache(native.compiled.__wrapped__))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", torch_load)
    assert native.compiled() is not None
    assert calls == [str(build_dir)]
    # and the stamp of the finished build is written, so the next start imports it without torch's builder
    assert (build_dir / native.BUILT_FROM).read_text().split() == [native._build_digest(target), library.name]


@needs_compiled
def test_a_warm_start_imports_the_finished_build_without_torchs_builder():
    import subprocess
    import sys

    assert native.compiled() is not None  # the stamp is written by now
    code = ("import sys; from ridgeline.model import native; assert native.compiled() is not None; "
            "print('torch.utils.cpp_extension' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@needs_compiled
def test_a_stamp_from_other_sources_is_not_trusted(tmp_path, monkeypatch):
    target = native.kernel_target()
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    (build_dir / "kernels.so").write_bytes(b"not a library")
    (build_dir / native.BUILT_FROM).write_text("0" * 64 + " kernels.so\n")  # another digest
    assert native._load_finished_build(build_dir, target) is None
    (build_dir / native.BUILT_FROM).write_text(native._build_digest(target) + " kernels.so\n")
    assert native._load_finished_build(build_dir, target) is None  # the digest matches, the file is no library
