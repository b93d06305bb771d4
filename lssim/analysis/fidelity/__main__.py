"""python -m lssim.analysis.fidelity FOLDER: the README's fidelity table of a validation folder."""

import sys

from lssim.analysis.fidelity.report import markdown_from

print(markdown_from(sys.argv[1] if len(sys.argv) > 1 else "paper/experiments/validation/full1"), end="")
