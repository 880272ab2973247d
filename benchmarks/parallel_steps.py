"""The workloads beyond DDP of ``benchmarks/interpose.py``: the modes of ``examples/parallel_train.py``
(gloo, CPU) with a model of the size of ``benchmarks/ddp_steps.py``, printing one line per step with the
rank's own clocks, ``rank R step N t SECONDS cpu SECONDS loss HEX`` (wall clock, and the CPU time of the
whole process), so that step times can be read from its output under ``torchrun`` and under Tidal alike.
Nothing in it knows about Tidal.

- ``fsdp``: FSDP2 (``fully_shard`` per linear layer and on the model) over all ranks;
- ``hsdp``: the same over a 2-D ``DeviceMesh`` (replicate × shard, 2 × W/2);
- ``tp``: tensor parallel (``ColwiseParallel`` / ``RowwiseParallel``), every rank on the same batch;
- ``pipeline``: a W-stage ``torch.distributed.pipelining`` GPipe schedule, one linear layer per rank, 4
  micro-batches (point-to-point sends and receives between neighbouring stages).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

INPUT = 32


def mlp(hidden: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(INPUT, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["fsdp", "hsdp", "tp", "pipeline"], required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1000 + rank)
    step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    model: nn.Module
    if args.mode in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        mesh = (init_device_mesh("cpu", (world,)) if args.mode == "fsdp"
                else init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")))
        model = mlp(args.hidden, args.depth)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif args.mode == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        model = parallelize_module(mlp(args.hidden, args.depth), mesh,
                                   {"0": ColwiseParallel(), "2": RowwiseParallel()})
        gen = torch.Generator().manual_seed(1000)  # every rank of a TP group sees the same batch
    else:  # pipeline
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        widths = [INPUT] + [args.hidden] * (world - 1) + [1]
        layer = nn.Linear(widths[rank], widths[rank + 1])
        model = nn.Sequential(layer, nn.ReLU()) if rank < world - 1 else nn.Sequential(layer)
        stage = PipelineStage(model, rank, world, torch.device("cpu"))
        losses: list[torch.Tensor] = []
        sched = ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
        gen = torch.Generator().manual_seed(1000)  # the first and the last stage draw the same batch

        def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            losses.clear()
            if rank == 0:
                sched.step(x)
            elif rank == world - 1:
                sched.step(target=y, losses=losses)
            else:
                sched.step()
            return torch.stack(losses).mean() if losses else torch.zeros(())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(args.steps):
        x = torch.randn(args.batch, INPUT, generator=gen)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()
        if step_fn is not None:
            loss = step_fn(x, y)
        else:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        print(f"rank {rank} step {step} t {time.perf_counter():.6f} cpu {time.process_time():.6f} "
              f"loss {float(loss.detach()).hex()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
