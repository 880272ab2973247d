"""A tiny GPT-2 (built from a config, no download) trained with Hugging Face ``transformers``' ``Trainer``,
as run by ``torchrun --nproc-per-node 2 hf_trainer.py``: DDP on CPU with gloo, the Trainer's own checkpoints
saved every few steps under ``out/`` (the two newest kept), the final model saved with ``save_model``.

Each rank prints ``rank R step N loss HEX`` per step and writes its parameters to ``params-R.bin`` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

VOCAB, SEQ = 64, 16


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, made here from a seed."""

    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LoggingTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        loss = out[0] if return_outputs else out
        print(f"rank {self.args.process_index} step {self.state.global_step} loss {float(loss.detach()).hex()}",
              flush=True)
        return out


# -- holding the run at a step (for tests): from STEP on, wait until PATH exists --------------------------
class Gate(TrainerCallback):
    def __init__(self, spec: str) -> None:
        self.path, step = spec.rsplit(":", 1)
        self.step = int(step)

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        while state.global_step >= self.step and not os.path.exists(self.path):
            time.sleep(0.02)


# ----------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--gate", default=None, metavar="PATH:STEP")
    args = ap.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    targs = TrainingArguments(
        output_dir="out", max_steps=args.steps, per_device_train_batch_size=4, learning_rate=1e-3,
        save_strategy="steps", save_steps=4, save_total_limit=2, logging_steps=1, report_to="none",
        use_cpu=True, ddp_backend="gloo", seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = LoggingTrainer(model=model, args=targs, train_dataset=Tokens(256),
                             callbacks=[Gate(args.gate)] if args.gate else [])
    trainer.train()
    trainer.save_model("out/final")
    rank = targs.process_index
    with open(f"params-{rank}.bin", "wb") as f:
        for p in model.parameters():
            f.write(p.detach().contiguous().numpy().tobytes())
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
