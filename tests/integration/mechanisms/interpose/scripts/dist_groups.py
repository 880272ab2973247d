"""A torch.distributed job that uses every kind of communicator: the world group, disjoint sub-groups
(``new_group([0, 2])`` and ``new_group([1, 3])``), ``new_subgroups``, both dimensions of a 2-D
``DeviceMesh``, and point-to-point operations (``send``/``recv``, ``isend``/``irecv`` and
``batch_isend_irecv``, on the world group and inside a sub-group).

Each step prints ``rank R step N value HEX``; run it as ``torchrun --nproc-per-node 4``. ``--gate PATH:STEP``:
from STEP on, wait until PATH exists.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--gate", default=None, metavar="PATH:STEP")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "run with 4 ranks"
    # Disjoint sub-groups, created by every rank in the same order (what hung).
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    mine = evens if rank % 2 == 0 else odds
    pairs, _ = dist.new_subgroups(2)  # [0, 1] and [2, 3]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    gen = torch.Generator().manual_seed(rank)
    value = torch.zeros(4)
    for step in range(args.steps):
        if args.gate and step >= int(args.gate.rsplit(":", 1)[1]):
            while not os.path.exists(args.gate.rsplit(":", 1)[0]):
                time.sleep(0.02)
        value += torch.randn(4, generator=gen)
        dist.all_reduce(value, group=mine)
        value /= 2
        got = torch.zeros(4)
        nxt, prev = (rank + 1) % world, (rank - 1) % world
        if step % 3 == 0:
            if rank % 2 == 0:
                dist.send(value, nxt)
                dist.recv(got, prev)
            else:
                dist.recv(got, prev)
                dist.send(value, nxt)
        elif step % 3 == 1:
            ops = [dist.P2POp(dist.isend, value, nxt), dist.P2POp(dist.irecv, got, prev)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        else:  # inside the pair sub-group, by group rank
            other = 1 - dist.get_rank(pairs)
            works = [dist.isend(value, group=pairs, group_dst=other, tag=7),
                     dist.irecv(got, group=pairs, group_src=other, tag=7)]
            for w in works:
                w.wait()
        value = (value + got) / 2
        dist.all_reduce(value, group=pairs)
        dist.all_reduce(value, group=dp if step % 2 else tp)
        value /= 4
        if step % 4 == 3:
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
