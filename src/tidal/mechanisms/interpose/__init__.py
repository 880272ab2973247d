"""The interposer: code injected into every rank (``site/sitecustomize.py`` → ``rankside.py``) that
makes ``torch.distributed`` checkpointable, and the agent's side of its channel (``channel.py``)."""

from pathlib import Path

SITE_DIR = Path(__file__).with_name("site")
