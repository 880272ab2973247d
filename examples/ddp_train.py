"""An ordinary DDP training script, as run by ``torchrun --nproc-per-node W ddp_train.py``.

Each rank trains a small MLP on its shard of a seeded synthetic dataset, prints one line per step with
the exact loss (``float.hex``), and rank 0 writes the final parameters to ``params.bin`` in the working
directory. Nothing in it knows about Tidal.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--step-time", type=float, default=0.0, help="extra seconds of 'work' per step")
    ap.add_argument("--collectives", action="store_true", help="also all_reduce/broadcast/all_gather directly")
    ap.add_argument("--fail", default=None, metavar="RANK:STEP:CODE", help="that rank exits with CODE at STEP")
    ap.add_argument("--gate", default=None, metavar="PATH:STEP", help="from STEP on, wait until PATH exists")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        if args.gate and step >= int(args.gate.rsplit(":", 1)[1]):
            while not os.path.exists(args.gate.rsplit(":", 1)[0]):
                time.sleep(0.05)
        x = torch.randn(args.batch, 32, generator=gen)
        y = x.sum(dim=1, keepdim=True).sin()
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        line = f"rank {rank} step {step} loss {loss.item().hex()}"
        if args.collectives:
            t = loss.detach().clone()
            dist.all_reduce(t)
            b = torch.tensor([float(step)]) if rank == 0 else torch.zeros(1)
            dist.broadcast(b, 0)
            parts = [torch.zeros(1) for _ in range(world)]
            dist.all_gather(parts, loss.detach().reshape(1))
            line += f" sum {t.item().hex()} bcast {b.item():.0f} gather {sum(p.item() for p in parts).hex()}"
        print(line, flush=True)
        if args.fail and [rank, step] == [int(x) for x in args.fail.split(":")[:2]]:
            print(f"rank {rank} fails on purpose", flush=True)
            raise SystemExit(int(args.fail.split(":")[2]))
        if args.step_time:
            time.sleep(args.step_time)
    dist.barrier()
    if rank == 0:
        with open("params.bin", "wb") as f:
            for p in model.parameters():
                f.write(p.detach().numpy().tobytes())
    print(f"rank {rank} done, world {world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
