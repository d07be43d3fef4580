"""docs/frontend.md's table of pages by role lists every page of the web app, with its title and
address, under each role that sees it (issue #28, point 6: it lacked Crowd).

The pages come from the app itself: ``frontend/app.py`` builds its navigation from the page
files in its ``_FILES`` table and the titles and roles in ``frontend/page_gate.py``'s ``PAGE_ROLES``.
A page added there fails here until the table says so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from frontend.page_gate import PAGE_ROLES

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("writer", "validator", "researcher")
PAGE = re.compile(r"\*\*([^*]+)\*\* \(`/([a-z-]+)`\)")


def app_pages() -> dict[str, str]:
    """url path -> page file, from frontend/app.py's ``_FILES`` (read, not run: it is a
    Streamlit script)."""
    tree = ast.parse((ROOT / "frontend" / "app.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "_FILES":
            assert node.value is not None
            files: dict[str, list[tuple[str, str]]] = ast.literal_eval(node.value)
            return {url: file for section in files.values() for file, url in section}
    raise AssertionError("frontend/app.py has no _FILES table")


def documented_pages() -> dict[str, set[tuple[str, str]]]:
    """role -> (title, url path) of each page the table lists in that role's row."""
    text = (ROOT / "docs" / "frontend.md").read_text(encoding="utf-8")
    table = text.split("| role | pages (URL path) |", 1)[1].split("\n\n", 1)[0]
    rows: dict[str, set[tuple[str, str]]] = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] in ROLES:
            rows[cells[0]] = set(PAGE.findall(cells[1]))
    return rows


def test_the_page_table_lists_every_page_of_each_role() -> None:
    pages = app_pages()
    assert all((ROOT / "frontend" / "app_pages" / file).is_file() for file in pages.values()), pages
    assert set(pages) == set(PAGE_ROLES), (sorted(pages), sorted(PAGE_ROLES))
    expected = {role: {(page.title, url) for url, page in PAGE_ROLES.items() if role in page.roles} for role in ROLES}
    assert documented_pages() == expected


def test_the_table_reader_reads_titles_and_addresses() -> None:
    rows = documented_pages()
    assert ("Write", "write") in rows["writer"] and ("Crowd", "crowd") in rows["researcher"]
    assert PAGE.findall("**Tasks and rounds** (`/rounds`), **Dashboard** (`/dashboard`)") == [
        ("Tasks and rounds", "rounds"),
        ("Dashboard", "dashboard"),
    ]
