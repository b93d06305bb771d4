"""Compare two frames_snapshot.sh folders: every parquet frame exactly (assert_frame_equal, check_exact), every
printed table and meta.json as text less run paths and memory addresses. --added-columns-ok: a summary may gain
columns (the old ones must stay equal); --skip-tables: leave the printed tables out."""
import re
import sys, json
from pathlib import Path
import pandas as pd
a, b = Path(sys.argv[1]), Path(sys.argv[2])
ADDED_OK = '--added-columns-ok' in sys.argv
SKIP_TXT = '--skip-tables' in sys.argv
bad = 0; n = 0
for f in sorted(a.rglob("*")):
    g = b / f.relative_to(a)
    if f.is_dir(): continue
    if not g.exists():
        print("missing", g); bad += 1; continue
    n += 1
    if f.suffix == ".parquet":
        x, y = pd.read_parquet(f), pd.read_parquet(g)
        if f.name == "summary.parquet" and ADDED_OK:  # a summary may gain columns; the old ones must stay equal
            y = y[[c for c in x.columns]]
        try:
            pd.testing.assert_frame_equal(x, y, check_exact=True)
        except AssertionError as e:
            print("DIFF", f, str(e)[:300]); bad += 1
    elif f.suffix == ".txt" and SKIP_TXT:
        n -= 1
    elif f.suffix in (".json", ".txt"):
        norm = lambda t: re.sub(r"(/work/scratch/s33/|/tmp/)[\w-]+|real_backend/(data/)?profile_cpu\.json|/work/(main|wt/\w+)|0x[0-9a-f]+|lssim\.(sim\.)?training\.LINKS", "X", t)
        if norm(f.read_text()) != norm(g.read_text()):
            print("DIFF", f); bad += 1
print(f"{n} files compared, {bad} differ")
