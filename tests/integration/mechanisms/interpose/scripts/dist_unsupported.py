"""A small torch.distributed job that the interposer cannot cut yet: it uses a sub-group
(``--mode new_group``) or point-to-point operations (``--mode p2p``: ``send``/``recv`` on even steps,
``batch_isend_irecv`` on odd ones).

Each step prints ``rank R step N value HEX``; run it as ``torchrun --nproc-per-node 2``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["new_group", "p2p"], required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-time", type=float, default=0.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sub = dist.new_group(list(range(world))) if args.mode == "new_group" else None
    gen = torch.Generator().manual_seed(rank)
    value = torch.zeros(4)
    for step in range(args.steps):
        value += torch.randn(4, generator=gen)
        if args.mode == "new_group":
            dist.all_reduce(value, group=sub)
            value /= world
        else:
            # A ring: every rank sends its value to the next and receives the previous one's.
            got = torch.zeros(4)
            nxt, prev = (rank + 1) % world, (rank - 1) % world
            if step % 2:
                ops = [dist.P2POp(dist.isend, value, nxt), dist.P2POp(dist.irecv, got, prev)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
            elif rank % 2 == 0:
                dist.send(value, nxt)
                dist.recv(got, prev)
            else:
                dist.recv(got, prev)
                dist.send(value, nxt)
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
