"""The README and docs/ stay true: every ```python block runs (a page's blocks in order,
in one namespace, in a fresh directory), and the README's layout table matches the tree
(each listed folder exists, each package folder is listed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: top-level folders holding the import package's modules (pyproject's package-dir)
STAGES = ("frontend", "poly", "codegen", "search", "polytile")
#: `poly` is the namespace of its subpackages, which have rows of their own
NAMESPACES = {"poly"}

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block, in page order."""
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(2))
        for m in _FENCE.finditer(text)
        if m.group(1) == "python"
    ]


def layout_rows(readme: str) -> list[str]:
    """The backticked paths in the first column of the README's Layout table."""
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert section, "README.md has no '## Layout' section"
    return re.findall(r"^\|\s*`([^`]+)`\s*\|", section.group(1), re.M)


def package_dirs() -> list[str]:
    """Every package folder of the import package, as 'poly/ir/', relative to the root."""
    found = []
    for stage in STAGES:
        for init in sorted((ROOT / stage).rglob("__init__.py")):
            folder = init.parent.relative_to(ROOT).as_posix()
            if folder not in NAMESPACES:
                found.append(folder + "/")
    return found


def test_the_fences_are_found() -> None:
    text = "a\n```python\nx = 1\n```\n```sh\nls\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == [(2, "x = 1\n"), (8, "y = x\n")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_code_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    if page.parent.name == "docs":
        assert blocks, f"{page.name} has no python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"doc_{page.stem}"}
    for line, code in blocks:
        where = f"{page.relative_to(ROOT)}:{line}"
        exec(compile(code, where, "exec"), namespace)


def test_readme_is_one_screen() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    head = "\n".join(lines[:40])
    assert "make run" in head and "make test" in head
    text = "\n".join(lines)
    status = re.search(r"<!-- status:begin -->\n(.*?)<!-- status:end -->", text, re.S)
    assert status and status.group(1).lstrip().startswith("|"), "no status table"
    assert "make report" in text


def test_layout_table_matches_the_tree() -> None:
    rows = layout_rows((ROOT / "README.md").read_text(encoding="utf-8"))
    missing = [r for r in rows if not (ROOT / r).exists()]
    assert not missing, f"the README's layout table lists folders that do not exist: {missing}"
    unlisted = [d for d in package_dirs() if d not in rows]
    assert not unlisted, f"package folders missing from the README's layout table: {unlisted}"


def test_docs_links_resolve() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text(encoding="utf-8")):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to {target}"
