"""Three ranks whose cut needs a raised target: rank 1 all-reduces on group [1, 2] and then on [0, 1] each
step; rank 0 only on [0, 1], rank 2 only on [1, 2]. At step ``--hold`` ranks 1 and 2 wait for the file of
``--wait`` while rank 0 has already issued its all-reduce on [0, 1] (it prints ``rank 0 issued N`` then):
a cut taken then finds rank 1 owing [0, 1] behind an op on [1, 2] that no rank had announced.

Each step prints ``rank R step N value HEX``; run it as ``torchrun --nproc-per-node 3``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--hold", type=int, default=4)
    ap.add_argument("--wait", default=None, metavar="PATH")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert dist.get_world_size() == 3, "run with 3 ranks"
    left, right = dist.new_group([1, 2]), dist.new_group([0, 1])
    value = torch.full((4,), float(rank + 1))
    for step in range(args.steps):
        if rank in (1, 2) and step == args.hold and args.wait:
            while not os.path.exists(args.wait):
                time.sleep(0.02)
        value = value * 1.5 + step
        if rank in (1, 2):
            dist.all_reduce(value, group=left)
        if rank in (0, 1):
            work = dist.all_reduce(value, group=right, async_op=True)
            if rank == 0 and step == args.hold:
                print(f"rank 0 issued {step}", flush=True)
            work.wait()
        value /= 2
        print(f"rank {rank} step {step} value {value.sum().item().hex()}", flush=True)
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
