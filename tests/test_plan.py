"""lssim plan: modes x device splits x staleness bounds x policies, ranked end to end, bounds respected."""

import json

import pytest

from lssim.cli import main
from lssim.analysis.plan import PlanSpace, plan
from lssim.analysis.replay import SimSetup
from lssim.traces.synth import get_preset, synthesize


@pytest.fixture(scope="module")
def trace():
    return synthesize(get_preset("math7b").replace(steps=3, prompts_per_step=16, group_size=4, n_prompts=48, max_tokens=4096))


def test_plan_ranks_every_candidate_and_never_picks_one_over_a_stated_bound(trace):
    space = PlanSpace(devices=4, rollout_fractions=(0.5,), staleness=(1, 2), policies=("baseline", "april"), max_staleness=1)
    table = plan(trace, space, SimSetup(max_num_seqs=64), workers=1)
    # collocated 4; disaggregated, hybrid 2+2; async 2+2 at K=1 and K=2: 5 setups x 2 policies
    assert len(table) == 10
    assert set(table["mode"]) == {"collocated 4", "disaggregated 2+2", "hybrid 2+2", "async 2+2 K=1 roll", "async 2+2 K=2 roll"}
    assert table.iloc[0]["within_bounds"] and table.iloc[0]["max_staleness"] <= 1
    ok = table[table["within_bounds"]]
    assert (ok["trained_tokens_per_second"].diff().dropna() <= 1e-9).all()  # best first among those within bounds
    assert not table.loc[table["max_staleness"] > 1, "within_bounds"].any()
    base = table[(table["mode"] == "collocated 4") & (table["policy"] == "baseline")]
    assert base["speedup"].iloc[0] == pytest.approx(1.0)
    front = table[table["pareto"]]
    for _, row in table.iterrows():  # nothing on the front is beaten on both throughput and stale share
        beaten = (table["trained_tokens_per_second"] > row["trained_tokens_per_second"]) & \
                 (table["stale_token_fraction"] < row["stale_token_fraction"])
        assert not (row["pareto"] and beaten.any())
    assert len(front) >= 1


def test_plan_cli_prints_a_ranked_table_and_json(tmp_path, trace, capsys):
    from lssim.traces.trace import write_trace

    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    assert main(["plan", str(path), "--devices", "4", "--policies", "baseline", "--rollout-fractions", "0.5",
                 "--staleness-bounds", "1", "--max-num-seqs", "64", "--workers", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"] == 4 and len(data["candidates"]) == 4
    assert main(["plan", str(path), "--devices", "4", "--policies", "baseline", "--modes", "collocated,hybrid",
                 "--rollout-fractions", "0.5", "--max-num-seqs", "64", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "best:" in out and "hybrid 2+2" in out and "collocated 4" in out


def test_no_option_is_reachable_by_an_abbreviation(tmp_path, trace, capsys):
    from lssim.traces.trace import write_trace

    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    with pytest.raises(SystemExit) as e:
        main(["replay", str(path), "--mod", "async"])  # once taken for --model
    assert e.value.code == 2
    assert "unrecognized arguments: --mod" in capsys.readouterr().err


def test_sweep_never_picks_a_composition_over_a_stated_bound(tmp_path, trace, capsys):
    from lssim.analysis.sweep import sweep
    from lssim.traces.trace import write_trace

    table = sweep(trace, ["april", "seer"], max_size=1, setup=SimSetup(n_instances=2, max_num_seqs=64), workers=1,
                  max_off_policy=0.0)
    assert table.loc["april", "off_policy_token_fraction"] > 0 and not table.loc["april", "within_bounds"]
    assert table.index[0] in ("seer", "baseline") and table["within_bounds"].iloc[0]
    assert list(table["within_bounds"]) == sorted(table["within_bounds"], reverse=True)  # bound-keepers first
    assert table.loc["baseline", "speedup"] == pytest.approx(1.0) and table.loc["baseline", "rollout_speedup"] == pytest.approx(1.0)
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    assert main(["sweep", str(path), "--policies", "april,seer", "--max-size", "1", "--instances", "2",
                 "--max-num-seqs", "64", "--workers", "1", "--max-off-policy", "0"]) == 0
    out = capsys.readouterr().out
    assert "best: april" not in out and "best: " in out
