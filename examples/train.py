"""A small, ordinary PyTorch CPU training script (it knows nothing of Tidal).

Prints one line per step with the loss in full precision, appends the same to ``metrics.csv`` in the
working directory, and writes the final parameters' raw bytes to ``params.bin``. An in-memory dataset
of ``--dataset-mb`` megabytes sets the size of the process image.
"""

import argparse
import hashlib
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--dataset-mb", type=float, default=8.0, help="size of the in-memory dataset")
    p.add_argument("--hidden", type=int, default=64, help="width of the hidden layers")
    p.add_argument("--depth", type=int, default=1, help="number of hidden layers")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (to watch it)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    features = 32
    rows = max(256, int(args.dataset_mb * 2**20 / (4 * (features + 1))))
    x = torch.randn(rows, features)
    y = (x @ torch.randn(features, 1) + 0.1 * torch.randn(rows, 1))
    data = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, num_workers=args.workers,
                      generator=torch.Generator().manual_seed(args.seed), persistent_workers=args.workers > 0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(features, args.hidden), torch.nn.ReLU()]
    for _ in range(args.depth - 1):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    print(f"rows={rows} workers={args.workers}", flush=True)
    step = 0
    with open("metrics.csv", "a") as metrics:
        while step < args.steps:
            for xb, yb in data:
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                line = f"step {step} loss {loss.item()!r}"
                print(line, flush=True)
                metrics.write(line + "\n")
                metrics.flush()
                if args.step_time:
                    time.sleep(args.step_time)
                if step >= args.steps:
                    break
    raw = b"".join(t.detach().contiguous().numpy().tobytes() for t in model.state_dict().values())
    with open("params.bin", "wb") as f:
        f.write(raw)
    print(f"final params sha256 {hashlib.sha256(raw).hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
