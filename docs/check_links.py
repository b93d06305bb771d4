"""Check every relative markdown link of the README, CHANGELOG and the docs (`python docs/check_links.py`): each must
name a file or folder that exists, and an anchor a heading in it. tests/test_docs.py runs it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POINTERS = ("real_backend/README.md", "real_backend/TASK.md", "lssim/traces/importers/README.md",
            "lssim/integrations/README.md", "notebooks/README.md", "paper/README.md", "paper/experiments/README.md")


def anchors(md: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", md.read_text(), re.M)}


def broken_links(root: Path = ROOT) -> tuple[int, list[str]]:
    """(links checked, the broken ones as 'file: target')."""
    files = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md")), *(root / p for p in POINTERS)]
    bad, n = [], 0
    for f in files:
        text = re.sub(r"```.*?```", "", f.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"(https?:|mailto:)", target):
                continue
            n += 1
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                bad.append(f"{f.relative_to(root)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{f.relative_to(root)}: {target} (no such heading)")
    return n, bad


if __name__ == "__main__":
    checked, broken = broken_links()
    print(f"{checked} links checked; {len(broken)} broken")
    for b in broken:
        print("BROKEN", b)
    sys.exit(1 if broken else 0)
