"""A script that uses torch but not torch.distributed: it must run as a Tidal rank unchanged."""

import sys

import torch

torch.manual_seed(0)
a = torch.randn(64, 64)
for _ in range(20):
    a = torch.tanh(a @ a.T / 8)
print("result", a.sum().item().hex())
print("torch.distributed initialized", torch.distributed.is_available() and torch.distributed.is_initialized())
sys.exit(0)
