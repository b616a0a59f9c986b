"""A 2-process DistributedDataParallel (NCCL) training run of a small model using LLTM,
LLTMLayer (one layer padded; two bidirectional layers over a PackedSequence) and RoundSTE; launched by tests/test_distributed.py through torch.distributed.run.

Each rank takes its half of every (seeded) batch; rank 0 saves the final parameters.
`python tests/distributed_step.py --single OUT` runs the same steps in one process on the
whole batches, for comparison."""
import argparse
import os

import torch
import torch.distributed as dist

import pyroundlib

STEPS, BATCH, TIME, FEATURES, STATE, BITS, CLASSES = 3, 16, 5, 6, 8, 5, 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = pyroundlib.LLTM(FEATURES, STATE)
        self.layer = pyroundlib.LLTMLayer(FEATURES, STATE)
        self.stack = pyroundlib.LLTMLayer(FEATURES, STATE, num_layers=2, bidirectional=True)
        self.encode = torch.nn.Linear(STATE, BITS)
        self.binarise = pyroundlib.RoundSTE()
        self.decode = torch.nn.Linear(BITS, CLASSES)

    def forward(self, seq, lengths):  # lengths: a list (DDP moves tensor arguments to the GPU)
        h = seq.new_zeros(seq.shape[1], STATE)
        c = torch.zeros_like(h)
        for x in seq:
            h, c = self.cell(x, (h, c))
        output, (h_n, c_n) = self.layer(seq)  # the whole sequence as one autograd node
        packed = torch.nn.utils.rnn.pack_padded_sequence(seq, lengths, enforce_sorted=False)
        _, (h_s, c_s) = self.stack(packed)  # each sequence at its own length
        return self.decode(self.binarise(torch.sigmoid(self.encode(h + output.mean(0) + h_n[0] * c_n[0]
                                                                    + h_s[-1] - c_s[-2]))))


def make_model(device):
    torch.manual_seed(0)
    return Net().to(device=device, dtype=torch.float64)


def batches(device):
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        seq = torch.randn(TIME, BATCH, FEATURES, generator=gen, dtype=torch.float64)
        labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
        lengths = torch.randint(1, TIME + 1, (BATCH,), generator=gen)
        yield seq.to(device), labels.to(device), lengths


def train(model, device, shard=slice(None)):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for seq, labels, lengths in batches(device):
        loss = torch.nn.functional.cross_entropy(model(seq[:, shard], lengths[shard].tolist()), labels[shard])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--single", action="store_true")
    args = parser.parse_args()
    if args.single:
        torch.save(train(make_model("cuda:0"), "cuda:0"), args.out)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    model = torch.nn.parallel.DistributedDataParallel(make_model(device), device_ids=[device.index])
    per_rank = BATCH // world
    state = train(model, device, slice(rank * per_rank, (rank + 1) * per_rank))
    if rank == 0:
        torch.save({k.removeprefix("module."): v for k, v in state.items()}, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
