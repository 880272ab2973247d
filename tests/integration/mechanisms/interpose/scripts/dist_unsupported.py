"""A small torch.distributed job that the interposer cannot cut: rank 1 receives from any source
(``dist.recv`` without ``src``), which cannot be matched to its sender at a cut.

Each step prints ``rank R step N value HEX``; run it as ``torchrun --nproc-per-node 2``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-time", type=float, default=0.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(rank)
    value = torch.zeros(4)
    for step in range(args.steps):
        value += torch.randn(4, generator=gen)
        got = torch.zeros(4)
        if rank == 0:
            dist.send(value, 1)
        elif rank == 1:
            dist.recv(got)  # from whoever sends
        value = (value + got) / 2
        dist.all_reduce(value)
        value /= world
        print(f"rank {rank} step {step} value {value.sum().item().hex()}", flush=True)
        if args.step_time:
            time.sleep(args.step_time)
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
