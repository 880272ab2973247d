"""The workloads beyond DDP of ``benchmarks/interpose.py``: the modes of ``examples/parallel_train.py``
(gloo, CPU) with a model of the size of ``benchmarks/ddp_steps.py``, printing one line per step with the
rank's own clocks, ``rank R step N t SECONDS cpu SECONDS loss HEX`` (wall clock, and the CPU time of the
whole process), so that step times can be read from its output under ``torchrun`` and under Tidal alike.
Nothing in its training loop knows about Tidal.

- ``fsdp``: FSDP2 (``fully_shard`` per linear layer and on the model) over all ranks;
- ``hsdp``: the same over a 2-D ``DeviceMesh`` (replicate × shard, 2 × W/2);
- ``tp``: tensor parallel (``ColwiseParallel`` / ``RowwiseParallel``), every rank on the same batch;
- ``pipeline``: a W-stage ``torch.distributed.pipelining`` GPipe schedule, one linear layer per rank, 4
  micro-batches (point-to-point sends and receives between neighbouring stages).

``--paired B`` (``fsdp`` and ``pipeline``) trains two copies of the model in the same processes, one on the
default group (the interposer's, under Tidal) and one on a gloo group of torch's own over the same ranks,
switching between them every B steps; each line ends ``via default`` or ``via native`` and the CPU time of
the script's thread, ``thread SECONDS``. Blocks next to each other see the same machine, so their
difference is what the interposer costs the workload, apart from the noise between runs. Under plain
``torchrun`` both are gloo groups of torch's: the same measurement with nothing to find.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

INPUT = 32
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def mlp(hidden: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(INPUT, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, 1))


def native_world() -> dist.ProcessGroup:
    """A gloo group of torch's own over every rank. Under Tidal the default group's store is a local one and
    every group asked for is the interposer's, so this one is made, once, on the store under the default
    group's inner gloo group, with the interposer's routing of new groups off while torch builds it."""
    c10d = dist.distributed_c10d
    default = c10d._get_default_group()
    own_store = getattr(default, "_store", None)
    if own_store is None:  # plain torchrun
        return dist.new_group(backend="gloo")
    saved, routed = c10d._world.pg_map[default], dist._tidal_registered  # type: ignore[attr-defined]
    c10d._world.pg_map[default] = (saved[0], dist.PrefixStore("paired-native", own_store))
    dist._tidal_registered = False  # type: ignore[attr-defined]
    try:
        return dist.new_group(backend="gloo")
    finally:
        dist._tidal_registered = routed  # type: ignore[attr-defined]
        c10d._world.pg_map[default] = saved


def build(mode: str, base: nn.Module | None, group: dist.ProcessGroup | None, hidden: int, depth: int,
          microbatches: int) -> tuple[nn.Module, Step | None]:
    """The model of ``mode`` on ``group`` (None: the default group, as a script would have it), and its step
    function where it is not a plain forward and backward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        if group is not None:
            mesh = DeviceMesh.from_group(group, "cpu")
        elif mode == "fsdp":
            mesh = init_device_mesh("cpu", (world,))
        else:
            mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        model = copy.deepcopy(base) if base is not None else mlp(hidden, depth)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, None
    if mode == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        return parallelize_module(mlp(hidden, depth), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}), None
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    widths = [INPUT] + [hidden] * (world - 1) + [1]
    layer = nn.Linear(widths[rank], widths[rank + 1])
    model = nn.Sequential(layer, nn.ReLU()) if rank < world - 1 else nn.Sequential(layer)
    if base is not None:
        model = copy.deepcopy(base)
    stage = PipelineStage(model, rank, world, torch.device("cpu"), group=group)
    losses: list[torch.Tensor] = []
    sched = ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=nn.functional.mse_loss)

    def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses.clear()
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        return torch.stack(losses).mean() if losses else torch.zeros(())

    return model, step_fn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["fsdp", "hsdp", "tp", "pipeline"], required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--paired", type=int, default=0, metavar="B",
                    help="fsdp, pipeline: a second copy of the model on a gloo group of torch's own, the two "
                         "trained in turns of B steps")
    args = ap.parse_args()
    if args.paired and args.mode not in ("fsdp", "pipeline"):
        ap.error("--paired is for --mode fsdp or pipeline")

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # The TP group and the pipeline's first and last stages see the same batch on every rank.
    gen = torch.Generator().manual_seed(1000 if args.mode in ("tp", "pipeline") else 1000 + rank)
    sides: list[tuple[str, nn.Module, Step | None]] = []
    if args.paired:
        native = native_world()
        # Both copies start from the same weights: FSDP2's from one unsharded model, the pipeline's from the
        # first copy of this rank's stage.
        base = mlp(args.hidden, args.depth) if args.mode == "fsdp" else None
        model, step_fn = build(args.mode, base, dist.group.WORLD, args.hidden, args.depth, 4)
        sides.append(("default", model, step_fn))
        model, step_fn = build(args.mode, base or model, native, args.hidden, args.depth, 4)
        sides.append(("native", model, step_fn))
    else:
        model, step_fn = build(args.mode, None, None, args.hidden, args.depth, 4)
        sides.append(("", model, step_fn))
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for _, m, _ in sides]
    for step in range(args.steps):
        i = (step // args.paired) % 2 if args.paired else 0
        name, model, step_fn = sides[i]
        opt = opts[i]
        x = torch.randn(args.batch, INPUT, generator=gen)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()
        if step_fn is not None:
            loss = step_fn(x, y)
        else:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        # In a paired run, also the CPU time of this thread (the script's), apart from the process's other threads.
        via = f" via {name} thread {time.thread_time():.6f}" if name else ""
        print(f"rank {rank} step {step} t {time.perf_counter():.6f} cpu {time.process_time():.6f} "
              f"loss {float(loss.detach()).hex()}{via}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
