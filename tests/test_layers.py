"""The house's layers, read from the code: each package imports only those below it, and the
drain path (worker/) and the store (common/store/) name no workflow: they know batches,
jobs and flows in general, and a workflow is a room of flows/ with its registry line."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each package with the packages it may import (its own included).
MAY_IMPORT = {
    "common": {"common"},
    "sim": {"sim", "common"},
    "flows": {"flows", "common"},
    "worker": {"worker", "flows", "common"},
    # The demo starts swarm-sim, the stand-in server.
    "producer": {"producer", "worker", "flows", "sim", "common"},
}
WORKFLOW = re.compile(r"agent|pipeline|judge|best_of", re.IGNORECASE)
# redis-py's pipelines (commands sent together), not a workflow.
REDIS_PIPELINE = re.compile(r"\.pipeline\(|_PIPELINE_PREFIX|of pipeline caused error")


def _sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_those_below_it(package: str) -> None:
    wrong = []
    for path in _sources(package):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in MAY_IMPORT and top not in MAY_IMPORT[package]:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not wrong, "\n".join(wrong)


def _code_tokens(path: Path) -> list[tokenize.TokenInfo]:
    """The tokens of ``path`` that are code: no comment, no docstring."""
    toks = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    layout = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT}
    layout |= {tokenize.ENDMARKER}
    code = []
    for i, tok in enumerate(toks):
        if tok.type in layout:
            continue
        if tok.type == tokenize.STRING:
            before = next((t for t in reversed(toks[:i]) if t.type not in layout), None)
            skip = layout - {tokenize.NEWLINE, tokenize.ENDMARKER}
            after = next(t for t in toks[i + 1 :] if t.type not in skip)
            alone = before is None or before.type == tokenize.NEWLINE or before.string == ":"
            if alone and after.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                continue  # a docstring (or a string standing alone): documentation
        code.append(tok)
    return code


def test_the_drain_path_and_the_store_name_no_workflow() -> None:
    hits = []
    for path in _sources("worker", "common/store"):
        lines = path.read_text().splitlines()
        for tok in _code_tokens(path):
            line = lines[tok.start[0] - 1]
            named = tok.type == tokenize.NAME and re.search(r"(^|_)then($|_)", tok.string)
            if (WORKFLOW.search(tok.string) or named) and not REDIS_PIPELINE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{tok.start[0]}: {tok.string[:60]}")
    assert not hits, "\n".join(hits)
