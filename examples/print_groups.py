"""Prints what ``torch.distributed`` tells this rank of its process groups, one JSON line before a gate and one
after it (a checkpoint or a migration may come in between), to compare a Tidal rank with a ``torchrun`` worker.

The second line also says what torch's helpers that choose a device by the group did: an object all-gather,
``set_model_state_dict(..., broadcast_from_rank0=True)`` and ``torch.distributed.checkpoint.async_save`` (read
back); and what the functional collectives that torch runs from C++ gave: a DTensor's ``full_tensor()`` and a
reduce-scatter. Each line also goes to ``groups-RANK.jsonl``. ``--gate PATH``: after the first line, wait until PATH
exists. ``--backend B``: what ``init_process_group`` is given (``gloo``; ``none``: nothing)."""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def view(sub: dist.ProcessGroup, mesh_group: dist.ProcessGroup) -> dict:
    pg = dist.distributed_c10d._get_default_group()
    work = dist.all_reduce(torch.ones(1), async_op=True)
    work.wait()
    return {
        "backend": str(dist.get_backend()),
        "backend_of_subgroup": str(dist.get_backend(sub)),
        "backend_of_mesh": str(dist.get_backend(mesh_group)),
        "backend_config": dist.get_backend_config(),
        "name": pg.name(),
        "backend_name": pg._get_backend_name(),
        "device_types": [str(d) for d in pg._device_types],
        "backend_for_cpu": type(pg._get_backend(torch.device("cpu"))).__name__,
        "object_device": dist.distributed_c10d._get_object_coll_device(),
        "groups": dist.get_pg_count(),
        "group_names": [pg.group_name, sub.group_name],
        "ranks_of_subgroup": dist.get_process_group_ranks(sub),
        "work_is_a_work": isinstance(work, dist.Work),
        "launched_by_torchelastic": dist.is_torchelastic_launched(),
    }


def say(rank: int, line: dict) -> None:
    text = json.dumps({"rank": rank, **line}, sort_keys=True)
    print(text, flush=True)
    with open(f"groups-{rank}.jsonl", "a") as f:
        f.write(text + "\n")


def digest(state: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode() + state[k].detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gate", default=None)
    ap.add_argument("--backend", default="gloo")
    args = ap.parse_args()
    dist.init_process_group(None if args.backend == "none" else args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    sub = dist.new_group(list(range(world)))
    mesh = init_device_mesh("cpu", (world,))
    say(rank, {"phase": "start", **view(sub, mesh.get_group())})
    if args.gate:
        while not os.path.exists(args.gate):
            time.sleep(0.05)

    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rank": rank})
    torch.manual_seed(0)
    source = torch.nn.Linear(8, 4)
    torch.manual_seed(1 + rank)
    model = torch.nn.Linear(8, 4)
    set_model_state_dict(model, source.state_dict() if rank == 0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    dcp.async_save({"model": model.state_dict()}, checkpoint_id="dcp-async").result()
    torch.manual_seed(2 + rank)
    loaded = {"model": torch.nn.Linear(8, 4).state_dict()}
    dcp.load(loaded, checkpoint_id="dcp-async")
    whole = torch.arange(4.0 * world).reshape(2 * world, 2)
    sharded = distribute_tensor(whole, mesh, [Shard(0)])
    scattered = funcol.reduce_scatter_single(torch.arange(2.0 * world) + rank, "sum", 0, dist.group.WORLD)
    say(rank, {"phase": "after", **view(sub, mesh.get_group()), "gathered": gathered,
               "broadcast_from_rank0": digest(model.state_dict()) == digest(source.state_dict()),
               "async_save_read_back": digest(loaded["model"]) == digest(source.state_dict()),
               "full_tensor": torch.equal(sharded.full_tensor(), whole), "reduce_scatter": scattered.tolist()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
