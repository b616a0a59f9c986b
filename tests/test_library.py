"""The native library itself: loading, what it links and exports, the C ABI from C."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pyroundlib
from pyroundlib import _ffi

from conftest import PACKAGE_PARENT, subprocess_env

ROOT = Path(__file__).resolve().parent.parent
LIB = Path(pyroundlib.library_info()["path"])


def test_library_info():
    info = pyroundlib.library_info()
    assert Path(info["path"]).exists()
    assert info["abi_version"] == pyroundlib.ABI_VERSION == 15  # native/include/pyroundlib.h
    assert isinstance(info["cuda"], bool)
    if info["cuda"]:
        assert any(a.startswith("90") for a in info["cuda_architectures"])  # H100/H200
    assert pyroundlib.__version__


@pytest.mark.skipif(not os.environ.get("PYROUNDLIB_EXPECT_INSTALLED"), reason="make test-installed sets it")
def test_the_installed_package_is_under_test():
    """make test-installed: the tests import the installed pyroundlib, with its own library,
    not this source tree's."""
    package = Path(pyroundlib.__file__).resolve().parent
    assert package != ROOT / "pyroundlib" and "site-packages" in package.parts, package
    assert LIB.resolve().parent == package, LIB


def test_missing_library_names_the_path(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere" / "libpyroundlib.so"
    monkeypatch.setenv(_ffi.ENV_VAR, str(missing))
    with pytest.raises(pyroundlib.LibraryLoadError) as info:
        _ffi.load_library()
    message = str(info.value)
    assert str(missing) in message and "no such file" in message and "make" in message


def test_missing_library_in_a_fresh_process(tmp_path):
    env = subprocess_env(PYROUNDLIB_LIBRARY=str(tmp_path / "missing.so"))
    code = "import torch, pyroundlib; pyroundlib.round_ste(torch.ones(2))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "LibraryLoadError" in proc.stderr and str(tmp_path / "missing.so") in proc.stderr


@pytest.mark.parametrize("cut", [0, 16, 64, 4096, 65536, "half", "all but 1"])
def test_truncated_library(monkeypatch, tmp_path, cut):
    data = LIB.read_bytes()
    size = {"half": len(data) // 2, "all but 1": len(data) - 1}.get(cut, cut)
    bogus = tmp_path / "libpyroundlib.so"
    bogus.write_bytes(data[:size])  # dlopen() of such a file can die of SIGBUS: refused before
    monkeypatch.setenv(_ffi.ENV_VAR, str(bogus))
    with pytest.raises(pyroundlib.LibraryLoadError, match=str(bogus)):
        _ffi.load_library()


@pytest.mark.parametrize("content", [b"", b"not a library\n", b"\x7fELF" + b"\0" * 100, bytes(range(256)) * 64])
def test_not_a_library(monkeypatch, tmp_path, content):
    bogus = tmp_path / "libpyroundlib.so"
    bogus.write_bytes(content)
    monkeypatch.setenv(_ffi.ENV_VAR, str(bogus))
    with pytest.raises(pyroundlib.LibraryLoadError, match=str(bogus)):
        _ffi.load_library()


def test_a_directory_is_not_a_library(monkeypatch, tmp_path):
    monkeypatch.setenv(_ffi.ENV_VAR, str(tmp_path))
    with pytest.raises(pyroundlib.LibraryLoadError, match=str(tmp_path)):
        _ffi.load_library()


@pytest.fixture(scope="session")
def cpu_only_library(tmp_path_factory):
    """libpyroundlib built with -DPYROUNDLIB_WITH_CUDA=OFF (about 10 s)."""
    if shutil.which("cmake") is None:
        pytest.skip("needs cmake")
    build = tmp_path_factory.mktemp("cpu-only")
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DPYROUNDLIB_WITH_CUDA=OFF",
                    "-DPYROUNDLIB_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, capture_output=True)
    return build / _ffi.LIBRARY_FILE


def test_cpu_only_library_asked_for_cuda_work(cpu_only_library):
    lib = _ffi.Library(str(cpu_only_library))
    assert not lib.has_cuda and lib.cuda_architectures == []
    with pytest.raises(pyroundlib.CudaNotCompiledError, match="built without CUDA.*rebuild it"):
        lib.prl_round_cuda(None, None, 4, 0, 0, None)
    with pytest.raises(pyroundlib.CudaNotCompiledError, match="prl_lltm_backward_cuda"):
        lib.prl_lltm_backward_cuda(None, None, None, None, None, None, None, 1, 1, 0, 0, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_only_library_with_cuda_tensors(cpu_only_library):
    code = ("import torch, pyroundlib\n"
            "try:\n    pyroundlib.round_ste(torch.ones(3, device='cuda'))\n"
            "except pyroundlib.CudaNotCompiledError as e:\n    print('CLEAN:', e)\n")
    env = subprocess_env(PYROUNDLIB_LIBRARY=str(cpu_only_library))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=PACKAGE_PARENT)
    assert proc.returncode == 0, proc.stderr
    assert "CLEAN: PRL_ERROR_CUDA_NOT_COMPILED" in proc.stdout and "without CUDA" in proc.stdout


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_other_abi_version(monkeypatch, tmp_path):
    src = tmp_path / "fake.c"
    src.write_text("int prl_abi_version(void) { return 999; }\n")
    lib = tmp_path / "libfake.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    monkeypatch.setenv(_ffi.ENV_VAR, str(lib))
    with pytest.raises(pyroundlib.LibraryLoadError, match=f"ABI version 999.*needs ABI version {_ffi.ABI_VERSION}"):
        _ffi.load_library()


def test_status_becomes_exception_with_message():
    lib = _ffi.library()
    with pytest.raises(pyroundlib.InvalidArgumentError, match=r"PRL_ERROR_INVALID_ARGUMENT: prl_round_cpu: .*'x'"):
        lib.prl_round_cpu(None, None, 5, 0)
    with pytest.raises(pyroundlib.UnsupportedDtypeError, match="'dtype' is 17"):
        lib.prl_round_cpu(None, None, 0, 17)
    with pytest.raises(ValueError):  # the classes are also the built-in kinds
        lib.prl_round_cpu(None, None, -1, 0)


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_links_neither_libtorch_nor_libpython():
    out = subprocess.run(["ldd", str(LIB)], capture_output=True, text=True, check=True).stdout
    for forbidden in ("libtorch", "libc10", "libpython", "libcudart"):
        assert forbidden not in out, f"{LIB} links {forbidden}:\n{out}"


# The newest libstdc++ symbol versions manylinux_2_34 (the wheel's tag, Makefile WHEEL_PLAT) allows.
MANYLINUX_2_34_LIBSTDCXX = {"GLIBCXX": (3, 4, 29), "CXXABI": (1, 3, 13)}


@pytest.mark.skipif(shutil.which("objdump") is None or not sys.platform.startswith("linux"),
                    reason="needs objdump and an ELF library")
def test_libstdcxx_symbol_versions_fit_the_wheel_tag():
    """What `make wheel`'s auditwheel would refuse, caught by `make test`: the libstdc++
    functions the library's own code calls exist in manylinux_2_34 (GCC 12's libstdc++, for
    one, versions condition_variable::wait GLIBCXX_3.4.30).  glibc's versions are left to
    auditwheel: they follow the build host's headers (the static CUDA runtime built on
    glibc 2.39 calls arc4random@GLIBC_2.36), and the wheel is built on the CI host."""
    out = subprocess.run(["objdump", "-T", str(LIB)], capture_output=True, text=True, check=True).stdout
    seen = re.findall(r"\((GLIBCXX|CXXABI)_([0-9.]+)\)\s+(\S+)$", out, re.M)
    assert "(GLIBC_" in out, out  # the table was read (a build may link no libstdc++ dynamically at all)
    too_new = [f"{sym}@{lib}_{version}" for lib, version, sym in seen
               if tuple(int(v) for v in version.split(".")) > MANYLINUX_2_34_LIBSTDCXX[lib]]
    assert not too_new, f"{LIB} needs libstdc++ symbol versions newer than manylinux_2_34 allows: {too_new}"


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_exports_only_the_api():
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIB)], capture_output=True, text=True, check=True).stdout
    symbols = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    header = (ROOT / "native" / "include" / "pyroundlib.h").read_text()
    assert symbols, out
    for sym in symbols:
        assert sym.startswith("prl_"), f"{sym} is exported but is not part of the API"
        assert f"{sym}(" in header
    assert {row[0] for row in _ffi._SIGNATURES} == set(symbols)  # the table covers the whole ABI


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_c_program_uses_the_abi_without_python(tmp_path):
    exe = tmp_path / "abi_test"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", str(ROOT / "tests" / "c" / "abi_test.c"),
                    "-I", str(ROOT / "native" / "include"), str(LIB), f"-Wl,-rpath,{LIB.parent}", "-lm",
                    "-o", str(exe)], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "all checks passed" in proc.stdout


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_header_is_valid_cpp(tmp_path):
    src = tmp_path / "use.cpp"
    src.write_text('#include "pyroundlib.h"\nint main() { return prl_abi_version() == PRL_ABI_VERSION ? 0 : 1; }\n')
    subprocess.run(["c++", "-std=c++11", "-Wall", "-Werror", "-fsyntax-only", "-I", str(ROOT / "native" / "include"),
                    str(src)], check=True)
