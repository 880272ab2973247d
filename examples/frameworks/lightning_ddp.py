"""A small regression model trained with PyTorch Lightning, ``Trainer(strategy="ddp", accelerator="cpu")``, as
run by ``torchrun --nproc-per-node 2 lightning_ddp.py``: Lightning sees torchrun's environment and starts no
processes of its own; its default logger (TensorBoard, under ``lightning_logs/``) and its checkpointing are on.
Every 4 steps a validation loop logs its loss averaged over the ranks (``sync_dist=True``): Lightning chooses how
to average, and whether to validate under ``no_grad`` or ``inference_mode``, by ``torch.distributed.get_backend()``.

Each rank prints ``rank R step N loss HEX`` per step and ``rank R step N val_loss HEX inference_mode B`` per
validation, and writes its parameters to ``params-R.bin`` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        print(f"rank {self.global_rank} step {self.global_step} loss {float(loss.detach()).hex()}", flush=True)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        self._inference = torch.is_inference_mode_enabled()
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        loss = float(self.trainer.callback_metrics["val_loss"])
        print(f"rank {self.global_rank} step {self.global_step} val_loss {loss.hex()} "
              f"inference_mode {self._inference}", flush=True)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


# -- holding the run at a step (for tests): from STEP on, wait until PATH exists --------------------------
class Gate(L.Callback):
    def __init__(self, spec: str) -> None:
        self.path, step = spec.rsplit(":", 1)
        self.step = int(step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # type: ignore[no-untyped-def]
        while trainer.global_step >= self.step and not os.path.exists(self.path):
            time.sleep(0.02)


# ----------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--gate", default=None, metavar="PATH:STEP")
    args = ap.parse_args()

    L.seed_everything(0)
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True).sin()), batch_size=16, shuffle=True)
    v = torch.randn(64, 16, generator=torch.Generator().manual_seed(2))
    val = DataLoader(TensorDataset(v, v.sum(dim=1, keepdim=True).sin()), batch_size=16)
    model = Regressor()
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=args.steps, log_every_n_steps=1,
                        val_check_interval=4, num_sanity_val_steps=0, enable_progress_bar=False,
                        enable_model_summary=False,
                        callbacks=[Gate(args.gate)] if args.gate else [])
    trainer.fit(model, data, val)
    with open(f"params-{trainer.global_rank}.bin", "wb") as f:
        for p in model.parameters():
            f.write(p.detach().contiguous().numpy().tobytes())
    print(f"rank {trainer.global_rank} done", flush=True)


if __name__ == "__main__":
    main()
