"""The code's shape (issue 26 §3), held so it stays: no module in atlas/ over 600 lines and no
function over 80, so that each file names one part and each function reads in one screen."""

from __future__ import annotations

import ast

from site_helpers import REPO

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MODULES = sorted((REPO / "atlas").rglob("*.py"))


def test_no_module_is_over_600_lines() -> None:
    long = {str(p.relative_to(REPO)): n for p in MODULES
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    long = {f"{p.relative_to(REPO)}:{node.name}": node.end_lineno - node.lineno + 1
            for p in MODULES for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    assert long == {}
