"""`python -m pyroundlib`: the report and self-test, and its exit status; that the README
states the supported torch range; and that docs/design.md's C ABI reference stays in step
with the header."""
import re
import subprocess
import sys
from pathlib import Path

import torch

import pyroundlib
from pyroundlib.__main__ import _arch_covered, torch_version

from conftest import PACKAGE_PARENT, subprocess_env

ROOT = Path(__file__).resolve().parent.parent


def run_cli(**env):
    return subprocess.run([sys.executable, "-m", "pyroundlib"], capture_output=True, text=True, cwd=PACKAGE_PARENT,
                          env=subprocess_env(**env), timeout=300)


def test_self_test_passes():
    proc = run_cli()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("pyroundlib ", "library ", "CUDA ", "torch ", "self-test", "cpu    ok    round_ste",
                 "cpu    ok    LLTM", "all good"):
        assert line in proc.stdout, proc.stdout


def test_states_the_supported_range():
    proc = run_cli()
    assert f"supported: torch {pyroundlib.SUPPORTED_TORCH}" in proc.stdout, proc.stdout
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"torch{pyroundlib.SUPPORTED_TORCH}"' in pyproject  # the same range everywhere
    readme = (ROOT / "README.md").read_text()
    assert f"torch {pyroundlib.SUPPORTED_TORCH.lstrip('>=')} or newer" in readme
    assert pyroundlib.MIN_TORCH == torch_version(pyroundlib.SUPPORTED_TORCH.lstrip(">="))
    assert torch_version(torch.__version__) >= pyroundlib.MIN_TORCH  # the suite runs in range


def test_torch_version_parsing():
    assert torch_version("2.11.0+cu130") == (2, 11)
    assert torch_version("2.4.1") == (2, 4) < (2, 13) == torch_version("2.13.0")
    assert torch_version("2.6.0a0+git1234") == (2, 6)


def test_missing_library_fails_with_a_hint(tmp_path):
    proc = run_cli(PYROUNDLIB_LIBRARY=str(tmp_path / "missing.so"))
    assert proc.returncode == 1
    assert "FAILED to load" in proc.stdout and "make" in proc.stdout and str(tmp_path) in proc.stdout


def test_architecture_coverage():
    archs = ["75-real", "80-real", "90-real", "90-virtual"]
    assert _arch_covered((9, 0), archs) and _arch_covered((8, 0), archs)
    assert _arch_covered((12, 0), archs)  # through the compute_90 PTX
    assert not _arch_covered((8, 6), archs) and not _arch_covered((7, 0), archs)


def test_design_doc_documents_every_abi_function():
    """docs/design.md's C ABI section names every function of the header."""
    header = (ROOT / "native" / "include" / "pyroundlib.h").read_text()
    design = (ROOT / "docs" / "design.md").read_text()
    functions = set(re.findall(r"PRL_API\s+[\w\s\*]+?\b(prl_\w+)\s*\(", header))
    assert len(functions) == 39, functions
    missing = {f for f in functions if f not in design}
    # the table may name a CPU form and its `_cuda` variant in one row
    missing = {f for f in missing if not (f.endswith("_cuda") and f[:-5] + "_cpu" in design)}
    assert not missing, f"docs/design.md's C ABI section does not mention {sorted(missing)}"
