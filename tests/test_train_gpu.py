"""The GPU training benchmark (lssim.benchmarks.train_gpu) on the CPU: what it times and how it counts FLOPs."""

import pandas as pd
import pytest

from lssim.benchmarks.train_gpu import COLUMNS, measure, verl_flops
from lssim.cost import MODELS


def test_flops_are_verls_count():
    m = MODELS["qwen2.5-7b"]
    # 2 x params x tokens + 2 x s^2 x head_dim x heads x layers per forward; x3 with the backward
    forward = 2 * m.params * 4 * 2048 + 2 * 4 * 2048**2 * m.head_dim * m.n_heads * m.n_layers
    assert verl_flops("qwen2.5-7b", 2048, 4, backward=False) == pytest.approx(forward)
    assert verl_flops("qwen2.5-7b", 2048, 4) == pytest.approx(3 * forward)
    # the same tokens in longer sequences cost more (attention)
    assert verl_flops("qwen2.5-7b", 8192, 1) > verl_flops("qwen2.5-7b", 512, 16)


def test_measure_times_both_phases_of_every_cell_on_cpu():
    table = measure("tiny-ref", 32, [8, 16], device="cpu", dtype="float32", warmup=0, iters=1, log=lambda *_: None)
    assert list(table.columns) == COLUMNS
    assert table[["phase", "seq_len", "n_seqs"]].values.tolist() == [
        ["fwd_bwd", 8, 4], ["fwd", 8, 4], ["fwd_bwd", 16, 2], ["fwd", 16, 2]]
    assert (table["seconds"] > 0).all()
    pd.testing.assert_series_equal(table["mfu"], table["flops"] / table["seconds"] / 989e12, check_names=False)
    with pytest.raises(ValueError, match="not a multiple of seq_len 5"):
        measure("tiny-ref", 32, [5], device="cpu", dtype="float32", warmup=0, iters=1, log=lambda *_: None)


def test_the_shipped_h100_measurement_is_below_the_analytic_default():
    """lssim/profiles/h100_train_mfu.csv (a lent H100, 2026-11-26): what docs/training.md reports."""
    from pathlib import Path

    import lssim
    from lssim.sim.training import AnalyticTrainCost

    table = pd.read_csv(Path(lssim.__file__).parent / "profiles" / "h100_train_mfu.csv")
    assert set(table["model"]) == {"qwen2.5-1.5b", "qwen2.5-7b"} and len(table) == 12
    assert table["mfu"].between(0.1, AnalyticTrainCost().mfu).all()
