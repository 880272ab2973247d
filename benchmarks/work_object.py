"""What the work object the interposer hands out for each op costs, and what other forms of it would cost.

The interposer returns, for every op, its own work (``TidalWork``) around gloo's: the teardown before a dump
must be able to let go of gloo's work, as a work the script keeps holds its group's connections open, and a
point-to-point work must be waited on once only. This measures, in the ranks of a group of torch's own (no
Tidal job, no interposer), the CPU time of the calling thread per op and wait, with gloo's work used as
torch returns it, and in each other form:

- ``gloo``: gloo's work as torch returns it (the baseline: what the script gets under ``torchrun``);
- ``tidal``: the interposer's ``TidalWork`` around it, made as the interposer makes it;
- ``plain``: a Python object with slots and a forwarding ``wait()``; not a ``dist.Work``, so it could not go
  back to torch's C++ callers (DDP's reducer): the least any Python form could cost;
- ``cxx``: a ``Work`` subclass written in C++ (one wait at a time under a mutex, a registry of weak
  references for the let-go), built here with ``torch.utils.cpp_extension`` (needs a C++ compiler; left
  out, with a note, where there is none).

The ops are an all-reduce of 16 floats and a send of 16 floats from rank 0 to rank 1, each waited on at
once, in W = 2 ranks on this machine; and the all-reduce in W = 1 (no peer: the calls run back to back,
with warm caches). Blocks of each form alternate in the same processes, so that the differences are what
the forms cost, apart from the machine's noise. Results: docs/distributed.md, "What the interposer costs".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import BenchmarkError, arguments, base_env, machine, run, say, workspace, write_json

# The C++ form: what a Work written in C++ would have to do (wait once, let go at a teardown), no more.
CXX_SOURCE = r"""
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <atomic>
#include <mutex>
#include <vector>

namespace {
class CxxWork : public c10d::Work {
 public:
  explicit CxxWork(c10::intrusive_ptr<c10d::Work> inner)
      : c10d::Work(-1, inner->retrieveOpType()), inner_(std::move(inner)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    if (waited_.load(std::memory_order_acquire)) return true;
    std::lock_guard<std::mutex> lock(mutex_);
    if (waited_.load(std::memory_order_relaxed) || !inner_) return true;
    bool ok = inner_->wait(timeout);
    if (ok) waited_.store(true, std::memory_order_release);
    return ok;
  }
  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return waited_.load() || !inner_ || inner_->isCompleted();
  }
  void letGo() { std::lock_guard<std::mutex> lock(mutex_); inner_.reset(); }
 private:
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::Work> inner_;
  std::atomic<bool> waited_{false};
};

std::mutex registry_mutex;
std::vector<c10::weak_intrusive_ptr<CxxWork>> registry;
size_t prune_at = 64;

c10::intrusive_ptr<c10d::Work> wrap(const c10::intrusive_ptr<c10d::Work>& inner) {
  auto w = c10::make_intrusive<CxxWork>(inner);
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.emplace_back(w);
  if (registry.size() >= prune_at) {
    std::vector<c10::weak_intrusive_ptr<CxxWork>> kept;
    for (auto& r : registry) if (!r.expired()) kept.push_back(std::move(r));
    registry.swap(kept);
    prune_at = 2 * registry.size() + 64;
  }
  return w;
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("wrap", &wrap); }
"""


def build_cxx(build_dir: Path) -> Any:
    """The C++ form's module, built in ``build_dir`` (reused when up to date), or None without a compiler."""
    import shutil

    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return None
    from torch.utils.cpp_extension import load_inline

    build_dir.mkdir(parents=True, exist_ok=True)
    return load_inline("tidal_bench_cxx_work", cpp_sources=[CXX_SOURCE], build_directory=str(build_dir),
                       extra_cflags=["-O2"], verbose=False)


def rank_main(rank: int, world: int, port: int, blocks: int, block: int, build_dir: str) -> None:
    """One rank: alternating blocks of each form and op; prints its medians (µs per op) as one JSON line."""
    import torch
    import torch.distributed as dist

    from tidal.mechanisms.interpose import rankside

    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    group = dist.ProcessGroupGloo(store, rank, world)
    tidal_work = rankside._make_work_class(dist)
    cxx = build_cxx(Path(build_dir)) if build_dir else None

    class Plain:
        __slots__ = ("_w",)

        def __init__(self, w: Any) -> None:
            self._w = w

        def wait(self) -> bool:
            return bool(self._w.wait())

    def tidal(inner: Any, p2p: bool) -> Any:
        w = tidal_work()  # as the interposer's _call makes it
        w._w = inner
        if p2p:
            w._p2p = True
        return w

    wrap = {"gloo": lambda w, p2p: w, "tidal": tidal, "plain": lambda w, p2p: Plain(w)}
    if cxx is not None:
        wrap["cxx"] = lambda w, p2p: cxx.wrap(w)
    t = torch.zeros(16)

    def allreduce(form: Any) -> None:
        form(group.allreduce([t]), False).wait()

    def p2p(form: Any) -> None:
        form(group.send([t], 1, 0) if rank == 0 else group.recv([t], 0, 0), True).wait()

    ops = {"allreduce": allreduce} | ({"send": p2p} if world == 2 else {})
    cpu: dict[tuple[str, str], list[float]] = {(f, o): [] for f in wrap for o in ops}
    wall: dict[tuple[str, str], list[float]] = {k: [] for k in cpu}
    forms = list(wrap)
    for i in range(blocks):
        # A different form first in each round: none always follows another.
        for name in forms[i % len(forms):] + forms[:i % len(forms)]:
            for op, fn in ops.items():
                form = wrap[name]
                start, start_cpu = time.perf_counter(), time.thread_time()
                for _ in range(block):
                    fn(form)
                cpu[(name, op)].append((time.thread_time() - start_cpu) / block * 1e6)
                wall[(name, op)].append((time.perf_counter() - start) / block * 1e6)
    print(json.dumps({"rank": rank, "forms": forms, "results": [
        {"form": f, "op": o, "cpu_us": statistics.median(cpu[(f, o)]), "wall_us": statistics.median(wall[(f, o)])}
        for f, o in cpu]}), flush=True)


def job(world: int, blocks: int, block: int, build_dir: Path | None) -> list[dict[str, Any]]:
    """Run ``world`` ranks of :func:`rank_main` on a store of this process; their results."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world_size=world + 1, is_master=True, wait_for_workers=False)
    env = base_env() | {"PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                                        str(Path(__file__).resolve().parent)])}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world", str(world),
                               "--port", str(store.port), "--blocks", str(blocks), "--block", str(block),
                               "--build-dir", str(build_dir or "")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode:
            raise BenchmarkError(f"a rank of the W = {world} run failed: {err.strip()[-800:]}",
                                 hint="see its error above; the C++ form needs torch's headers and a compiler")
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def main() -> int:
    p = arguments(__doc__, "/tmp/tidal-bench-work-object")
    p.add_argument("--blocks", type=int, default=60, help="blocks of each form and op per rank (default 60)")
    p.add_argument("--block", type=int, default=200, help="ops per block (default 200)")
    p.add_argument("--no-cxx", action="store_true", help="leave the C++ form out (no build)")
    # The ranks' own options (the script runs itself as each rank).
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--build-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank >= 0:
        rank_main(args.rank, args.world, args.port, args.blocks, args.block, args.build_dir)
        return 0
    out: dict[str, Any] = {"machine": machine(with_torch=True), "blocks": args.blocks, "block": args.block}
    with workspace(args.dir) as work:
        build_dir = None
        if not args.no_cxx:
            say("building the C++ form (about 20 s)")
            if build_cxx(work / "cxx") is None:
                say("no C++ compiler: the C++ form is left out")
            else:
                build_dir = work / "cxx"
        rows = []
        for world in (1, 2):
            say(f"W = {world}: {args.blocks} blocks of {args.block} ops per form and op")
            for r in job(world, args.blocks, args.block, build_dir):
                base = {x["op"]: x["cpu_us"] for x in r["results"] if x["form"] == "gloo"}
                rows += [{"world": world, "rank": r["rank"], **x, "added_cpu_us": x["cpu_us"] - base[x["op"]]}
                         for x in r["results"]]
    out["results"] = rows
    print(f"{'W':>2} {'rank':>4} {'op':<10} {'form':<6} {'CPU µs/op':>10} {'added':>7} {'wall µs/op':>10}")
    for x in rows:
        print(f"{x['world']:>2} {x['rank']:>4} {x['op']:<10} {x['form']:<6} {x['cpu_us']:>10.2f} "
              f"{x['added_cpu_us']:>+7.2f} {x['wall_us']:>10.2f}")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
