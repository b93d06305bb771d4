"""The real backend's measurement scripts (paper/experiments/measure_*.py) and the engine's own accounting of the caller's
time (VLLMEngine.waited_between)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lssim.cli import main


def test_measure_spec_engine_refuses_no_rounds(capsys):
    from paper.experiments.measure_spec_engine import main

    with pytest.raises(SystemExit) as e:
        main(["--rounds", "0"])
    assert e.value.code == 2 and "--rounds must be >= 1" in capsys.readouterr().err


def test_iteration_log_groups_an_instances_tokens_into_its_iterations():
    """measure_run_vs_cell --iterations: one group per engine iteration of an instance, however the driver takes
    its tokens (two iterations back to back, or one in two bursts)."""
    from paper.experiments.measure_run_vs_cell import IterationLog

    log = IterationLog.__new__(IterationLog)
    log.tag, log.rows = None, []
    for i in range(5):  # 5 iterations 4 ms apart on instance 0 (4 requests), 6 ms apart on instance 1 (2)
        log.rows += [("run", 0, 0.004 * i + k * 1e-5, f"a{k}") for k in range(4)]
        log.rows += [("run", 1, 0.006 * i + k * 1e-5, f"b{k}") for k in range(2)]
    late = 0.02 + 1e-4  # instance 0's driver fell behind: iterations 5 and 6 handed over back to back
    log.rows += [("cell", 0, late + k * 1e-5, f"a{k}") for k in range(8 // 2)] + \
                [("cell", 0, late + 5e-5 + k * 1e-5, f"a{k}") for k in range(4)]
    split = 0.03  # one iteration of 4 taken in two bursts 2 ms apart (the driver busy with the other instance)
    log.rows += [("split", 0, split + (0.002 if k >= 2 else 0.0), f"s{k}") for k in range(4)]
    log.rows += [("split", 0, split + 0.005 + k * 1e-5, f"s{k}") for k in range(4)]
    it = log.iterations()
    assert it[it["tag"] == "split"]["n_seqs"].tolist() == [4]  # one iteration (the second's gap is the last: dropped)
    run = it[it["tag"] == "run"]
    assert run.groupby("instance")["n_seqs"].apply(set).to_dict() == {0: {4}, 1: {2}}
    assert run.groupby("instance")["seconds"].median().round(6).to_dict() == {0: 0.004, 1: 0.006}
    assert (it[it["tag"] == "cell"]["n_seqs"] == 4).all()  # two iterations, not one of 8


def test_measure_neighbour_sorts_instance_zeros_iterations_by_whether_the_other_was_busy():
    """paper.experiments.measure_neighbour: instance 0's iterations beside an instance producing tokens are 'other_busy',
    those of a cell where it ran alone, or after the other went quiet, are not; the table takes medians of each."""
    from paper.experiments.measure_neighbour import table, with_other_busy
    from paper.experiments.measure_run_vs_cell import IterationLog

    log = IterationLog.__new__(IterationLog)
    log.tag, log.rows = None, []
    for i in range(10):  # light: instance 0 iterates every 3 ms beside instance 1 for 10 iterations
        log.rows += [("light.1", 0, 0.003 * i + k * 1e-5, f"a{k}") for k in range(2)]
        log.rows += [("light.1", 1, 0.003 * i + 0.001 + k * 1e-5, f"b{k}") for k in range(2)]
    for i in range(10):  # alone: every 2 ms, instance 1 silent
        log.rows += [("alone.2", 0, 1.0 + 0.002 * i + k * 1e-5, f"c{k}") for k in range(2)]  # cells one after another
    for i in range(30):  # stagger: instance 1 busy for the first 10 of instance 0's iterations (3 ms), then 2 ms
        t = 2.0 + 0.003 * min(i, 10) + 0.002 * max(0, i - 10)  # (within 10 ms of its last token still counts as busy)
        log.rows += [("stagger.3", 0, t + k * 1e-5, f"d{k}") for k in range(2)]
        if i < 10:
            log.rows += [("stagger.3", 1, t + 0.001, "e0")]
    it = with_other_busy(log)
    assert set(it["instance"]) == {0} and set(it["kind"]) == {"light", "alone", "stagger"}
    t = table(it)
    assert t.loc[("light", True), "median_ms"] == pytest.approx(3.0, abs=0.05)
    assert t.loc[("alone", False), "median_ms"] == pytest.approx(2.0, abs=0.05)
    assert ("alone", True) not in t.index
    assert t.loc[("stagger", True), "median_ms"] == pytest.approx(3.0, abs=0.05)
    assert t.loc[("stagger", False), "median_ms"] == pytest.approx(2.0, abs=0.05)


def test_measure_neighbour_grid_reads_each_iteration_beside_the_others_load():
    """--grid: an iteration's other_n is the other instance's sequences while that one still iterates, 0 after it
    finished or in a cell it sat out; the table takes medians by (own, other's) and divides by the alone column."""
    from paper.experiments.measure_neighbour import grid_table, with_other_load
    from paper.experiments.measure_run_vs_cell import IterationLog

    log = IterationLog.__new__(IterationLog)
    log.tag, log.rows = None, []
    for i in range(20):  # 2 sequences on instance 0 every 3 ms beside 4 on instance 1 for 10 iterations, then every 2 ms
        t = 0.003 * min(i, 10) + 0.002 * max(0, i - 10)
        log.rows += [("2_4.1", 0, t + k * 1e-5, f"a{k}") for k in range(2)]
        if i < 10:
            log.rows += [("2_4.1", 1, t + 0.001 + k * 1e-5, f"b{k}") for k in range(4)]
    for i in range(10):  # alone: every 2 ms
        log.rows += [("2_0.2", 0, 1.0 + 0.002 * i + k * 1e-5, f"c{k}") for k in range(2)]
    it = with_other_load(log)
    mine = it[(it["instance"] == 0) & (it["tag"] == "2_4.1")]
    assert mine["other_n"].tolist()[:9] == [4] * 9 and set(mine["other_n"].tolist()[11:]) == {0}
    assert set(it.loc[it["instance"] == 1, "other_n"]) == {2}  # instance 1 beside instance 0's two
    ms, over_alone = grid_table(it, sizes=(2, 4))
    assert ms.loc[2, 4] == pytest.approx(3.0, abs=0.05) and ms.loc[2, 0] == pytest.approx(2.0, abs=0.05)
    assert over_alone.loc[2, 4] == pytest.approx(1.5, abs=0.03) and over_alone.loc[2, 0] == 1.0


def test_measure_submit_latency_fits_how_late_first_tokens_come_per_request(capsys):
    """paper.experiments.measure_submit_latency: per n, how late the median and last first token are against the twin's
    price, and a line through the last one's lateness; bad flags and an unknown world exit 2 before any engine."""
    from paper.experiments.measure_submit_latency import late_table, main

    cells = pd.DataFrame({"n": [8, 8, 32, 32, 64], "first_median_ms": [9.0, 11.0, 20.0, 20.0, 36.0],
                          "first_last_ms": [11.0, 13.0, 26.0, 26.0, 40.0], "twin_ms": [8.0, 8.0, 11.0, 11.0, 15.0]})
    table, fixed, per_request = late_table(cells)
    assert table.loc[8, "late_median_ms"] == pytest.approx(2.0) and table.loc[32, "late_last_ms"] == pytest.approx(15.0)
    assert per_request == pytest.approx(np.polyfit([8, 32, 64], [4.0, 15.0, 25.0], 1)[0])
    assert fixed == pytest.approx(np.polyfit([8, 32, 64], [4.0, 15.0, 25.0], 1)[1])
    for argv in (["--sizes", "8,x"], ["--sizes", "0"], ["--rounds", "0"]):
        assert main(argv) == 2 and "--sizes" in capsys.readouterr().err
    assert main(["--world", "nowhere"]) == 2 and "no world 'nowhere'" in capsys.readouterr().err


def test_measure_driver_core_reads_each_instances_last_finish_per_step():
    """paper.experiments.measure_driver_core: per step, each instance's last finish (a carried response in the step it ended
    in; unfinished and never-run ones left out), and per setting how often instance 0 ended last."""
    from paper.experiments.measure_driver_core import instance_ends, summary

    trace = pd.DataFrame({"step": [0, 0, 0, 0, 1, 1, 1],
                          "end_step": [0, 0, 0, 1, 1, 1, 1],
                          "instance": [0, 1, 1, 0, 0, 1, -1],
                          "finish_time": [1.0, 0.7, 0.8, 0.2, 0.9, 1.2, 0.0]})
    ends = instance_ends(trace)
    assert ends[["step", "end0", "end1"]].values.tolist() == [[0, 1.0, 0.8], [1, 0.9, 1.2]]
    assert ends["diff"].round(6).tolist() == [0.2, -0.3]
    s = summary(pd.concat([ends.assign(setting="free"), ends.assign(setting="cpu0", diff=[0.1, 0.3])]))
    assert s.loc["free", "steps"] == 2 and s.loc["free", "instance0_last"] == 0.5 and s.loc["cpu0", "instance0_last"] == 1.0


@pytest.mark.parametrize("module", ["measure_neighbour", "measure_driver_core", "measure_stream_interval"])
def test_the_two_instance_measurements_refuse_a_world_of_one_instance_by_name(module, capsys):
    """--world must name a world of two instances (WorkloadTable.world_of): exit status 2, nothing started."""
    import importlib

    main_ = importlib.import_module(f"paper.experiments.{module}").main
    assert main_(["--world", "default"]) == 2
    assert "--world 'default': not a world of 2 instances" in capsys.readouterr().err
    assert main_(["--world", "nowhere"]) == 2
    assert "--world 'nowhere'" in capsys.readouterr().err


def test_measure_gc_stall_refuses_an_unknown_world_by_name(capsys):
    from paper.experiments.measure_gc_stall import main

    assert main(["--world", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "no world 'nowhere'" in err and "default" in err
    assert main(["--rounds", "0"]) == 2


@pytest.mark.parametrize("module", ["measure_cpu_share", "measure_run_vs_cell"])
def test_the_run_measurements_refuse_an_unknown_world_by_name(module, capsys):
    """An unknown --world exits 2 naming the worlds there are, before any engine starts (not a KeyError)."""
    import importlib

    assert importlib.import_module(f"paper.experiments.{module}").main(["--world", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "no world 'nowhere'" in err and "placed" in err


def test_measure_stream_interval_summarises_rounds_against_the_first_interval(capsys):
    from paper.experiments.measure_stream_interval import main, summary

    rows = pd.DataFrame({"interval": [1, 32, 1, 32, 1, 32], "round": [0, 0, 1, 1, 2, 2],
                         "rollout_s": [10.0, 9.0, 8.0, 8.5, 9.0, 8.0], "driver_cpu": [0.4, 0.3, 0.4, 0.3, 0.5, 0.3],
                         "finish_diff_std": [0.2, 0.1, 0.3, 0.2, 0.2, 0.1]})
    out = summary(rows)
    assert out.loc[1, "rollout_s"] == 9.0 and out.loc[32, "rollout_s"] == 8.5
    assert out.loc[32, "rounds_faster_than_first"] == "2 of 3" and out.loc[1, "rounds_faster_than_first"] == "0 of 3"
    assert main(["--intervals", "1,0"]) == 2
    assert "--intervals '1,0'" in capsys.readouterr().err
    assert main(["--intervals", "a"]) == 2


def test_waited_between_sums_the_callers_waits_inside_a_span():
    """VLLMEngine.waited_between: the parts of the recorded waits that fall inside [start, end]."""
    from real_backend.engine import VLLMEngine
    from real_backend.engine_books import StreamInbox

    eng = VLLMEngine.__new__(VLLMEngine)
    eng._inbox = StreamInbox()  # the waits recorded: [0, 1], [2, 3], [5, 9]
    for began, ended in ((0.0, 1.0), (2.0, 3.0), (5.0, 9.0)):
        eng._inbox.waits.record(began, ended)
    assert eng.waited_between(0.0, 10.0) == pytest.approx(6.0)
    assert eng.waited_between(0.5, 2.5) == pytest.approx(1.0)  # 0.5 of the first, 0.5 of the second
    assert eng.waited_between(3.0, 5.0) == pytest.approx(0.0)
    assert eng.waited_between(6.0, 7.0) == pytest.approx(1.0)  # inside one wait
    assert eng.waited_between(2.5, 6.0) == pytest.approx(1.5)
    assert eng.driver_seconds(2.5, 6.0) == pytest.approx(2.0)  # the rest of the span: the caller's own
