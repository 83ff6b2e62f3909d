"""benchmarks/RESULTS.md holds one section per benchmark configuration; a run replaces only its own."""
from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(text: str, marker: str, path: Path = RESULTS) -> None:
    """Replace the section that starts at the first occurrence of marker (up to the next '## ' heading),
    or append text as a new section; every other section is kept."""
    old = path.read_text() if path.exists() else "# Benchmark results\n\n"
    start = old.find(marker)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + 1)
        new = old[:start] + text + ("\n" + old[end + 1:] if end >= 0 else "")
    path.write_text(new.rstrip("\n") + "\n")
