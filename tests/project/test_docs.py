"""The README is a front door that cannot rot, and the docs are a web a reader can walk.

The README's `sh runnable` and `python runnable` blocks run as written, in order, from a fresh clone of the
repository (as CI runs `make test`), with the working tree's .venv; every relative link and image in README.md and
docs/*.md points to a file that exists, and every anchor to a heading that exists there (GitHub's slugs); every
docs page is reachable from the README; no page speaks of the project's internal history.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support.common import REPO

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
MAX_README_LINES = 250
SETUP_COMMANDS = ("make demo", "make test")
FENCE = re.compile(r"^[ \t]*(```+)([^\n]*)\n(.*?)^[ \t]*\1[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
# Internal history a reader cannot know: issue numbers, work rounds ("this stop", "the first wave"), the sessions
# of the people who wrote it. ONNX Runtime's sessions stay allowed: only these phrasings are refused.
HISTORY = re.compile(r"\bissues?\s*#?\d+|\b(?:this|that|previous|next|earlier|later|last|first|second|other|another)"
                     r"\s+(?:stop|wave|turn|session)s?\b(?!\.run)|\b(?:stop|wave)'s\b|\ba turn ago\b", re.IGNORECASE)
RUN_TIMEOUT_S = 600


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block whose info string is `sh runnable` or `python runnable`."""
    return [(info.split()[0], code) for _, info, code in FENCE.findall(text)
            if info.split()[1:] == ["runnable"] and info.split()[0] in ("sh", "python")]


def without_code(text: str) -> str:
    """The prose of a page: fenced blocks and inline code taken out (links inside them are examples)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """Every relative link or image of `page` whose file, or heading, is not there."""
    problems = []
    for target in LINK.findall(without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{page.name}: {target}: no heading with that anchor in {resolved.name}")
    return problems


def linked_pages(page: Path) -> set[Path]:
    pages = set()
    for target in LINK.findall(without_code(page.read_text(encoding="utf-8"))):
        path = target.partition("#")[0]
        if path.endswith(".md") and not re.match(r"[a-z][a-z+.-]*:", path):
            pages.add((page.parent / path).resolve())
    return pages


def test_every_link_and_image_points_at_something_that_exists():
    problems = [problem for page in (README, *PAGES) for problem in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_the_link_check_sees_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with punctuation\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-code-heading-with-punctuation) ![gone](gone.png) [bad](other.md#nothing)\n"
                    "`[in code](ignored.md)` [self](#title)\n\n# Title\n")
    assert broken_links(page) == ["page.md: gone.png: no such file",
                                  "page.md: other.md#nothing: no heading with that anchor in other.md"]


def test_every_docs_page_is_reachable_from_the_readme():
    reached, frontier = set(), {README.resolve()}
    while frontier:
        page = frontier.pop()
        reached.add(page)
        frontier |= {p for p in linked_pages(page) if p.exists() and p not in reached}
    assert {p.resolve() for p in PAGES} <= reached, sorted(p.name for p in PAGES if p.resolve() not in reached)


def test_no_page_speaks_of_internal_history():
    found = [f"{page.relative_to(REPO)}: {match.group(0)!r}" for page in (README, *PAGES)
             for match in HISTORY.finditer(page.read_text(encoding="utf-8"))]
    assert not found, found


def test_the_history_check_tells_onnx_runtime_sessions_from_work_sessions():
    assert HISTORY.search("as issue 18 says") and HISTORY.search("What this stop changed")
    assert HISTORY.search("shared with other sessions") and HISTORY.search("the first wave's run")
    assert not HISTORY.search("both sessions share one table; the next session.run reads it")


def test_the_readme_is_short_and_shows_the_two_setup_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    setup = text[text.index("\n## Set-up\n"):]
    setup = setup[:setup.index("\n## ", 1)]
    blocks = [(info.strip(), code) for _, info, code in FENCE.findall(setup)]
    commands = [line.split("#")[0].strip() for info, code in blocks if info == "sh" for line in code.splitlines()]
    assert commands == list(SETUP_COMMANDS), blocks  # shown, and never marked runnable (they would recurse)
    assert not any(command in code for _, code in runnable_blocks(text) for command in SETUP_COMMANDS)


@pytest.mark.slow
def test_the_readmes_runnable_blocks_run_on_a_fresh_clone(tmp_path):
    """In order, from the clone's root, with the working tree's .venv first on PATH (as `source
    .venv/bin/activate` puts it): each block exits 0, and the translations they print agree with PyTorch's."""
    if not (REPO / ".venv" / "bin" / "tfm-export").exists():
        pytest.skip("no .venv here: run `make setup` first")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to(REPO / ".venv")
    env = {**os.environ, "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    blocks = runnable_blocks(README.read_text(encoding="utf-8"))
    assert [language for language, _ in blocks] == ["sh", "python", "sh"]
    outputs = []
    for index, (language, code) in enumerate(blocks):
        script = tmp_path / f"block{index}.{'py' if language == 'python' else 'sh'}"
        script.write_text(code)
        command = ["python", str(script)] if language == "python" else ["bash", "-eo", "pipefail", str(script)]
        result = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert result.returncode == 0, (code, result.stdout, result.stderr)
        outputs.append(result.stdout.splitlines())
    exported, from_python, checks = outputs
    assert from_python == exported[-2:]  # the Python example prints what tfm-run translate printed
    assert from_python[0] == checks[0]  # and PyTorch's own translation of "forty-two" is the same
