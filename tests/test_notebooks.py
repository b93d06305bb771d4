"""The notebooks run top to bottom (in their fast mode), match the script that writes them, and are stored
without outputs."""

import importlib.util
import os
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WORKFLOWS = {"explore_trace", "new_policy", "validate_policy", "choose_mode", "reproduce_april", "policy_sweep"}


def _script():
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "notebooks" / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("LSSIM_NOTEBOOK_FAST", "1")
    # The kernel imports this checkout's lssim, not whichever one is installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    started = time.monotonic()
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert time.monotonic() - started < 120, f"{path.name}: the fast mode should take well under a minute"


def test_notebooks_are_what_the_script_writes():
    written = _script().notebooks()
    assert set(written) == {p.stem for p in NOTEBOOKS} and WORKFLOWS <= set(written)
    for name, cells in written.items():
        stored = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        assert [(c.cell_type, c.source) for c in stored.cells] == [(c.cell_type, c.source) for c in cells], name
        assert not any(c.get("outputs") or c.get("execution_count") for c in stored.cells if c.cell_type == "code"), \
            f"{name}.ipynb is stored with outputs; rerun notebooks/make_notebooks.py"


def test_percent_cells_parse_markdown_and_code():
    cells = _script().percent_cells("# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n\n# %%\ny = 2\n")
    assert [(c.cell_type, c.source) for c in cells] == [("markdown", "# Title\n\ntext"), ("code", "x = 1"), ("code", "y = 2")]
    with pytest.raises(ValueError, match="unknown cell header"):
        _script().percent_cells("# %% [raw]\nx\n")
