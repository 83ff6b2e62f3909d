"""benchmarks/RESULTS.md holds one section per benchmark configuration; a run replaces only its own."""
from __future__ import annotations

import datetime
import platform
import sys
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


def section(header: str, facts: list[str], table: list[str]) -> str:
    """A section's text: the heading, a '- date: ...; machine: ...' line, the command that ran (this process's
    argv), one '- ' line per fact, then the table."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join(["python", "benchmarks/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    return "\n".join([header, "", f"- date: {now}; machine: {platform.machine()}, Python {platform.python_version()}",
                      f"- command: `{command}`", *(f"- {fact}" for fact in facts), "", *table]) + "\n"


def publish(header: str, facts: list[str], table: list[str], write: bool) -> str:
    """section()'s text, printed, and with `write` put into RESULTS.md in place of the section of that heading."""
    text = section(header, facts, table)
    print(text)
    if write:
        write_section(text, header + "\n")
    return text
