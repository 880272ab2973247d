"""A distributed script that hangs: after one all-reduce together, rank 0 waits in a second one that rank 1
never joins (it sleeps). Plain ``torchrun`` would wait for ever too."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} reduced {t.item():.0f}", flush=True)
if dist.get_rank() == 0:
    dist.all_reduce(t)
else:
    while True:
        time.sleep(1)
