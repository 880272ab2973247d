"""Two ranks: rank 0 sends four micro-batches a step with ``isend`` and waits on them only after all four,
as a pipeline schedule waits on its forward sends; rank 1 receives them. After step 3 both wait until
``--gate`` exists, rank 0 with its last four sends not yet waited on."""

import argparse
import os
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--gate", required=True)
args = ap.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.zeros(4)
for step in range(args.steps):
    works = []
    if rank == 0:
        works = [dist.isend(torch.full((4,), float(step * 4 + i)), 1) for i in range(4)]
    else:
        got = []
        for _ in range(4):
            dist.recv(t, 0)
            got.append(t.sum().item())
        print(f"rank 1 step {step} got {got}", flush=True)
    if step == 3:
        open(f"{args.gate}.{rank}", "w").close()
        while not os.path.exists(args.gate):
            time.sleep(0.02)
    for w in works:
        w.wait()
    if rank == 0:
        print(f"rank 0 step {step} sent", flush=True)
dist.barrier()
dist.destroy_process_group()
