"""The loader's Windows branch, run on any platform with sys.platform set to "win32": the
file name it looks for, the PYROUNDLIB_LIBRARY override, and the error listing every path
tried.  (The DLL itself is checked by `make windows`: MinGW-w64 build, C ABI test under Wine.)"""
import sys
from pathlib import Path

import pytest

import pyroundlib
from pyroundlib import _ffi

from conftest import PACKAGE_PARENT


@pytest.mark.parametrize("platform, name", [
    ("win32", "pyroundlib.dll"),
    ("linux", "libpyroundlib.so"),
    ("darwin", "libpyroundlib.dylib"),
    ("freebsd14", "libpyroundlib.so"),
])
def test_library_file(platform, name):
    assert _ffi.library_file(platform) == name


def test_library_file_of_this_platform():
    assert _ffi.LIBRARY_FILE == _ffi.library_file(sys.platform)


@pytest.fixture
def on_windows(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.delenv(_ffi.ENV_VAR, raising=False)
    return monkeypatch


def test_candidates_are_dlls(on_windows):
    paths = [Path(p) for p in _ffi.candidate_paths()]
    assert [p.name for p in paths] == ["pyroundlib.dll"] * len(paths)
    # the package's folders first, then the source tree's build folder
    assert [p.parent for p in paths[:-1]] == [Path(p) for p in pyroundlib.__path__]
    assert paths[-1].parent == PACKAGE_PARENT / "build"


def test_override_wins(on_windows):
    dll = r"C:\libs\pyroundlib\pyroundlib.dll"
    on_windows.setenv(_ffi.ENV_VAR, dll)
    assert _ffi.candidate_paths() == [dll]
    with pytest.raises(pyroundlib.LibraryLoadError) as info:
        _ffi.load_library()
    assert f"  {dll}: no such file" in str(info.value)


def test_load_error_lists_every_path_tried(on_windows, tmp_path):
    on_windows.setattr(pyroundlib, "__path__", [str(tmp_path / "site-packages" / "pyroundlib")])
    with pytest.raises(pyroundlib.LibraryLoadError) as info:
        _ffi.load_library()
    paths = _ffi.candidate_paths()
    assert len(paths) == 2
    assert str(info.value).split("\n") == (
        ["could not load the pyroundlib native library. Tried:"] + [f"  {p}: no such file" for p in paths] +
        [f"Build it with `make` in the pyroundlib source tree, or set {_ffi.ENV_VAR} to the path of pyroundlib.dll."])
