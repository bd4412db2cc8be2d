"""The README is a landing page and docs/ holds the rest: no README section over
60 lines, the two commands near the top, every link to a file of the repository
resolving (and a `#section` of a docs page naming one of its headings), and the
configuration reference naming every key `resumeguard config show` prints."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import REPO, proxy_binary

README = REPO / "README.md"
DOCS = REPO / "docs"
TWO_COMMANDS = (
    "cargo run --release -- serve      # run the proxy (embedded default: starts a managed local PostgreSQL)",
    "integration/run_all.sh            # run all tests (unit + real PostgreSQL 15 + real LangGraph)",
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def sections(text: str) -> list[tuple[str, int]]:
    """(heading, line count) of each `#`/`##` section, fenced code blocks included."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,2} ", line):
            out.append([line, 0])
        if out:
            out[-1][1] += 1
    return [tuple(s) for s in out]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    h = heading.lstrip("#").strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text, fenced, out = page.read_text(), False, set()
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(anchor(line))
    return out


def test_no_readme_section_is_over_60_lines():
    long = [(h, n) for h, n in sections(README.read_text()) if n > 60]
    assert not long, long


def test_the_two_commands_are_near_the_top():
    lines = README.read_text().splitlines()
    for cmd in TWO_COMMANDS:
        assert cmd in lines, f"missing from README: {cmd}"
        assert lines.index(cmd) < 40, f"line {lines.index(cmd) + 1}: {cmd}"


def test_readme_is_a_landing_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 220, len(lines)
    first_screen = "\n".join(lines[:60])
    for part in ("## The two commands", "## Install", "## Quickstart",
                 "cargo install --locked --path .", "podman build"):
        assert part in first_screen, part


def test_every_link_resolves():
    pages = [README, *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue                      # a URL, not a file of the repository
            path, _, frag = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif frag and resolved.suffix == ".md" and frag not in anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme():
    text = README.read_text()
    missing = [p.name for p in DOCS.glob("*.md") if f"(docs/{p.name}" not in text]
    assert not missing, missing


def config_keys() -> list[tuple[str, str]]:
    """(section, key) of every key `config show` prints ("" for top-level)."""
    cp = subprocess.run([str(proxy_binary()), "config", "show"], capture_output=True, text=True,
                        timeout=30, cwd=REPO, env={"PATH": "/usr/bin:/bin"})
    assert cp.returncode == 0, cp.stderr
    keys, section = [], ""
    for line in cp.stdout.splitlines():
        if m := re.match(r"\[(\w+)\]$", line):
            section = m.group(1)
        elif m := re.match(r"(?:# )?(\w+) (?:=|is not set)", line):
            keys.append((section, m.group(1)))
    assert len(keys) > 40, cp.stdout
    return keys


def test_every_configuration_key_is_documented():
    rows = [line.split("|")[1] for line in (DOCS / "configuration.md").read_text().splitlines()
            if line.startswith("| `")]
    missing = []
    for section, key in config_keys():
        tag = f"[{section}]" if section else None
        if not any(f"`{key}`" in first.replace(f"`{tag} {key}`", f"`{key}`")
                   and ((tag in first) if tag else "[" not in first) for first in rows):
            missing.append(f"[{section}] {key}" if section else key)
    assert not missing, f"keys of `config show` not in docs/configuration.md: {missing}"
