"""Several GPUs: a 2-process DistributedDataParallel (NCCL) training run with LLTM,
LLTMLayer and RoundSTE ends with the same parameters as one process on the concatenated batches."""
import subprocess
import sys
from pathlib import Path

import torch

import distributed_step
from conftest import requires_two_gpus, subprocess_env

SCRIPT = Path(__file__).resolve().parent / "distributed_step.py"


def run(args, tmp_path):
    env = subprocess_env(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    proc = subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@requires_two_gpus
def test_ddp_two_processes_match_one_process(tmp_path):
    run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
         str(tmp_path / "ddp.pt")], tmp_path)
    run([str(SCRIPT), "--single", str(tmp_path / "single.pt")], tmp_path)
    ddp, single = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "single.pt")
    initial = distributed_step.make_model("cpu").state_dict()
    assert ddp.keys() == single.keys() == initial.keys()
    for name in ddp:
        torch.testing.assert_close(ddp[name], single[name], rtol=1e-10, atol=1e-12, msg=name)
        assert not torch.equal(ddp[name], initial[name]), f"{name} did not train"
