"""Invariant: what a new user does in their first hour works as the README says, on a CPU.

Shipped scenarios are found by name from any folder; a builder loads from a file path or from
the current folder, and a builder that cannot load or be called is one line on stderr and exit
2 before anything runs; a builder that raises is UNSAFE naming the exception; reports get the
umask's permissions; the pytest plugin shows the report, not its own source; and the README's
"Checking your own builder" walk (its code blocks, read from README.md) gives the verdicts it
promises.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pagegraph.check.scenario import shipped_scenarios
from pagegraph.cli import main

from helpers import CPU_PASSES, assert_passed_in_text, table_row

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
POISON = -94741925
#: The contract's positional arguments, as a load error must spell them.
CONTRACT = "req_to_token, req_pool_indices, seq_lens, page_table, page_size"

#: A correct builder: pagegraph's own kernel behind the contract's signature.
GOOD = """\
from pagegraph import build_page_table


def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *,
          swa_page_table=None, full_to_swa=None, errors=None):
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size,
                     swa_page_table=swa_page_table, full_to_swa=full_to_swa, errors=errors)


def helper():
    pass
"""

#: A builder that raises on line 4, on every call.
RAISES = """\
def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *,
          swa_page_table=None, full_to_swa=None, errors=None):
    rows = page_table.shape[0]
    raise RuntimeError(f"boom in the builder ({rows} rows)")
"""
RAISES_LINE = 4


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(ROOT / "src"), env.get("PYTHONPATH", "")] if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def pagegraph(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m pagegraph ARGS`` in ``cwd``, pagegraph taken from this source tree."""
    return subprocess.run(
        [sys.executable, "-m", "pagegraph", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    return lines[0]


def _row(out: str, prop: str) -> str:
    """The property table's row of ``prop`` (``helpers.table_row``)."""
    return table_row(out, prop)


def _status(out: str, prop: str) -> str:
    return _row(out, prop).split("|")[3].strip()


# -- shipped scenarios by name, from another folder --------------------------------------------


@pytest.mark.heavy
def test_a_shipped_scenario_runs_by_name_from_another_folder(tmp_path):
    proc = pagegraph("check", "default", "--replays", "10", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1/1 scenario(s) safe" in proc.stdout


@pytest.mark.heavy
def test_an_unknown_scenario_is_one_line_naming_the_shipped_ones(tmp_path):
    proc = pagegraph("check", "no-such-scenario", cwd=tmp_path)
    assert proc.returncode == 2
    line = _one_line(proc.stderr)
    assert line.startswith("pagegraph check: no-such-scenario")
    assert all(name in line for name in shipped_scenarios())
    assert "default" in line and "sglang-h200" in line
    assert proc.stdout == ""


# -- loading a builder -------------------------------------------------------------------------


def test_a_builder_file_with_a_syntax_error_is_one_line_with_file_and_line(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text("import torch\n\ndef build(a, b):\n    x = = 1\n")
    assert main(["check", "default", "--builder", f"{path}:build"]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert "SyntaxError" in line and f"{path}:4" in line
    assert captured.out == ""  # nothing ran


@pytest.mark.heavy
def test_a_builder_by_absolute_file_path_is_checked(tmp_path, capsys):
    path = tmp_path / "mybuilder.py"
    path.write_text(GOOD)
    code = main(["check", "default", "--replays", "10", "--builder", f"{path}:build"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verdict: SAFE" in out
    assert_passed_in_text(out, *CPU_PASSES, "row containment")


@pytest.mark.heavy
def test_a_builder_module_in_the_current_folder_loads_by_name(tmp_path):
    (tmp_path / "mybuilder.py").write_text(GOOD)
    proc = pagegraph(
        "check", "default", "--replays", "10", "--builder", "mybuilder:build", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: SAFE" in proc.stdout
    # From any other folder the module is not importable: one line with the way out.
    other = tmp_path / "other"
    other.mkdir()
    proc = pagegraph("check", "default", "--builder", "mybuilder:build", cwd=other)
    assert proc.returncode == 2
    line = _one_line(proc.stderr)
    assert "mybuilder" in line and "PYTHONPATH" in line and "file.py:function" in line


def test_a_missing_function_names_the_files_functions(tmp_path, capsys):
    path = tmp_path / "mybuilder.py"
    path.write_text(GOOD)
    assert main(["check", "default", "--builder", f"{path}:build_table"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "build_table" in line
    listed = re.search(r"its functions: ([^)]*)\)", line)
    assert listed and {"build", "helper"} <= set(listed.group(1).split(", ")), line


@pytest.mark.parametrize(
    "source,needs",
    [
        # Two positional arguments where the contract passes five: the contract is shown.
        ("def build(a, b):\n    pass\n", [CONTRACT]),
        # The contract's positionals but no SWA outputs, on a scenario with SWA.
        (f"def build({CONTRACT}):\n    pass\n", ["swa_page_table", "swa = true"]),
    ],
    ids=["two-arguments", "no-swa-outputs"],
)
def test_a_builder_that_cannot_be_called_is_one_line(tmp_path, capsys, source, needs):
    path = tmp_path / "mybuilder.py"
    path.write_text(source)
    assert main(["check", "default", "--builder", f"{path}:build"]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert captured.out == ""  # nothing ran
    for text in needs:
        assert text in line, text


@pytest.fixture(scope="module")
def raising_check(tmp_path_factory):
    """``check default`` of a builder that raises: (exit code, stdout, the builder's path)."""
    folder = tmp_path_factory.mktemp("raising")
    path = folder / "mybuilder.py"
    path.write_text(RAISES)
    proc = pagegraph(
        "check", "default", "--replays", "10", "--builder", f"{path}:build", cwd=folder
    )
    return proc.returncode, proc.stdout, path


@pytest.mark.heavy
def test_a_builder_that_raises_is_unsafe_naming_the_exception_and_phase(raising_check):
    code, out, _ = raising_check
    assert code == 1, out
    assert "verdict: UNSAFE" in out
    assert _status(out, "capture") == "FAIL"
    row = _row(out, "capture")
    assert "RuntimeError" in row and "boom in the builder" in row


@pytest.mark.heavy
def test_a_builder_that_raises_names_the_line_in_the_builders_code(raising_check):
    code, out, path = raising_check
    assert code == 1
    assert f"{path}:{RAISES_LINE}" in _row(out, "capture")


# -- reports -----------------------------------------------------------------------------------


def test_a_report_into_a_missing_folder_exits_2_and_writes_nothing(tmp_path, capsys):
    for option in ("--json", "--markdown"):
        target = tmp_path / "missing" / "report.out"
        assert main(["check", "default", "--replays", "2", option, str(target)]) == 2
        captured = capsys.readouterr()
        line = _one_line(captured.err)
        assert option in line and str(tmp_path / "missing") in line
        assert captured.out == "" and not (tmp_path / "missing").exists()


def test_reports_get_the_umasks_permissions(tmp_path, capsys):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    old = os.umask(0o022)
    try:
        code = main(
            [
                "check",
                "default",
                "--replays",
                "3",
                "--no-isolate",
                "--quiet",
                "--json",
                str(out_json),
                "--markdown",
                str(out_md),
            ]
        )
        umask = os.umask(0o022)
    finally:
        os.umask(old)
    assert code == 0, capsys.readouterr().out
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in (out_json, out_md)}
    want = oct(0o666 & ~umask)
    assert modes == {"r.json": want, "r.md": want}
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# -- the pytest plugin -------------------------------------------------------------------------

PLUGIN_TEST = """\
from pagegraph import build_page_table
from pagegraph.pytest_plugin import assert_replay_safe

SHAPE = dict(max_bs=8, max_context_len=256, page_size=16, steps=6)


def build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *,
          swa_page_table=None, full_to_swa=None, errors=None):
    build_page_table(req_to_token, req_pool_indices, seq_lens, page_table, page_size,
                     errors=errors)


def planted(req_to_token, req_pool_indices, seq_lens, page_table, page_size, *,
            swa_page_table=None, full_to_swa=None, errors=None):
    build(req_to_token, req_pool_indices, seq_lens, page_table, page_size, errors=errors)
    page_table[:, -1] = 7  # past the live pages of every row shorter than the table


def test_correct_builder():
    assert_replay_safe(build, **SHAPE)


def test_planted_bug():
    assert_replay_safe(planted, **SHAPE)
"""


def inner_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest on ``folder`` in a child process with pagegraph's plugin (named with -p, and
    entry points off, so an installed pagegraph does not register it twice)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "pagegraph.pytest_plugin",
            *args,
        ],
        cwd=folder,
        env=_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.heavy
def test_the_plugin_shows_the_report_and_not_its_own_source(tmp_path):
    (tmp_path / "test_mine.py").write_text(PLUGIN_TEST)
    proc = inner_pytest(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed" in out
    assert "test_planted_bug" in out and "verdict: UNSAFE" in out
    assert _status(out, "bounded writes") == "FAIL"
    for own in ("__tracebackhide__", "raise ReplayUnsafe", "check_replay_safety(builder"):
        assert own not in out, own


# -- the README's walk, read from README.md ----------------------------------------------------


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, code) of every fenced code block of Markdown ``text``, in order."""
    blocks, info, code = [], None, []
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if info is None:
                info, code = line[3:].strip(), []
            else:
                blocks.append((info, "".join(code)))
                info = None
        elif info is not None:
            code.append(line)
    return blocks


def readme_walk(text: str) -> dict:
    """The "Checking your own builder" section's pieces: the builder file's name and code, the
    commands with the exit code and verdict their comments promise, the planted bug's
    replacement (old, new), the properties that must then fail, and the pytest example."""
    section = re.search(r"^## Checking your own builder\n(.*?)^## ", text, re.M | re.S)
    assert section, "README.md has no '## Checking your own builder' section"
    body = section.group(1)
    saved = re.search(r"saved as `([\w.]+\.py)`:\s*```python\n(.*?)```", body, re.S)
    assert saved, "no '... saved as `NAME.py`:' code block"
    commands = []
    for info, block in fenced_blocks(body):
        if info:
            continue
        for line in block.splitlines():
            cmd, _, comment = line.partition("#")
            promise = re.search(r"verdict: (\w+), exit (\d+)", comment)
            if cmd.strip() and promise:
                commands.append((shlex.split(cmd), promise.group(1), int(promise.group(2))))
    bug = re.search(r"plant the classic .*?`([^`]+)` instead of\s+`([^`]+)`", body, re.S)
    assert bug, "no 'plant the classic ... `NEW` instead of `OLD`' sentence"
    names = re.search(r"property table names\s+(.*?) with the first", body, re.S)
    assert names, "no 'the property table names `...`' sentence"
    tests = [code for info, code in fenced_blocks(body) if info == "python" and "def test_" in code]
    assert len(tests) == 1, "no pytest example (a python block with a test function)"
    return {
        "file": saved.group(1),
        "code": saved.group(2),
        "commands": commands,
        "bug": (bug.group(2), bug.group(1)),
        "failing": re.findall(r"`([^`]+)`", names.group(1)),
        "pytest": tests[0],
    }


def test_readme_walk_is_found():
    walk = readme_walk(README.read_text())
    assert walk["file"] == "mybuilder.py" and "def build(" in walk["code"]
    assert walk["commands"] and walk["failing"][0] == "bounded writes"
    old, new = walk["bug"]
    assert old in walk["code"] and new != old
    # A builder for GPUs: nothing that reads a device value on the host.
    for sync in (".item()", ".tolist()", ".cpu()", ".numpy()"):
        assert sync not in walk["code"], sync
    with pytest.raises(AssertionError, match="no '## Checking your own builder' section"):
        readme_walk("# pagegraph\n\n## Install\n")


def _as_module_call(argv: list[str]) -> list[str]:
    """``.venv/bin/pagegraph ARGS`` or ``pagegraph ARGS`` as ``python -m pagegraph ARGS``."""
    assert Path(argv[0]).name == "pagegraph", argv
    return [sys.executable, "-m", "pagegraph", *argv[1:]]


@pytest.fixture(scope="module")
def walk():
    return readme_walk(README.read_text())


def _run_walk(folder: Path, walk: dict, code: str) -> list[tuple]:
    """Each README command on ``code`` saved in ``folder``: (process, verdict, exit code)."""
    (folder / walk["file"]).write_text(code)
    runs = []
    for argv, verdict, exit_code in walk["commands"]:
        proc = subprocess.run(
            _as_module_call(argv),
            cwd=folder,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        runs.append((proc, verdict, exit_code))
    return runs


@pytest.mark.heavy
def test_readme_builder_gets_the_verdict_the_readme_promises(tmp_path, walk):
    for proc, verdict, exit_code in _run_walk(tmp_path, walk, walk["code"]):
        out = proc.stdout + proc.stderr
        assert f"verdict: {verdict}" in proc.stdout, out
        assert proc.returncode == exit_code, out
        if verdict == "SAFE":
            assert_passed_in_text(proc.stdout, *CPU_PASSES)


@pytest.mark.heavy
def test_readme_planted_bug_is_unsafe_naming_the_properties(tmp_path, walk):
    old, new = walk["bug"]
    assert walk["code"].count(old) == 1, f"{old!r} is not once in the README's builder"
    runs = _run_walk(tmp_path, walk, walk["code"].replace(old, new))
    for proc, _, _ in runs:
        out = proc.stdout
        assert proc.returncode == 1, out + proc.stderr
        assert "verdict: UNSAFE" in out
        for prop in walk["failing"]:
            assert _status(out, prop) == "FAIL", _row(out, prop)
        row = _row(out, "bounded writes")
        # The first failing replay, its bucket, the cell, the poison, and what the entry was.
        assert re.search(r"replay \d+ \(bucket \d+\): \w+\[\d+, \d+\]", row), row
        assert f"expected {POISON}" in row and "stale tail" in row and "seq_len" in row, row


@pytest.mark.heavy
def test_readme_pytest_example_passes(tmp_path, walk):
    (tmp_path / walk["file"]).write_text(walk["code"])
    (tmp_path / "test_mybuilder.py").write_text(walk["pytest"])
    proc = inner_pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


def test_a_builder_file_that_exits_on_import_is_one_line(tmp_path):
    from pagegraph.graph.builder_names import resolve_builder
    from pagegraph.kernels.registry import BuilderLoadError

    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(BuilderLoadError, match=r"called exit\(3\)"):
        resolve_builder(f"{tmp_path / 'exits.py'}:f")


def test_a_builder_file_asked_for_by_several_threads_at_once_is_run_once_and_whole(tmp_path):
    # A worker pool plans its checks in one thread per worker. The file takes a moment to run
    # (as a builder importing torch does): a thread arriving meanwhile must wait for the whole
    # module, not be handed the half-run one that has no ``build`` yet.
    import threading

    from pagegraph.graph.builder_names import resolve_builder

    runs = tmp_path / "runs"
    (tmp_path / "slow_import.py").write_text(
        "import time\n"
        f"open({str(runs)!r}, 'a').write('ran\\n')\n"
        "time.sleep(0.3)\n"
        "def build(*args, **kwargs):\n"
        "    pass\n"
    )
    spec = f"{tmp_path / 'slow_import.py'}:build"
    found, errors = [], []

    def resolve():
        try:
            found.append(resolve_builder(spec))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=resolve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(found) == 4 and all(fn is found[0] for fn in found)
    assert runs.read_text() == "ran\n"


def test_scenario_paths_only_fall_back_to_shipped_names(tmp_path, monkeypatch):
    from pagegraph.check.scenario import ScenarioNotFound, scenario_path

    with pytest.raises(ScenarioNotFound):
        scenario_path(str(tmp_path / "graphs" / "default.toml"))  # someone else's missing file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").mkdir()  # a folder of that name is not the scenario
    assert scenario_path("default").name == "default.toml"
    assert scenario_path("graphs/default.toml").is_file()
