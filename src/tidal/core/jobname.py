"""The name a job gets when its submitter gives none: what it runs, as a person would call it.

``python train.py`` is ``train``, ``torchrun --nproc_per_node 2 train.py`` is ``train``, ``python -m
pkg.finetune`` is ``finetune``, ``./run.sh`` is ``run``, ``sleep 600`` is ``sleep``. A command run by a shell
(``sh -c 'python train.py --lr 0.1'``, as a job file's one-line command is) is named for the command the
shell runs first, or for the shell where that is not a plain program (a script of loops and variables).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import PurePosixPath

FALLBACK = "job"

# Programs that run a script named among their arguments (the script names the job).
_INTERPRETERS = re.compile(
    r"(python|pypy)(\d+(\.\d+)?)?|torchrun|deepspeed|accelerate|horovodrun|mpirun|mpiexec|srun|uv|poetry"
    r"|node|deno|bun|ruby|perl|php|Rscript|julia|lua|java")
# Shells: ``-c STRING`` runs STRING; else they run a script as interpreters do.
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "fish"})
# Programs that run the command that follows them (after their own options and assignments).
_WRAPPERS = frozenset({"env", "exec", "nohup", "nice", "time", "stdbuf", "setsid", "ionice", "numactl",
                       "taskset", "chrt"})
_SCRIPT_SUFFIXES = frozenset({".py", ".sh", ".bash", ".zsh", ".js", ".mjs", ".ts", ".rb", ".pl", ".php", ".r", ".R",
                              ".jl", ".lua", ".jar"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
_PLAIN_PROGRAM = re.compile(r"[\w.+/-]+")
# Words a shell command may begin with that are not the program it runs.
_SHELL_WORDS = frozenset({"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac",
                          "function", "{", "}", "(", ")", "!", "[", "[[", "set", "cd", "export", "source", ".",
                          "trap", "ulimit", "umask", "echo", "printf", "test", "true", "false", ":", "eval",
                          "local", "read", "shift", "unset", "wait"})


def default_name(argv: Sequence[str], max_chars: int = 256) -> str:
    """The name of a job that runs ``argv``, when its submitter gave none (at most ``max_chars``)."""
    name = _name(list(argv), depth=0)
    return name[:max_chars] if name and name.strip() else FALLBACK


def _name(argv: list[str], depth: int) -> str | None:
    while argv and _ASSIGNMENT.fullmatch(argv[0]):  # VAR=value before the program
        argv = argv[1:]
    if not argv or depth > 4:
        return None
    prog = PurePosixPath(argv[0]).name
    args = argv[1:]
    if prog in _WRAPPERS:
        rest = [a for a in args if not a.startswith("-") and not _ASSIGNMENT.fullmatch(a) and not a.isdigit()]
        inner = _name(args[args.index(rest[0]):], depth + 1) if rest else None
        return inner or prog
    if prog in _SHELLS:
        if "-c" in args[:-1]:
            return _shell_command(args[args.index("-c") + 1], depth) or prog
        return _script(args) or prog
    if _INTERPRETERS.fullmatch(prog):
        return _script(args) or _module(args) or prog
    return _stem(prog) or None


def _shell_command(text: str, depth: int) -> str | None:
    """The name of what a shell's ``-c`` text runs first, if that is a plain command."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = re.split(r"&&|\|\||;|\|", first)[0]
    try:
        words = shlex.split(first)
    except ValueError:
        return None
    while words and _ASSIGNMENT.fullmatch(words[0]):
        words = words[1:]
    if not words or words[0] in _SHELL_WORDS or not _PLAIN_PROGRAM.fullmatch(words[0]):
        return None
    return _name(words, depth + 1)


def _script(args: list[str]) -> str | None:
    """The first argument naming a script file, without its directory and suffix."""
    for a in args:
        if a.startswith("-"):
            continue
        p = PurePosixPath(a)
        if p.suffix in _SCRIPT_SUFFIXES and p.stem:
            return p.stem
    return None


def _module(args: list[str]) -> str | None:
    """``-m package.module``: the module's own name."""
    for i, a in enumerate(args[:-1]):
        if a == "-m":
            return args[i + 1].rsplit(".", 1)[-1] or None
        if a.startswith("-m") and len(a) > 2:  # -mpackage.module
            return a[2:].rsplit(".", 1)[-1] or None
    return None


def _stem(prog: str) -> str:
    p = PurePosixPath(prog)
    return p.stem if p.suffix in _SCRIPT_SUFFIXES and p.stem else prog
