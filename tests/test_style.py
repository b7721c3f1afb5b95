"""House style that a reader relies on: a module of one concern fits in 700 lines, a function
(Triton kernels included) in 100, the README in 300, and no text describes how the project was
worked on ("session", "lease", "round of", "call 3"): prose states what the code does and
why, and figures carry a date and a commit.

Each check is a function of text, so the planted cases below show it fires before the real
tree is held to it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "pagegraph"
README = ROOT / "README.md"

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 100
MAX_README_LINES = 300

#: Words that describe the work rather than the project (whole words, any case).
DIARY = re.compile(r"\bsessions?\b|\bleases?\b|\bround\s+of\b|\bcall\s+#?[1-9]\b", re.IGNORECASE)
#: Technical uses of those words, blanked out before DIARY is searched.
ALLOWED = re.compile(
    r"process\s+session|pytest\s+session|test\s+session|new\s+session|session[-\s]scoped"
    r"|session\s+scope|scope\s*=\s*[\"']session[\"']|round\s+of\s+the\s+eager\s+timing",
    re.IGNORECASE,
)


# -- the checks: each takes text and returns what it found --------------------------------------


def too_long(text: str, limit: int) -> int | None:
    """The line count of ``text`` when it is over ``limit``, else None."""
    n = len(text.splitlines())
    return n if n > limit else None


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function or method over ``limit`` lines, counted from
    its first decorator (a ``@triton.jit`` kernel is a function too) to its last line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - first + 1
            if n > limit:
                found.append((node.name, first, n))
    return found


def diary_words(text: str) -> list[tuple[int, str]]:
    """(line, word) of every diary word in ``text`` outside the allowed technical phrases."""
    blanked = ALLOWED.sub(lambda m: re.sub(r"\S", " ", m.group()), text)
    return [(blanked.count("\n", 0, m.start()) + 1, m.group()) for m in DIARY.finditer(blanked)]


def python_prose(source: str) -> str:
    """The comments and docstrings of ``source``, every other character dropped, on their own
    line numbers (so a finding's line is the source's)."""
    lines = source.splitlines()
    prose = [""] * len(lines)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            prose[tok.start[0] - 1] += tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    for i in range(body[0].lineno - 1, body[0].end_lineno):
                        prose[i] += " " + lines[i]
    return "\n".join(prose)


# -- the checks fire on planted cases ----------------------------------------------------------


def test_a_701_line_module_is_too_long():
    assert too_long("x = 1\n" * 701, MAX_MODULE_LINES) == 701
    assert too_long("x = 1\n" * 700, MAX_MODULE_LINES) is None


def test_a_301_line_readme_is_too_long():
    assert too_long("text\n" * 301, MAX_README_LINES) == 301
    assert too_long("text\n" * 300, MAX_README_LINES) is None


def test_a_101_line_function_method_or_kernel_is_too_long():
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    plain = "def f():\n" + body  # 101 lines
    method = "class C:\n" + "".join("    " + line + "\n" for line in plain.splitlines())
    kernel = "@triton.jit\nasync def k():\n" + body[: -len("    x99 = 99\n")]  # 101 with decorator
    assert long_functions(plain) == [("f", 1, 101)]
    assert long_functions(method) == [("f", 2, 101)]
    assert long_functions(kernel) == [("k", 1, 101)]
    assert long_functions("def g():\n" + body[: -len("    x99 = 99\n")]) == []  # 100 lines


def test_diary_words_are_found_and_technical_phrases_are_not():
    planted = (
        "Measured in session 4 on the H200.\n"
        "On the next lease the host was slower.\n"
        "This round of work cut the replay.\n"
        "As call 3 showed, the ring pays.\n"
        "Two Sessions, three LEASES.\n"
    )
    assert [line for line, _ in diary_words(planted)] == [1, 2, 3, 4, 5, 5]
    technical = (
        "A crash takes the pytest session down; setsid starts a new session.\n"
        "A session-scoped fixture; the test\nsession ends; released, leased, around, recall 3.\n"
        "Calls of each variant in one round of the eager timing.\n"
    )
    assert diary_words(technical) == []


def test_python_prose_is_comments_and_docstrings_only():
    source = (
        '"""Module docstring: measured in session 2."""\n'
        "import pytest\n"
        "\n"
        '@pytest.fixture(scope="session")\n'
        "def f():\n"
        '    """Fine."""\n'
        "    lease = 1  # figures from the last lease\n"
        "    return lease\n"
    )
    assert diary_words(python_prose(source)) == [(1, "session"), (7, "lease")]


# -- the real tree -----------------------------------------------------------------------------


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_modules_are_at_most_700_lines():
    over = [
        f"{_rel(p)}: {n} lines"
        for p in _modules()
        if (n := too_long(p.read_text(), MAX_MODULE_LINES)) is not None
    ]
    assert not over, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(over)


def test_functions_are_at_most_100_lines():
    over = [
        f"{_rel(p)}:{line} {name}: {n} lines"
        for p in _modules()
        for name, line, n in long_functions(p.read_text())
    ]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)


def test_readme_is_at_most_300_lines():
    n = too_long(README.read_text(), MAX_README_LINES)
    assert n is None, f"README.md has {n} lines (at most {MAX_README_LINES})"


def _prose_files() -> list[Path]:
    files = [README, ROOT / "Makefile"]
    files += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "profiles").rglob("*.md"))
    return [p for p in files if p.exists()]


@pytest.mark.parametrize("path", _prose_files(), ids=_rel)
def test_no_diary_words_in_docs(path):
    found = diary_words(path.read_text())
    assert not found, f"{_rel(path)}: " + ", ".join(f"line {n} {w!r}" for n, w in found)


def test_no_diary_words_in_source_comments_and_docstrings():
    found = [
        f"{_rel(p)}:{n} {w!r}"
        for p in _modules()
        for n, w in diary_words(python_prose(p.read_text()))
    ]
    assert not found, "diary words in comments or docstrings:\n" + "\n".join(found)


@pytest.mark.parametrize("table", ["GPU_HEAVY", "CPU_SLOW"])
def test_every_listed_heavy_name_is_a_test_function_of_its_file(table):
    """A renamed test must not drop out of tests/conftest.py's GPU_HEAVY or CPU_SLOW list
    unnoticed."""
    import conftest

    tests_dir = Path(__file__).parent
    for file, names in getattr(conftest, table).items():
        tree = ast.parse((tests_dir / file).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        missing = [n for n in names if n != "*" and n not in defined]
        assert not missing, f"{file}: {missing} listed in {table} but not defined"
