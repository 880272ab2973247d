"""A plain PyTorch DDP loop, as run by ``torchrun --nproc-per-node 2 compiled.py``, with three features that
keep state outside the training loop:

- the model is ``torch.compile``d (TorchInductor: generated C++ built into shared objects in its cache
  directory, compiled by worker processes);
- the data comes from a ``DataLoader`` with ``num_workers=2, persistent_workers=True, pin_memory=False`` over
  several epochs (the workers live across epochs and hand batches over in shared memory);
- every rank logs its loss with TensorBoard's ``SummaryWriter`` to ``runs/rank-R`` while it trains.

Each rank prints ``rank R step N loss HEX`` per step and writes its parameters to ``params-R.bin`` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.tensorboard import SummaryWriter


class Points(Dataset):
    """Made on the fly from the index: x ~ N(0, 1) in 16 dimensions, y = sin(sum(x))."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(16, generator=torch.Generator().manual_seed(i))
        return x, x.sum(dim=0, keepdim=True).sin()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--gate", default=None, metavar="PATH:STEP")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 1))
    model = DDP(torch.compile(net))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(Points(), seed=0)
    data = DataLoader(Points(), batch_size=8, sampler=sampler, num_workers=2, persistent_workers=True,
                      pin_memory=False)
    writer = SummaryWriter(f"runs/rank-{rank}")
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in data:
            gate(args.gate, step)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            print(f"rank {rank} step {step} loss {float(loss.detach()).hex()}", flush=True)
            writer.add_scalar("loss", loss.item(), step)
            step += 1
        writer.flush()
    writer.close()
    with open(f"params-{rank}.bin", "wb") as f:
        for p in model.parameters():
            f.write(p.detach().contiguous().numpy().tobytes())
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


# -- holding the run at a step (for tests): from STEP on, wait until PATH exists --------------------------
def gate(spec: str | None, step: int) -> None:
    if spec and step >= int(spec.rsplit(":", 1)[1]):
        while not os.path.exists(spec.rsplit(":", 1)[0]):
            time.sleep(0.02)


if __name__ == "__main__":
    main()
