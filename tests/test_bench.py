"""The benchmark script: its LLTM floor variant computes what the LLTM computes (so the
floor it reports is a real LLTM), and a one-case run writes its outputs."""
import json
import sys
from pathlib import Path

import pytest
import torch

from pyroundlib.reference import lltm_cell_reference

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench  # noqa: E402
from conftest import requires_cuda  # noqa: E402


@pytest.fixture(autouse=True)
def _inductor_config_untouched():
    """Every benchmark run leaves torch.compile's settings as it found them."""
    config = bench.inductor_config()
    before = getattr(config, "compile_threads", None)
    yield
    assert getattr(config, "compile_threads", None) == before


def test_kernels_floor_is_a_correct_lltm(device):
    """`LLTMKernelsFloor` (GEMMs + our two kernel calls, no checks) against plain PyTorch in
    float64: same outputs and same gradients for all five inputs."""
    batch, features, state = 5, 7, 12
    args = bench.lltm_inputs(device, batch, features, state, dtype=torch.float64, requires_grad=True)
    grads = [torch.randn(batch, state, device=device, dtype=torch.float64) for _ in range(2)]
    got = bench.LLTMKernelsFloor.apply(*args)
    ref = lltm_cell_reference(*args)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    for name, g, r in zip(["input", "weights", "bias", "old_h", "old_cell"],
                          torch.autograd.grad(got, args, grads), torch.autograd.grad(ref, args, grads)):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12, msg=lambda m: f"d_{name}: {m}")


class Settings:
    """A stand-in for a config module."""

    def __init__(self, **values):
        self.__dict__.update(values)


class Refusing:
    """A config module that refuses a name it does not know, as torch's do."""

    def __setattr__(self, name, value):
        raise AttributeError(f"{name} does not exist")


def test_setting_is_restored_even_when_the_run_fails():
    owner = Settings(compile_threads=8)
    with pytest.raises(RuntimeError, match="boom"):
        with bench.setting(owner, "compile_threads", 1) as note:
            assert owner.compile_threads == 1 and note["applied"]
            raise RuntimeError("boom")
    assert owner.compile_threads == 8


@pytest.mark.parametrize("owner", [Settings(), Refusing(), None], ids=["missing", "refused", "no module"])
def test_a_setting_this_torch_lacks_is_recorded_not_fatal(owner):
    with bench.setting(owner, "compile_threads", 1) as note:
        pass
    assert note["applied"] is False and "AttributeError" in note["why"]
    assert not hasattr(owner, "compile_threads") or owner is None


def test_run_without_the_inductor_setting(tmp_path, monkeypatch):
    """On a torch whose torch.compile has no such setting, the benchmark still runs, and
    its results say the setting was not applied."""
    monkeypatch.setattr(bench, "inductor_config", lambda: None)
    bench.main(["--device", "cpu", "--only", "CPU: LLTM forward", "--rounds", "1", "--out", str(tmp_path)])
    (note,) = json.loads((tmp_path / "results.json").read_text())["meta"]["settings"]
    assert note["applied"] is False


def test_one_case_run_writes_results(tmp_path):
    bench.main(["--device", "cpu", "--only", "CPU: LLTM forward", "--rounds", "2", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    (result,) = data["results"]
    assert result["case"] == "CPU: LLTM forward+backward, (B,I,S)=(16,32,128)"
    assert set(result["medians"]) == {bench.OURS, "eager", "floor: GEMMs only", bench.KERNELS_FLOOR}
    assert all(t > 0 for t in result["medians"].values())
    assert all(len(t) == 2 for t in result["times"].values())  # every round of every variant
    assert data["targets"] == []  # the CPU case is reported, not targeted
    (note,) = data["meta"]["settings"]
    assert note["setting"].endswith("config.compile_threads") and note["wanted"] == 1
    assert note["applied"] is hasattr(bench.inductor_config(), "compile_threads")
    assert "| CPU: LLTM forward+backward" in (tmp_path / "results.md").read_text()


def test_cpu_script_runs_and_is_targeted(tmp_path):
    """benchmarks/cpu.py: a sequence case with every route beside nn.LSTM, and a round case;
    each gets its target rows."""
    import cpu
    cpu.main(["--only", "(T,B,I,S)=(8,32,8,64)|round forward, 2^16 float32", "--rounds", "1",
              "--out", str(tmp_path)])
    (out,) = tmp_path.iterdir()
    data = json.loads((out / "results.json").read_text())
    names = [r["case"] for r in data["results"]]
    assert names == ["sequence fwd+bwd, (T,B,I,S)=(8,32,8,64)", "sequence inference, (T,B,I,S)=(8,32,8,64)",
                     "round forward, 2^16 float32"]
    assert set(data["results"][0]["medians"]) == {bench.OURS, cpu.LSTM, *cpu.FORCED}
    targets = {(t["case"], t["peer"]) for t in data["targets"]}
    assert ("round forward, 2^16 float32", "torch.round") in targets
    assert {(names[0], peer) for peer in [cpu.LSTM, *cpu.FORCED]} <= targets
    assert "| sequence fwd+bwd, (T,B,I,S)=(8,32,8,64) |" in (out / "results.md").read_text()


def test_layer_case_runs_and_is_targeted(tmp_path):
    """The 2-layer bidirectional layer on a packed batch: ours, nn.LSTM and ours padded; the
    targets against nn.LSTM and against padded."""
    bench.main(["--device", "cpu", "--only", "CPU: LLTMLayer 2-layer bidirectional inference", "--rounds", "1",
                "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    packed = [r for r in data["results"] if "packed" in r["case"]]
    assert len(packed) == 1 and set(packed[0]["medians"]) == {bench.OURS, bench.CUDNN, bench.PADDED}
    limits = sorted(t["limit"] for t in data["targets"] if "packed" in t["target"])
    assert limits == [0.75, 0.85]


def test_sequence_case_runs_and_is_targeted(tmp_path):
    bench.main(["--device", "cpu", "--only", "CPU: LLTM sequence", "--rounds", "1", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    (result,) = data["results"]
    assert set(result["medians"]) == {bench.OURS, bench.CUDNN, bench.CELL_LOOP, "cell loop eager"}
    (target,) = data["targets"]
    assert target["limit"] == 0.75 and bench.CUDNN in target["target"]


def test_case_settings_apply_while_it_runs_and_are_restored(monkeypatch):
    seen = []
    monkeypatch.setattr(bench, "run_case", lambda case, *a: seen.append(
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)) or 1 / 0)
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    cases = bench.sequence_cases(torch.device("cpu"), 2, 2, 3, 4, "float32 TF32 on", compiled=False)
    with pytest.raises(ZeroDivisionError):  # a case that fails still restores its settings
        bench.run_cases(cases, torch.device("cpu"), 1, 1e-9, notes := [])
    assert seen == [(True, True)]
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert [n["applied"] for n in notes] == [True, True]


def test_rounds_vary_each_variants_predecessor():
    """Each round runs the variants in a fresh order, so no variant always runs right after
    the same other one (a fixed cycle A B C, B C A, ... would), and the orders are the same
    in every run."""
    names = [bench.OURS, "b", "c", "d"]

    def orders():
        calls = []
        case = bench.Case("order", {n: (lambda n=n: calls.append(n)) for n in names}, host_bound=True)
        result = bench.run_case(case, torch.device("cpu"), rounds=12, round_seconds=1e-9)
        assert result.reps == 1
        return calls[-12 * 4:]  # the timed rounds, after the warm-up and the calibration

    calls = orders()
    rounds = [calls[i:i + 4] for i in range(0, len(calls), 4)]
    assert all(sorted(r) == sorted(names) for r in rounds)
    before = {n: {r[r.index(n) - 1] for r in rounds if r.index(n) > 0} for n in names}
    assert all(len(p) >= 2 for p in before.values()), before
    assert orders() == calls


def test_cpu_pinning_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 16)
    bench.main(["--device", "cpu", "--only", "no such case", "--rounds", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["cpus_allowed"] == [3]
    assert "**Process pinned to CPU(s) [3]** of 16" in (tmp_path / "results.md").read_text()


def test_only_matching_nothing_runs_nothing(tmp_path):
    bench.main(["--device", "cpu", "--only", "no such case", "--rounds", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "results.json").read_text())["results"] == []


def test_backward_on_calling_thread_is_recorded_and_undone(tmp_path, monkeypatch):
    seen = []
    run_case = bench.run_case

    def spy(*args, **kwargs):
        seen.append(torch._C._is_multithreading_enabled())
        return run_case(*args, **kwargs)

    monkeypatch.setattr(bench, "run_case", spy)
    bench.main(["--device", "cpu", "--only", "CPU: LLTM forward", "--rounds", "1", "--backward-on-calling-thread",
                "--out", str(tmp_path)])
    assert seen == [False]  # the case ran with the engine's device threads off
    assert torch._C._is_multithreading_enabled()  # and they are back on afterwards
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["backward_thread"] == "calling thread"
    assert "Diagnostic run" in (tmp_path / "results.md").read_text()


@requires_cuda
def test_pointwise_graphs_runs():
    """benchmarks/pointwise_graphs.py (the pointwise kernels timed inside CUDA graphs) runs
    and reports a time for each dtype and size asked for."""
    import pointwise_graphs
    lines = pointwise_graphs.main(["--launches", "3", "--replays", "2", "--sizes", "2x8,3x16",
                                   "--dtypes", "bfloat16,float32"])
    assert len(lines) == 1 + 2 * 2
    for line in lines[1:]:
        forward, backward = (float(part.split()[-1]) for part in line.split(": ")[1].split(", "))
        assert forward > 0 and backward > 0


@requires_cuda
def test_sweep_runs(tmp_path):
    """benchmarks/sweep.py on one shape, both dtypes and modes, writes its table with the
    route taken, the persistent variant where the kernels fit and (bfloat16) the float32 time,
    without FlashRNN when not asked for."""
    import sweep
    sweep.main(["--only", "(50,1,64,64)", "--rounds", "1", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["results"]) == 4
    assert set(results["meta"]["routes"].values()) <= {"fused", "one call", "replayed steps", "steps"}
    for r in results["results"]:
        assert sweep.LSTM in r["medians"] and sweep.PERSISTENT in r["medians"]
        assert sweep.FLASHRNN not in r["medians"]
        assert (sweep.AS_FLOAT32 in r["medians"]) == ("bfloat16" in r["case"])
    assert "| (50,1,64,64) |" in (tmp_path / "results.md").read_text()
