"""A job submitted without a name is named for what it runs, not for its interpreter."""

from __future__ import annotations

import pytest

from tidal.core import JobSpec
from tidal.core.jobname import default_name


@pytest.mark.parametrize(("argv", "name"), [
    (["python", "train.py"], "train"),
    (["python3", "-u", "/work/exp/train.py", "--lr", "0.1"], "train"),
    (["/usr/bin/python3.11", "scripts/finetune.py"], "finetune"),
    (["python", "-m", "mypkg.pretrain", "--steps", "10"], "pretrain"),
    (["python", "-c", "print(1)"], "python"),
    (["torchrun", "--nproc_per_node", "2", "train.py"], "train"),
    (["mpirun", "-np", "4", "python", "ddp.py"], "ddp"),
    (["sleep", "600"], "sleep"),
    (["./run.sh", "--fast"], "run"),
    (["bash", "run_all.sh"], "run_all"),
    (["env", "OMP_NUM_THREADS=1", "python", "train.py"], "train"),
    (["nice", "-n", "10", "python", "train.py"], "train"),
    (["sh", "-c", "python train.py --lr 0.1"], "train"),
    (["sh", "-c", "CUDA_VISIBLE_DEVICES=0 exec python3 eval.py && echo done"], "eval"),
    (["sh", "-c", "sleep 600"], "sleep"),
    (["sh", "-c", "\ni=0\nwhile [ $i -lt 10 ]; do echo $i; done"], "sh"),
    (["sh", "-c", "for i in 1 2; do echo $i; done"], "sh"),
    (["sh", "-c", "echo 'unbalanced"], "sh"),
    (["bash", "-c", "cd /w && python train.py"], "bash"),
])
def test_default_name(argv: list[str], name: str) -> None:
    assert default_name(argv) == name


def test_a_spec_without_a_name_gets_the_default_and_a_given_name_stays() -> None:
    assert JobSpec(command=["python", "train.py"], workdir="/w").name == "train"
    assert JobSpec(command=["python", "train.py"], workdir="/w", name="mine").name == "mine"
    assert JobSpec(command=["sh", "-c", "sleep 600"], workdir="/w").name == "sleep"


def test_a_name_is_never_longer_than_a_name_may_be() -> None:
    assert default_name(["python", "x" * 300 + ".py"], max_chars=256) == "x" * 256
    assert JobSpec(command=["python", "x" * 300 + ".py"], workdir="/w").name == "x" * 256
