"""`lssim report` writes one self-contained page with every figure and table, atomically; `replay --plot` a PNG;
and the page renders in a real headless browser where one is installed."""

import base64
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from lssim.analysis import report as report_mod
from lssim.cli import main
from lssim.traces.synth import get_preset, synthesize
from lssim.traces.trace import write_trace

CHROMIUM = Path("/usr/bin/chromium")
SMALL = ["--instances", "2", "--max-num-seqs", "32"]
FIGURES = {"trace_length_cdf", "makespan_vs_bound", "timeline", "tokens_in_flight", "phase_breakdown", "staleness"}
TABLES = {"trace", "setup", "summary", "steps_baseline", "steps_april", "sources", "end_to_end"}


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    cfg = get_preset("longtail32k").replace(steps=4, prompts_per_step=16, group_size=8, n_prompts=64, max_tokens=8192)
    path = tmp_path_factory.mktemp("trace") / "small.parquet"
    write_trace(synthesize(cfg), path)
    return path


@pytest.fixture(scope="module")
def written(trace_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    assert main(["report", str(trace_file), "--policy", "april", *SMALL, "--steps", "3", "-o", str(out)]) == 0
    return out


def test_every_figure_embedded_and_every_table_present(written):
    page = (written / "report.html").read_text()
    pngs = {p.stem: p for p in (written / "figures").glob("*.png")}
    assert set(pngs) == FIGURES
    for name, path in pngs.items():  # the page carries the very bytes written beside it
        assert f"data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}" in page, name
    assert len(re.findall(r"<img ", page)) == len(FIGURES)
    assert "src='http" not in page and "<script" not in page  # self-contained
    csvs = {p.stem: p for p in (written / "tables").glob("*.csv")}
    assert set(csvs) == TABLES
    for name, path in csvs.items():
        assert f"id='table-{name}'" in page
        table = pd.read_csv(path)
        assert len(table) > 0
    summary = pd.read_csv(csvs["summary"])
    assert summary["policy"].tolist() == ["baseline", "april", "oracle"]
    steps = pd.read_csv(csvs["steps_april"])
    assert (steps["rollout_seconds"] >= steps["lower_bound_seconds"] - 1e-9).all()
    for heading in ("What the trace is", "What the policy did", "How far from the bound",
                    "What was modelled rather than replayed", "End to end under the execution mode"):
        assert heading in page


def test_mode_is_reported(trace_file, tmp_path):
    out = tmp_path / "async"
    main(["report", str(trace_file), "--policy", "april", *SMALL, "--steps", "3", "--mode", "async", "--staleness", "2",
          "-o", str(out)])
    e2e = pd.read_csv(out / "tables" / "end_to_end.csv")
    assert e2e["mode"].str.startswith("async").all()


def test_nothing_half_written_on_error(trace_file, tmp_path, monkeypatch):
    out = tmp_path / "out"

    def broken(report):
        raise RuntimeError("render failed")

    monkeypatch.setattr(report_mod, "render_html", broken)
    with pytest.raises(RuntimeError, match="render failed"):
        main(["report", str(trace_file), "--policy", "april", *SMALL, "--steps", "2", "-o", str(out)])
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary


def test_refuses_to_replace_a_folder_that_is_not_a_report(trace_file, tmp_path, capsys):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "data.txt").write_text("keep me")
    with pytest.raises(SystemExit) as e:
        main(["report", str(trace_file), "--policy", "april", *SMALL, "--steps", "2", "-o", str(out)])
    assert e.value.code == 2 and "not an lssim report folder" in capsys.readouterr().err
    assert (out / "data.txt").read_text() == "keep me"


def test_replay_plot_draws_the_chosen_step(trace_file, tmp_path, capsys):
    png = tmp_path / "step1.png"
    assert main(["replay", str(trace_file), "--policy", "april", *SMALL, "--steps", "3", "--plot-step", "1",
                 "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "step 1 timeline written" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a step the run does not have is a user error, and no file is left
        main(["replay", str(trace_file), *SMALL, "--steps", "2", "--plot-step", "99", "--plot", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


# --------------------------------------------------------------------------------------------------------------
# A real browser
# --------------------------------------------------------------------------------------------------------------

# Appended to a copy of the page: after load, the body records how many images it has and how many failed.
PROBE = ("<script>window.addEventListener('load',()=>{const i=[...document.images];document.body.setAttribute("
         "'data-images',i.length);document.body.setAttribute('data-broken',i.filter(x=>!x.complete||x.naturalWidth===0)"
         ".length);});</script>")


def _chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0"]
    return subprocess.run([str(CHROMIUM), *flags, *args, page.as_uri()], capture_output=True, text=True, timeout=120)


def _probe(page_html: str, tmp: Path, name: str) -> tuple[int, int, str]:
    page = tmp / f"{name}.html"
    page.write_text(page_html.replace("</body>", PROBE + "</body>"))
    run = _chromium(page, tmp, "--dump-dom")
    body = re.search(r"<body[^>]*>", run.stdout)
    assert body, f"chromium printed no DOM (rc {run.returncode}): {run.stderr[-2000:]}"
    images = int(re.search(r'data-images="(\d+)"', body.group(0)).group(1))
    broken = int(re.search(r'data-broken="(\d+)"', body.group(0)).group(1))
    return images, broken, run.stderr


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install -y chromium) to render the page in")
def test_page_renders_in_a_headless_browser(written, tmp_path):
    page_html = (written / "report.html").read_text()
    images, broken, log = _probe(page_html, tmp_path, "page")
    assert images == len(FIGURES) and broken == 0
    console = [line for line in log.splitlines() if "CONSOLE" in line]
    assert not console, console
    # The probe can fail: a page with a broken image and a console error is caught.
    bad = page_html.replace("</body>", "<img src='data:image/png;base64,AAAA'><script>console.error('boom')</script></body>")
    images, broken, log = _probe(bad, tmp_path, "bad")
    assert broken == 1 and any("CONSOLE" in line and "boom" in line for line in log.splitlines())
    shot = tmp_path / "report.png"  # kept under pytest's tmp dir as the artifact
    run = _chromium(written / "report.html", tmp_path, f"--screenshot={shot}", "--window-size=1400,4000")
    assert run.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
