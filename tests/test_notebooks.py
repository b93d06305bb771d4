"""The notebooks run top to bottom (in their fast mode) and match the script that writes them."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("LSSIM_NOTEBOOK_FAST", "1")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]


def test_notebooks_are_what_the_script_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_notebooks", NOTEBOOKS[0].parent / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stored = nbformat.read(NOTEBOOKS[0].parent / "policy_sweep.ipynb", as_version=4)
    assert [c.source for c in stored.cells] == [c.source for c in module.POLICY_SWEEP]
