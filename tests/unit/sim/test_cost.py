"""The cost model fitted from the mechanism, and the per-job image sizes."""

from __future__ import annotations

import importlib.util
import pathlib
import statistics

import pytest

from tidal.errors import ValidationError
from tidal.sim import cost_fit
from tidal.sim.cost import MODEL_SIZE_GB, CostModel, family_size_gb, model_size_gb

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _fitter():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("policy_costfit", ROOT / "benchmarks" / "policy_costfit.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_fit_reproduces_the_published_measurements() -> None:
    fit = _fitter()
    c = fit.fit(fit.PUBLISHED["crosshost"], fit.PUBLISHED["elastic"])
    gb = 1.25 * (1 << 30) / 1e9
    assert gb / c["dump_gbps"] == pytest.approx(0.72, abs=1e-3)  # plain CRIU dump of the 1.25 GiB job
    assert gb / c["restore_gbps"] == pytest.approx(0.69, abs=1e-3)
    assert gb / c["net_gbps_per_node"] == pytest.approx(1.13, abs=1e-3)
    # Over the measured resizes of the W = 4 job on one node, the model's pauses average the measured ones: those
    # restored from the store as migrations (fetch included), those from the node's images as local moves.
    world = fit.PUBLISHED["elastic"]["world"]
    model: dict[str, list[float]] = {"store": [], "local": []}
    measured: dict[str, list[float]] = {"store": [], "local": []}
    for old, new, source, pause, image in fit.PUBLISHED["elastic"]["resizes"]:
        m = CostModel(mem_per_rank_gb=image / 1e9 / world, **c)
        model[source].append(sum(m.local_move_s(world, old, new)) if source == "local"
                             else m.migration_s(world, new, 1))
        measured[source].append(pause)
    for source in ("store", "local"):
        assert statistics.mean(model[source]) == pytest.approx(statistics.mean(measured[source]), abs=0.01)
    assert statistics.mean(measured["local"]) < statistics.mean(measured["store"]) / 2


def test_the_constants_file_is_the_fit_of_its_sources() -> None:
    fit = _fitter()
    c = fit.fit(fit.PUBLISHED["crosshost"], fit.PUBLISHED["elastic"])
    written = (cost_fit.DUMP_GBPS, cost_fit.RESTORE_GBPS, cost_fit.NET_GBPS_PER_NODE, cost_fit.FIXED_S,
               cost_fit.LOCAL_FIXED_S)
    assert written == (c["dump_gbps"], c["restore_gbps"], c["net_gbps_per_node"], c["fixed_s"], c["local_fixed_s"])
    assert len(cost_fit.SOURCES) == 2


def test_checkpoint_restore_and_migration_as_functions_of_size_ranks_and_links() -> None:
    m = CostModel(mem_per_rank_gb=None, dump_gbps=2.0, restore_gbps=4.0, net_gbps_per_node=1.0, fixed_s=1.0,
                  local_fixed_s=0.25)
    # 8 ranks of 6 GB: the ranks of a node dump one after the other, the nodes in parallel.
    assert m.checkpoint_s(8, 4, 1, mem_gb=6.0) == pytest.approx(1 + 8 * 6 / 2)
    assert m.checkpoint_s(8, 4, 2, mem_gb=6.0) == pytest.approx(1 + 4 * 6 / 2)
    # Restore on 2 nodes: 48 GB over two 1 GB/s links, then 2 ranks a device at 4 GB/s.
    assert m.restore_s(8, 4, 2, mem_gb=6.0) == pytest.approx(1 + 48 / 2 + 2 * 6 / 4)
    assert m.restore_s(8, 4, 2, mem_gb=6.0, cross_region=True) == pytest.approx(1 + 48 / 0.5 + 3)
    assert m.migration_s(8, 4, 2, mem_gb=6.0) == pytest.approx(13 + 28)
    # A resize within one node, 4 devices to 2: dumped there, restored from there (nothing fetched).
    assert m.local_move_s(8, 4, 2, mem_gb=6.0) == pytest.approx((0.25 + 8 * 6 / 2, 0.25 + 4 * 6 / 4))


def test_a_job_image_comes_from_its_trace_else_the_distribution() -> None:
    m = CostModel()
    assert m.mem_gb("j1", 3.5) == 3.5
    assert m.mem_gb("j1") == model_size_gb("j1") in {gb for _, gb in MODEL_SIZE_GB}
    assert CostModel(mem_per_rank_gb=1.0).mem_gb("j1", 3.5) == 1.0
    assert family_size_gb("ResNet-50 (batch size 64)") == 6.0 and family_size_gb("unknown") is None
    sizes = [model_size_gb(f"j{i}") for i in range(20000)]
    for share, gb in MODEL_SIZE_GB:
        assert sizes.count(gb) / len(sizes) == pytest.approx(share, abs=0.02)


def test_a_gpu_jobs_checkpoint_copies_its_gpu_memory_to_the_host_then_dumps_host_and_gpu_memory() -> None:
    """Arithmetic only: the copy rate is a parameter (to be measured on a GPU), nothing here is measured."""
    m = CostModel(dump_gbps=2.0, restore_gbps=4.0, net_gbps_per_node=1.0, fixed_s=1.0, gpu_mem_per_rank_gb=16.0,
                  d2h_gbps=20.0, h2d_gbps=20.0)
    assert m.image_gb(mem_gb=4.0) == 20.0  # GPU memory in use + host memory
    # 8 ranks on 4 GPUs of a node: per GPU two ranks, one after the other, each copy 16 GB at 20 GB/s; then the
    # node's 8 ranks dump 20 GB each at 2, one after the other.
    assert m.checkpoint_s(8, 4, 1, mem_gb=4.0) == pytest.approx(1 + 2 * 16 / 20 + 8 * 20 / 2)
    # Restore on 2 nodes: 8 images of 20 GB over two 1 GB/s links, then per GPU two ranks restore their 20 GB at 4
    # and copy 16 GB back at 20 GB/s.
    assert m.restore_s(8, 4, 2, mem_gb=4.0) == pytest.approx(1 + 160 / 2 + 2 * (20 / 4 + 16 / 20))
    assert m.migration_s(8, 4, 2, mem_gb=4.0) == pytest.approx(
        m.checkpoint_s(8, 4, 2, mem_gb=4.0) + m.restore_s(8, 4, 2, mem_gb=4.0))
    # A job's own GPU memory wins over the model's; a copy back at its own rate.
    assert m.checkpoint_s(1, 1, 1, mem_gb=1.0, gpu_gb=40.0) == pytest.approx(1 + 40 / 20 + 41 / 2)
    back = CostModel(dump_gbps=2.0, restore_gbps=4.0, net_gbps_per_node=1.0, fixed_s=1.0, gpu_mem_per_rank_gb=8.0,
                     d2h_gbps=20.0, h2d_gbps=40.0)
    assert back.restore_s(1, 1, 1, mem_gb=2.0) == pytest.approx(1 + 10 / 1 + 10 / 4 + 8 / 40)


def test_without_gpu_memory_the_costs_are_the_cpu_jobs() -> None:
    """Arithmetic only: the default GPU memory is 0, and then the copy rate does not matter."""
    old = dict(dump_gbps=2.0, restore_gbps=4.0, net_gbps_per_node=1.0, fixed_s=1.0)
    for m in (CostModel(**old), CostModel(**old, d2h_gbps=0.5)):
        assert m.gpu_mem_per_rank_gb == 0.0
        assert m.checkpoint_s(8, 4, 1, mem_gb=6.0) == pytest.approx(1 + 8 * 6 / 2)
        assert m.restore_s(8, 4, 2, mem_gb=6.0) == pytest.approx(1 + 48 / 2 + 2 * 6 / 4)
    # The defaults: the rates measured on an H100 (benchmarks/gpu_checkpoint.py, 40 GB).
    assert (CostModel().d2h_gbps, CostModel().h2d_gbps) == (2.2, 6.8)


@pytest.mark.parametrize(("kw", "field"), [({"d2h_gbps": 0.0}, "d2h_gbps"), ({"h2d_gbps": -1.0}, "h2d_gbps"),
                                           ({"gpu_mem_per_rank_gb": -1.0}, "gpu_mem_per_rank_gb")])
def test_bad_gpu_parameters_are_refused(kw: dict[str, float], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        CostModel(**kw)  # type: ignore[arg-type]
    assert e.value.fields["field"] == field
