"""python -m lssim.analysis.fidelity [FOLDER]: the README's fidelity table of a validation folder;
python -m lssim.analysis.fidelity --pool FOLDER...: each policy's error against an exact model's, pooled over
validation folders, with and without the driver priced (lssim.analysis.fidelity.pool), and each execution mode's over
`lssim validate --mode` folders (lssim.analysis.fidelity.modes);
python -m lssim.analysis.fidelity --levels FOLDER...: the host's speed against the profile's, per folder and world, and
the error that level puts on a twin exact at the profile's minutes (lssim.analysis.fidelity.levels)."""

import argparse
import sys

from lssim.analysis.fidelity.levels import levels_text
from lssim.analysis.fidelity.pool import pool_text
from lssim.analysis.fidelity.report import markdown_from

parser = argparse.ArgumentParser(prog="python -m lssim.analysis.fidelity", description=__doc__.split("\n")[0])
parser.add_argument("folder", nargs="?", default="paper/experiments/validation/full1",
                    help="a `lssim validate --out` folder: its fidelity table (default: %(default)s)")
parser.add_argument("--pool", nargs="+", metavar="FOLDER", help="pool these folders per policy (per mode: modes folders) instead")
parser.add_argument("--levels", nargs="+", metavar="FOLDER", help="the host's speed level per folder and world instead")
args = parser.parse_args()
try:
    if args.levels:
        print(levels_text(args.levels), end="")
    else:
        print(pool_text(args.pool) if args.pool else markdown_from(args.folder), end="")
except ValueError as e:
    print(f"python -m lssim.analysis.fidelity: {e}", file=sys.stderr)
    sys.exit(2)
