"""Bring your own trace: import the rollout dumps of verl, slime, AReaL and TRL as lssim traces.

One module per framework, each read against that framework's own writer (its docstring cites the
file and commit) and each saying what its dump measured and what the import had to infer:

- :mod:`.slime`: ``--save-debug-rollout-data`` / ``--dump-details`` ``.pt`` files (token counts,
  finish status and weight versions measured);
- :mod:`.verl`: ``trainer.rollout_data_dir`` ``{step}.jsonl`` (text only: retokenized);
- :mod:`.areal`: ``dump_to_file`` ``rollout/{version}/{task}.jsonl`` (token counts measured);
- :mod:`.trl`: ``GRPOTrainer(log_completions=True)`` tables (text only: retokenized).

Each module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> Imported``; the
CLI (``lssim import FRAMEWORK SOURCE -o trace.parquet``) lists them from :data:`FRAMEWORKS`.
"""

from __future__ import annotations

from lssim.traces.importers import areal, slime, trl, verl
from lssim.traces.importers.common import DumpError, Imported, write_imported

FRAMEWORKS = {m.NAME: m for m in (verl, slime, areal, trl)}
"""Framework name -> its importer module."""

__all__ = ["FRAMEWORKS", "DumpError", "Imported", "write_imported"]
