"""A small, ordinary PyTorch CUDA training script (it knows nothing of Tidal).

One process (``python train_cuda.py``) or W ranks under ``torchrun`` (DDP, ``--backend nccl`` or ``gloo``;
each rank on GPU ``LOCAL_RANK`` modulo the GPUs it sees). Prints one line per step with the loss in full
precision and, at the end, the final parameters' SHA-256 (rank 0 also writes them to ``params.bin``).
``--gpu-mb`` keeps that much random data on the GPU besides the model (its checksum is printed at the
start and the end: it must not change)."""

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (to watch it)")
    p.add_argument("--gpu-mb", type=float, default=0.0, help="extra GPU memory to hold, in MiB")
    p.add_argument("--backend", default="nccl", help="torch.distributed backend under torchrun")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    distributed = "WORLD_SIZE" in os.environ  # started by torchrun
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group(args.backend)
    torch.manual_seed(args.seed)
    gen = torch.Generator(device=device).manual_seed(args.seed + rank)
    ballast = None
    if args.gpu_mb:
        ballast = torch.rand(int(args.gpu_mb * 2**20 / 4), device=device, generator=gen)
        print(f"rank {rank} ballast {ballast.double().sum().item()!r}", flush=True)
    features = 64
    x = torch.randn(4096, features, device=device, generator=gen)
    y = x @ torch.randn(features, 1, device=device, generator=gen) + 0.1 * torch.randn(4096, 1, device=device,
                                                                                        generator=gen)
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(features, args.hidden), torch.nn.ReLU(),
                                                 torch.nn.Linear(args.hidden, 1)).to(device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, x.shape[0], (args.batch,), device=device, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item()!r}", flush=True)
        if args.step_time:
            time.sleep(args.step_time)
    if ballast is not None:
        print(f"rank {rank} ballast {ballast.double().sum().item()!r}", flush=True)
    raw = b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in model.state_dict().values())
    if rank == 0:
        with open("params.bin", "wb") as f:
            f.write(raw)
    print(f"rank {rank} final params sha256 {hashlib.sha256(raw).hexdigest()}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
