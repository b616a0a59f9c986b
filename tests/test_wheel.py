"""The wheel `make wheel` writes (skipped where dist/ holds none): one file for every
CPython 3 and every supported torch, tagged manylinux, holding the library with CUDA
kernels for sm75 to sm120 and PTX, and nothing bundled beside it."""
import ctypes
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WHEELS = sorted((ROOT / "dist").glob("pyroundlib-*.whl"))

pytestmark = pytest.mark.skipif(len(WHEELS) != 1, reason="needs exactly one wheel in dist/ (make wheel)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(WHEELS[0]) as zf:
        zf.extractall(folder)
        names = zf.namelist()
    return WHEELS[0], folder, names


def test_one_wheel_for_every_python(wheel):
    path, folder, _ = wheel
    name, version, python, abi, platform = path.stem.split("-")
    assert (python, abi) == ("py3", "none"), path.name  # not tied to a CPython version or ABI
    assert platform.startswith("manylinux_2_") and platform.endswith("_x86_64"), path.name
    (info,) = folder.glob("*.dist-info/WHEEL")
    assert f"Tag: py3-none-{platform}" in info.read_text()


def test_holds_the_package_and_its_library_only(wheel):
    _, _, names = wheel
    package = {n for n in names if n.startswith("pyroundlib/") and not n.endswith("/")}
    assert "pyroundlib/libpyroundlib.so" in package and "pyroundlib/__init__.py" in package
    assert all(n.endswith((".py", ".so")) for n in package), package
    bundled = [n for n in names if ".libs/" in n or "libcuda" in n or "libcudart" in n]
    assert bundled == [], f"libraries bundled beside ours: {bundled}"


def test_library_has_kernels_for_sm75_to_sm120_and_ptx(wheel):
    """Loaded as it is, on this machine whether or not it has a GPU or a driver."""
    _, folder, _ = wheel
    lib = ctypes.CDLL(str(folder / "pyroundlib" / "libpyroundlib.so"))
    lib.prl_cuda_architectures.restype = ctypes.c_char_p
    assert lib.prl_has_cuda() == 1
    archs = lib.prl_cuda_architectures().decode().split(",")
    real = {int(a.split("-")[0]) for a in archs if a.endswith("-real") or "-" not in a}
    assert {75, 80, 86, 89, 90, 100, 120} <= real, archs
    assert any(a.endswith("-virtual") or "-" not in a for a in archs), f"no PTX in {archs}"
