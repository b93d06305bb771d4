"""The paper (paper/): its text is its template filled with the numbers the build computes, and those numbers are
what the library computes now.

- The committed paper.md is paper/template.md rendered with the committed numbers.json (no number typed by hand).
- The committed measured numbers (real-engine validation, trainer fit, GPU kernel fit) and a sample of the
  simulated ones equal a fresh computation; a simulator change that moves them fails here until
  `python -m paper.build` is run again.
- A quick build (the same code on 3 steps of each trace, 16 devices) into a temporary folder writes a paper whose
  text, numbers and figures agree, with every registered policy in its tables.
- The validation numbers are the headline validation's summary.csv's own columns (paper.measured.VALIDATION: one row
  per policy; the worlds' `baseline@WORLD` rows apart), and an output of the older format is refused by file and column.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from paper.build import FIGURE_REF, TEMPLATE, build, check_figures
from paper.measured import VALIDATION
from paper.render import format_value, markdown_table, placeholder_formats, placeholders, render
from paper.simulated import BuildConfig, policy_names

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "paper"
REBUILD = "the committed paper is out of date with the code: run `python -m paper.build` and commit paper/"


def committed() -> tuple[str, dict, str]:
    return TEMPLATE.read_text(), json.loads((PAPER / "numbers.json").read_text()), (PAPER / "paper.md").read_text()


def test_committed_paper_is_the_template_filled_with_the_committed_numbers():
    template, numbers, text = committed()
    try:
        rendered = render(template, numbers)
    except KeyError as e:  # the template names a number an older build did not compute
        pytest.fail(f"{e}: {REBUILD}")
    assert rendered == text, REBUILD
    assert "{{" not in text
    shown = set(FIGURE_REF.findall(text))
    assert shown and all((PAPER / "figures" / f"{name}.png").is_file() for name in shown)
    assert not numbers["config.quick"], "the committed paper must come from the full build, not --quick"


def test_committed_measured_numbers_equal_a_fresh_computation():
    """Numbers read from committed measurements equal exactly; numbers refitted here (the GPU kernel fit, whose last
    digits follow the host's floating-point library) equal as the paper prints them."""
    from paper.measured import REFITTED_PREFIX, REFITTED_UNPRINTED_FORMAT, measured_all

    template, numbers, _ = committed()
    printed = placeholder_formats(template)
    fresh, _ = measured_all(ROOT)
    tables = fresh.pop("tables")
    for key, value in fresh.items():
        assert key in numbers, (key, REBUILD)
        if isinstance(value, float) and key.startswith(REFITTED_PREFIX):
            for spec in printed.get(key, {REFITTED_UNPRINTED_FORMAT}):
                assert format_value(numbers[key], spec) == format_value(value, spec), (key, spec, REBUILD)
        elif isinstance(value, float):
            assert numbers[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (key, REBUILD)
        else:
            assert numbers[key] == value, (key, REBUILD)
    for name, table in tables.items():
        assert name in numbers["tables"], (name, REBUILD)
        assert json.loads(json.dumps(table)) == numbers["tables"][name], (name, REBUILD)


def test_committed_simulated_numbers_equal_a_fresh_run_of_the_baseline_and_april():
    from lssim.analysis.replay import SimSetup, replay, summarize
    from lssim.traces.trace import load_trace

    _, numbers, _ = committed()
    table = summarize(replay(load_trace(ROOT / "traces" / "math7b.parquet"), ["april"], SimSetup(), references=False))
    for key in ("rollout_seconds", "lower_bound_efficiency", "off_policy_token_fraction", "exact_fraction"):
        assert f"sim.math7b.april.{key}" in numbers, (key, REBUILD)
        assert numbers[f"sim.math7b.april.{key}"] == pytest.approx(float(table.loc["april", key]), rel=1e-9), (key, REBUILD)


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper")
    numbers = build(out, BuildConfig.quick(), say=lambda _: None)
    return out, numbers


def test_a_quick_build_writes_a_paper_that_is_its_numbers_rendered(quick_build):
    out, numbers = quick_build
    text = (out / "paper.md").read_text()
    stored = json.loads((out / "numbers.json").read_text())
    assert stored == numbers
    assert render(TEMPLATE.read_text(), stored) == text
    assert stored["config.quick"] and stored["config.steps"] == 3
    figures = {p.stem for p in (out / "figures").glob("*.png")}
    assert figures == set(FIGURE_REF.findall(text))
    assert all((out / "figures" / f"{f}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert not list(out.glob(".*.tmp")), "a temporary file was left behind"


def test_a_quick_build_s_numbers_are_the_library_s(quick_build):
    """Spot checks against the library called directly, with the quick build's own settings."""
    import numpy as np
    import pandas as pd

    from lssim.analysis.replay import SimSetup, replay, summarize
    from lssim.traces.trace import load_trace

    _, numbers = quick_build
    table = summarize(replay(load_trace(ROOT / "traces" / "longtail32k.parquet"), ["seer"], SimSetup(), steps=3))
    assert numbers["sim.longtail32k.seer.rollout_speedup"] == pytest.approx(float(table.loc["seer", "rollout_speedup"]), rel=1e-9)
    assert numbers["sim.longtail32k.oracle.lower_bound_efficiency"] == pytest.approx(
        float(table.loc["oracle", "lower_bound_efficiency"]), rel=1e-9)
    steps = pd.read_parquet(ROOT / VALIDATION / "steps.parquet")
    assert numbers["real.median_ape"] == pytest.approx(float(steps["ape_pct"].median()))
    assert numbers["real.p90_ape"] == pytest.approx(float(np.percentile(steps["ape_pct"], 90)))


def test_a_quick_build_s_training_side_numbers_are_the_library_s(quick_build):
    from lssim.analysis.replay import SimSetup, replay, summarize
    from lssim.traces.trace import load_trace

    _, numbers = quick_build
    cfg = BuildConfig.quick()
    specs = list(cfg.train_side)
    table = summarize(replay(load_trace(ROOT / "traces" / f"{numbers['train_side.trace']}.parquet"), [cfg.train_base] + specs,
                             SimSetup(), steps=3, references=False))
    base = table.loc[cfg.train_base]
    for spec in specs:
        assert numbers[f"train_side.{spec}.ran"]
        assert numbers[f"train_side.{spec}.train_seconds"] == pytest.approx(float(table.loc[spec, "train_seconds"]), rel=1e-9)
        assert numbers[f"train_side.{spec}.saved_of_step"] == pytest.approx(
            float((base["train_seconds"] - table.loc[spec, "train_seconds"]) / base["step_seconds"]), rel=1e-9)
        assert numbers[f"train_side.{spec}.computed_token_fraction"] < 1  # the mask took tokens out of the forward


# -- the measured numbers: read from the validation outputs as written ------------------------------------------


def test_the_validation_numbers_are_summary_csv_s_own_columns():
    import pandas as pd

    from paper.measured import fidelity_numbers

    numbers, tables, _ = fidelity_numbers(ROOT)
    summary = pd.read_csv(ROOT / VALIDATION / "summary.csv").set_index("policy")
    policies = summary[~summary.index.str.startswith("baseline@")]
    assert numbers["real.policies"] == len(policies) and numbers["real.worlds"] == len(summary) - len(policies)
    assert numbers["real.meeting_goal"] == int(policies["meets_goal"].sum())
    assert numbers["real.meeting_goal_anchored"] == int(policies["meets_goal_anchored"].sum())
    for policy, row in policies.iterrows():
        for key, col in (("anchored_median_ape", "anchored_median_ape_pct"), ("speedup_error_points", "speedup_error_points"),
                         ("repeat_spread_median", "repeat_spread_median_pct"), ("acted", "acted")):
            assert numbers[f"real.{policy}.{key}"] == pytest.approx(float(row[col]), nan_ok=True), (policy, key)
    assert [row[0] for row in tables["fidelity"]["rows"]] == list(policies.index)  # no baseline@WORLD row
    assert [row[0] for row in tables["worlds"]["rows"]] == list(summary.loc[summary.index.str.startswith("baseline@"), "world"])


def test_a_validation_summary_of_the_old_format_is_refused_by_name(tmp_path):
    import shutil

    import pandas as pd

    from paper.measured import fidelity_numbers

    folder = tmp_path / VALIDATION
    shutil.copytree(ROOT / VALIDATION, folder)
    summary = pd.read_csv(folder / "summary.csv")
    summary.drop(columns=["anchored_median_ape_pct"]).to_csv(folder / "summary.csv", index=False)
    with pytest.raises(ValueError, match="summary.csv: no column anchored_median_ape_pct"):
        fidelity_numbers(tmp_path)


def test_the_goal_verdict_is_summary_csv_s_whichever_way_it_goes(tmp_path):
    import shutil

    import pandas as pd

    from paper.measured import fidelity_numbers

    folder = tmp_path / VALIDATION
    shutil.copytree(ROOT / VALIDATION, folder)
    summary = pd.read_csv(folder / "summary.csv")
    first, second = summary.index[~summary["policy"].str.startswith("baseline@")][:2]
    summary["meets_goal"], summary["meets_goal_anchored"] = False, False
    summary.loc[first, "meets_goal"] = True
    summary.loc[second, "meets_goal_anchored"] = True
    summary.to_csv(folder / "summary.csv", index=False)
    numbers, tables, _ = fidelity_numbers(tmp_path)
    one, two = summary.loc[first, "policy"], summary.loc[second, "policy"]
    assert (numbers["real.meeting_goal"], numbers["real.meeting_goal_names"]) == (1, one)
    assert (numbers["real.meeting_goal_anchored"], numbers["real.meeting_goal_anchored_names"]) == (1, two)
    goals = {row[0]: row[-1] for row in tables["fidelity"]["rows"]}
    assert goals[one] == "yes" and goals[two] == "with the level" and list(goals.values()).count("no") == len(goals) - 2


def test_the_speculation_policies_validation_is_said_only_when_the_run_had_them():
    import pandas as pd

    from paper.measured import speculation_validated

    rows = pd.DataFrame({"speedup_measured": [0.94, 1.3], "speedup_predicted": [0.95, 1.2], "speedup_error_points": [0.9, -10.0],
                         "makespan_median_ape_pct": [4.0, 8.0]}, index=["tlt", "april"])
    said = speculation_validated(rows)["real.speculation_validated"]
    assert said.startswith("`tlt` measured 0.94x, predicted 0.95x (+0.9 points") and "april" not in said
    assert "did not include" in speculation_validated(rows.drop(index="tlt"))["real.speculation_validated"]


def test_the_speculation_numbers_are_the_committed_measurement_s():
    from paper.measured import speculation_numbers

    data = json.loads((ROOT / "real_backend" / "data" / "speculation_cpu.json").read_text())
    numbers = speculation_numbers(ROOT)
    assert numbers["spec.alpha"] == data["fit"]["alpha"]
    sizes = sorted(int(n) for n in data["by_batch"])
    assert numbers["spec.speedup_at_max"] == data["by_batch"][str(sizes[-1])]["speedup"]
    paying = [n for n in sizes if data["by_batch"][str(n)]["speedup"] > 1]
    assert numbers["spec.largest_paying_batch"] == (max(paying) if paying else "none")


def test_every_registered_policy_is_in_the_quick_build_s_tables(quick_build):
    _, numbers = quick_build
    names = ["baseline"] + policy_names() + ["oracle"]
    assert [row[0] for row in numbers["tables"]["catalogue"]["rows"]] == names
    for trace in ("math7b", "longtail32k"):
        ran = {row[0] for row in numbers["tables"][f"policies_{trace}"]["rows"]}
        missing = [p for p in names if p not in ran]
        assert all(f"{p} on {trace}" in numbers["sim.skipped"] for p in missing), missing


# -- the renderer -----------------------------------------------------------------------------------------------


def test_render_formats_each_placeholder_and_names_a_missing_one():
    numbers = {"a.b": 0.12345, "n": 81920, "name": "april", "gone": None,
               "tables": {"t": {"columns": ["p", "x"], "formats": ["", ".1%"], "rows": [["april", 0.5], ["dapo", None]]}}}
    text = "{{a.b:.2f}} {{a.b:.1%}} {{n:,}} `{{name}}` {{gone:.1f}}\n{{table:t}}"
    assert render(text, numbers) == "0.12 12.3% 81,920 `april` -\n| p | x |\n|---|---|\n| april | 50.0% |\n| dapo | - |"
    assert placeholders(text) == ["a.b", "n", "name", "gone", "table:t"]
    assert placeholder_formats(text) == {"a.b": {".2f", ".1%"}, "n": {","}, "name": {""}, "gone": {".1f"}}
    with pytest.raises(KeyError, match="nope"):
        render("{{nope:.1f}}", numbers)
    with pytest.raises(KeyError, match="table 'u'"):
        render("{{table:u}}", numbers)
    with pytest.raises(ValueError, match="name:.1f"):
        render("{{name:.1f}}", numbers)


def test_a_table_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="3 cells for 2 columns"):
        markdown_table({"columns": ["a", "b"], "formats": ["", ""], "rows": [[1, 2, 3]]})


def test_nan_and_infinity_render_as_words_not_numbers():
    assert format_value(float("nan"), ".2f") == "-"
    assert format_value(math.inf, ".2f") == "inf"


def test_the_template_shows_exactly_the_figures_the_build_draws():
    template = TEMPLATE.read_text()
    drawn = {name: (b"", "") for name in FIGURE_REF.findall(template)}
    check_figures(template, drawn)
    with pytest.raises(ValueError, match="does not show: extra"):
        check_figures(template, {**drawn, "extra": (b"", "")})
