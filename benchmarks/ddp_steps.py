"""The workload of ``benchmarks/interpose.py``: an ordinary DDP training loop (gloo, CPU) that prints one
line per step with the rank's own clocks, ``rank R step N t SECONDS cpu SECONDS`` (wall clock, and the
CPU time of the whole process), so that step times can be read from its output under ``torchrun`` and
under Tidal alike. Nothing in its training loop knows about Tidal.

``--probe N`` (run as Tidal ranks) first times N small all-reduces, and N sends from rank 0 to rank 1, through
the interposer's group against N on a gloo group of torch's own, in alternating blocks in the same processes,
so that the interposer's own cost per op is measured apart from the machine's noise (see :func:`probe`)."""

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
    """Prints ``probe KIND through_us X native_us Y through_cpu_us Z native_cpu_us W`` for KIND ``collective``
    (``dist.all_reduce`` of 16 floats) and ``p2p`` (rank 0 sends 16 floats, rank 1 receives them): through the
    interposer's group, against the same call on a gloo group of torch's own made in the same processes (on
    Tidal's store), in alternating blocks, so that the difference is what the interposer adds and nothing else
    (torch's own Python around a collective is in both)."""
    group = dist.distributed_c10d._get_default_group()
    inner = getattr(group, "_inner", None)
    if inner is None:
        print("probe none", flush=True)
        return
    rank, size = dist.get_rank(), dist.get_world_size()
    # Dropped on return, with its connections: nothing of the probe is left for a checkpoint.
    native = dist.ProcessGroupGloo(dist.PrefixStore("probe-native", group._store), rank, size)
    t = torch.zeros(16)
    peer = 1 - rank if size == 2 else None

    def p2p(g: object) -> None:
        if rank == 0:
            g.send([t], 1, 0).wait()  # type: ignore[attr-defined]
        elif rank == 1:
            g.recv([t], 0, 0).wait()  # type: ignore[attr-defined]

    kinds = {"collective": (lambda: dist.all_reduce(t), lambda: dist.all_reduce(t, group=native))}
    if peer is not None:
        # The group's own send/recv on both sides (dist.send looks a group up among torch's registered ones,
        # and the native group is not).
        kinds["p2p"] = (lambda: p2p(group), lambda: p2p(native))
    for kind, (through_fn, native_fn) in kinds.items():
        # Wall time per call, and the calling thread's CPU time per call: the interposer's own work is CPU
        # work on this thread, while the wall time is dominated by waiting for the peer.
        wall: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for i in range(2 * (n // block)):
            through = i % 2 == 0
            fn = through_fn if through else native_fn
            start, start_cpu = time.perf_counter(), time.thread_time()
            for _ in range(block):
                fn()
            cpu[through].append((time.thread_time() - start_cpu) / block)
            wall[through].append((time.perf_counter() - start) / block)
        if rank == 0:
            us = {k: {w: statistics.median(v[w]) * 1e6 for w in (True, False)}
                  for k, v in (("wall", wall), ("cpu", cpu))}
            print(f"probe {kind} through_us {us['wall'][True]:.2f} native_us {us['wall'][False]:.2f} "
                  f"through_cpu_us {us['cpu'][True]:.2f} native_cpu_us {us['cpu'][False]:.2f}", flush=True)


if __name__ == "__main__":
    main()
