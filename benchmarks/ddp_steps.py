"""The workload of ``benchmarks/interpose.py``: an ordinary DDP training loop (gloo, CPU) that prints one
line per step with the rank's own clocks, ``rank R step N t SECONDS cpu SECONDS`` (wall clock, and the
CPU time of the whole process), so that step times can be read from its output under ``torchrun`` and
under Tidal alike. Nothing in its training loop knows about Tidal.

``--probe N`` (run as Tidal ranks) first times N small all-reduces through the interposer's group against
N on the gloo group it delegates to, in alternating blocks in the same processes, so that the interposer's
own cost per collective is measured apart from the machine's noise: ``probe wrapped_us X direct_us Y``."""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--probe", type=int, default=0, help="time N all-reduces with and without the interposer")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(32, args.hidden), nn.ReLU()]
    for _ in range(args.depth - 1):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.hidden, 1))
    if args.probe:
        probe(args.probe)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True).sin())
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} t {time.perf_counter():.6f} cpu {time.process_time():.6f} "
              f"loss {loss.item().hex()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def probe(n: int, block: int = 50) -> None:
    group = dist.distributed_c10d._get_default_group()
    inner = getattr(group, "_inner", None)
    if inner is None:
        print("probe none", flush=True)
        return
    t = torch.zeros(16)
    opts = dist.AllreduceOptions()
    # Wall time per call, and the calling thread's CPU time per call: the interposer's own work is CPU
    # work on this thread, while the wall time is dominated by waiting for the peer.
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * (n // block)):
        through = i % 2 == 0
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(block):
            if through:
                dist.all_reduce(t)
            else:
                inner.allreduce([t], opts).wait()
        cpu[through].append((time.thread_time() - start_cpu) / block)
        wall[through].append((time.perf_counter() - start) / block)
    if dist.get_rank() == 0:
        us = {k: {w: statistics.median(v[w]) * 1e6 for w in (True, False)} for k, v in (("wall", wall), ("cpu", cpu))}
        print(f"probe wrapped_us {us['wall'][True]:.2f} direct_us {us['wall'][False]:.2f} "
              f"wrapped_cpu_us {us['cpu'][True]:.2f} direct_cpu_us {us['cpu'][False]:.2f}", flush=True)


if __name__ == "__main__":
    main()
