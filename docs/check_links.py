"""Check every relative markdown link of the README, CHANGELOG and docs/ (`python docs/check_links.py`): each must
name a file or folder that exists, and an anchor a heading in it; paths other branches create are listed as pending."""
import re, sys
from pathlib import Path
ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
# paths other engineers create in parallel (the end state these docs describe)
PENDING = {'paper/experiments/README.md', 'paper/experiments/validations.toml', 'real_backend/data/README.md'}
PENDING_PREFIX = ('paper/experiments/validation/',)
def anchors(md):
    out = set()
    for h in re.findall(r'^#+ (.*)$', md.read_text(), re.M):
        a = re.sub(r'[^\w\- ]', '', h.strip().lower()).replace(' ', '-')
        out.add(a)
    return out
bad, pending, n = [], [], 0
files = [ROOT / 'README.md', ROOT / 'CHANGELOG.md', *sorted((ROOT / 'docs').glob('*.md')),
         ROOT / 'real_backend/README.md', ROOT / 'real_backend/TASK.md', ROOT / 'lssim/traces/importers/README.md',
         ROOT / 'lssim/integrations/README.md', ROOT / 'notebooks/README.md', ROOT / 'paper/README.md']
for f in files:
    text = re.sub(r'```.*?```', '', f.read_text(), flags=re.S)
    for target in re.findall(r'\]\(([^)\s]+)\)', text):
        if re.match(r'(https?:|mailto:)', target):
            continue
        n += 1
        path, _, anchor = target.partition('#')
        dest = (f.parent / path).resolve() if path else f
        rel = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
        if not dest.exists():
            (pending if rel in PENDING or rel.startswith(PENDING_PREFIX) else bad).append(f'{f.relative_to(ROOT)}: {target}')
            continue
        if anchor and dest.suffix == '.md' and anchor not in anchors(dest):
            bad.append(f'{f.relative_to(ROOT)}: {target} (no such heading)')
print(f'{n} links checked; {len(bad)} broken; {len(pending)} to paths other branches create')
for b in bad: print('BROKEN', b)
for p in sorted(set(pending)): print('pending', p)
sys.exit(1 if bad else 0)
