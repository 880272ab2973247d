"""Training beyond DDP, as run by ``torchrun --nproc-per-node 4 parallel_train.py --mode MODE``, on CPU with
gloo. Nothing in it knows about Tidal.

- ``fsdp``: FSDP2 (``fully_shard``) over the 4 ranks;
- ``hsdp``: FSDP2 over a 2-D ``DeviceMesh`` (replicate × shard, 2 × 2);
- ``tp``: tensor parallel (``ColwiseParallel`` / ``RowwiseParallel``) over the 4 ranks;
- ``pipeline``: a 4-stage ``torch.distributed.pipelining`` GPipe schedule, one layer per rank;
- ``dcp``: DDP that saves its state with ``torch.distributed.checkpoint`` every 5 steps and, at the end,
  loads the last save into a fresh model (the files are part of the job's state).

Each rank prints ``rank R step N loss HEX`` per step and writes its own parameters (its shards) to
``params-R.bin`` at the end. ``--gate PATH:STEP``: from STEP on, wait until PATH exists.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def mlp(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 1))


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["fsdp", "hsdp", "tp", "pipeline", "dcp"], required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--gate", default=None, metavar="PATH:STEP")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh

    gen = torch.Generator().manual_seed(100 + rank)
    step_fn = None
    if args.mode in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        mesh = (init_device_mesh("cpu", (world,)) if args.mode == "fsdp"
                else init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")))
        model = mlp(32)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif args.mode == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        model = parallelize_module(mlp(32), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        gen = torch.Generator().manual_seed(100)  # every rank of a TP group sees the same batch
    elif args.mode == "pipeline":
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        full = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(16, 1))
        torch.manual_seed(0)
        for p in full.parameters():
            nn.init.normal_(p, std=0.2)
        model = nn.Sequential(full[rank], nn.Tanh()) if rank < world - 1 else nn.Sequential(full[rank])
        stage = PipelineStage(model, rank, world, torch.device("cpu"))
        losses: list[torch.Tensor] = []
        sched = ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
        gen = torch.Generator().manual_seed(100)

        def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            losses.clear()
            if rank == 0:
                sched.step(x)
            elif rank == world - 1:
                sched.step(target=y, losses=losses)
            else:
                sched.step()
            return torch.stack(losses).mean() if losses else torch.zeros(())
    else:  # dcp
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(mlp(32))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        if args.gate and step >= int(args.gate.rsplit(":", 1)[1]):
            while not os.path.exists(args.gate.rsplit(":", 1)[0]):
                time.sleep(0.02)
        x = torch.randn(16, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()
        if step_fn is not None:
            loss = step_fn(x, y)
        else:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {float(loss.detach()).hex()}", flush=True)
        if args.mode == "dcp" and step % 5 == 4:
            import torch.distributed.checkpoint as dcp

            dcp.save({"model": model.module.state_dict()}, checkpoint_id=f"dcp/step-{step}")
        if args.step_time:
            time.sleep(args.step_time)
    if args.mode == "dcp":
        import torch.distributed.checkpoint as dcp

        last = max(s for s in range(args.steps) if s % 5 == 4)
        fresh = {"model": mlp(32).state_dict()}
        dcp.load(fresh, checkpoint_id=f"dcp/step-{last}")
        total = sum(float(t.double().sum()) for t in fresh["model"].values())
        print(f"rank {rank} loaded step {last} sum {total.hex()}", flush=True)
    dist.barrier()
    with open(f"params-{rank}.bin", "wb") as f:
        for p in model.parameters():
            f.write(local(p.detach()).contiguous().numpy().tobytes())
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
