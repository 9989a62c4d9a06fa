"""Every Python code block of the READMEs and of ``docs/`` runs as written, on the CPU backend.

Each ```` ```python ```` block is run as a program of its own, in a fresh folder, with
``IRIS_BACKEND=cpu`` and ``TRITON_INTERPRET=1``. A block that brings up ranks (it calls
``iris.mem.init``, uses ``iris.ccl`` / ``iris.ops`` or ``torch.distributed``) runs under
``torchrun --standalone`` with :data:`RANKS` processes; every other block runs in one
``python`` process. A program that does not finish by its deadline is killed with every
process it started, and fails.

A line right before a block's opening fence (blank lines between are allowed) changes how
it runs. In ``docs/`` it is a MyST comment, in the READMEs an HTML comment, so neither
shows on the rendered page:

``% skip-test: <reason>`` / ``<!-- skip-test: <reason> -->``
    the block is not run; the reason is required and shows in pytest's summary. For
    fragments of a larger program and for code that needs a GPU (Gluon kernels).
``% continue`` / ``<!-- continue -->``
    the block continues the program of the page's previous Python block: both run as one
    program, reported under the first block's line.
``% ranks: <n>`` / ``<!-- ranks: <n> -->``
    the block's program runs under torchrun with ``n`` processes instead of :data:`RANKS`
    (a page's example that must hold at any world size, such as one that splits a layer
    three ways).

A failure names the block (``docs/page.md:LINE``) and its traceback points at lines of the
markdown file.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iris.mem.testing import record_duration

ROOT = Path(__file__).resolve().parents[2]

#: Processes of a multi-rank block's world.
RANKS = 2
#: Deadlines (seconds) of one program; a loaded 2-core machine needs a few times the idle
#: duration (about 2 s for one process, 6-10 s for a world of two).
TIMEOUT_SINGLE = 120.0
TIMEOUT_WORLD = 180.0

_FENCE = re.compile(r"^(?P<indent> {0,3}|\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")
_MARKER = re.compile(
    r"^\s*(?:%|<!--)\s*(?P<kind>skip-test|continue|ranks)\b\s*(?::\s*(?P<reason>.*?))?\s*(?:-->)?\s*$"
)
_PYTHON_INFO = re.compile(r"^(?:python3?|py|\{code-block\}\s+python3?|\{code\}\s+python3?)$")
_MULTI_RANK = re.compile(r"\biris\.mem\.init\b|\biris\.(?:ccl|ops)\b|\btorch\.distributed\b|\bdist\.")


class MarkdownError(ValueError):
    """A marker that cannot be honoured (a skip without a reason, a continue without a block)."""


@dataclasses.dataclass
class Block:
    """One fenced Python block: its file, the line of its opening fence (1-based) and code."""

    path: Path
    line: int
    code: str
    skip: str | None = None
    cont: bool = False
    ranks: int | None = None


@dataclasses.dataclass
class Program:
    """One program to run: one block, or a block and the ``continue`` blocks after it."""

    blocks: list[Block]
    error: str | None = None  # a marker problem: the test fails with this message

    @property
    def path(self) -> Path:
        return self.blocks[0].path

    @property
    def id(self) -> str:
        try:
            name = self.path.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            name = self.path.name
        return f"{name}:{self.blocks[0].line}"

    @property
    def skip(self) -> str | None:
        return self.blocks[0].skip

    @property
    def source(self) -> str:
        return "".join(b.code for b in self.blocks)

    @property
    def ranks(self) -> int:
        if self.blocks[0].ranks is not None:
            return self.blocks[0].ranks
        return RANKS if _MULTI_RANK.search(self.source) else 1

    def markdown_line(self, program_line: int) -> tuple[Path, int] | None:
        """The markdown file and line of line ``program_line`` (1-based) of :attr:`source`."""
        start = 1
        for b in self.blocks:
            n = b.code.count("\n")
            if program_line < start + n:
                return b.path, b.line + 1 + (program_line - start)
            start += n
        return None


def parse_blocks(text: str, path: Path) -> list[Block]:
    """The fenced Python blocks of a markdown text, with their markers. Fences may be
    indented (list items); the block's code loses the fence's indentation."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, info = m.group("fence"), len(m.group("indent")), m.group("info")
        start = i
        body = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close.startswith(fence[0] * len(fence)) and set(close) == {fence[0]}:
                break
            line = lines[i]
            body.append(line[indent:] if line[:indent].isspace() or not indent else line.lstrip())
            i += 1
        i += 1
        if not _PYTHON_INFO.match(info):
            continue
        block = Block(path, start + 1, "".join(line + "\n" for line in body))
        marker = _marker_before(lines, start)
        if marker is not None:
            kind, reason = marker
            if kind == "skip-test":
                if not reason:
                    raise MarkdownError(f"{path}:{start + 1}: 'skip-test' needs a reason: skip-test: <why>")
                block.skip = reason
            elif kind == "ranks":
                if not reason.isdigit() or not 1 <= int(reason) <= 8:
                    raise MarkdownError(
                        f"{path}:{start + 1}: 'ranks' needs a number of ranks (1-8): ranks: <n>"
                    )
                block.ranks = int(reason)
            else:
                block.cont = True
        blocks.append(block)
    return blocks


def _marker_before(lines: list[str], fence: int) -> tuple[str, str] | None:
    """The marker on the last non-blank line before line index ``fence``, if any."""
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0:
        return None
    m = _MARKER.match(lines[j])
    return (m.group("kind"), m.group("reason") or "") if m else None


def programs_of(path: Path) -> list[Program]:
    """The programs of one markdown file, in page order."""
    try:
        blocks = parse_blocks(path.read_text(), path)
    except MarkdownError as exc:
        return [Program([Block(path, 0, "")], error=str(exc))]
    programs: list[Program] = []
    for b in blocks:
        if b.cont:
            where = f"{path}:{b.line}: 'continue'"
            if not programs:
                programs.append(Program([b], error=f"{where} with no Python block before it"))
            elif programs[-1].skip:
                programs.append(Program([b], error=f"{where} after a skipped block"))
            else:
                programs[-1].blocks.append(b)
        else:
            programs.append(Program([b]))
    return programs


def markdown_files() -> list[Path]:
    """The READMEs (root and packages) and every page under ``docs/``."""
    files = [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md"))]
    files += sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return [f for f in files if f.is_file()]


@dataclasses.dataclass
class Outcome:
    """How a program ended: exit code (None when killed at its deadline), output, seconds."""

    returncode: int | None
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (torchrun puts each rank in a session of its own,
    so killing torchrun's process group would leave the ranks running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_program(program: Program, folder: Path, timeout: float | None = None) -> Outcome:
    """Run ``program`` in ``folder`` (its working directory) on the CPU backend, under
    torchrun when it is multi-rank; at the deadline kill it and every process it started."""
    script = folder / "block.py"
    script.write_text(program.source)
    ranks = program.ranks
    if timeout is None:
        timeout = TIMEOUT_WORLD if ranks > 1 else TIMEOUT_SINGLE
    cmd = [sys.executable, str(script)]
    if ranks > 1:
        cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    env = {**os.environ, "IRIS_BACKEND": "cpu", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env.pop("IRIS_TEST_DURATIONS", None)  # the program's own worlds are not the test's
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output, _ = proc.communicate()
        output += f"\n[killed: still running after {timeout:g} s]"
        returncode = None
    seconds = time.monotonic() - started
    record_duration("docs-block", ranks, timeout, seconds, program.id, returncode is None)
    return Outcome(returncode, _point_at_markdown(output, program, script), seconds)


def _point_at_markdown(output: str, program: Program, script: Path) -> str:
    """Traceback lines of the program's file rewritten to the markdown file and line."""

    def repl(m: re.Match) -> str:
        where = program.markdown_line(int(m.group(1)))
        return f'File "{where[0]}", line {where[1]}' if where else m.group(0)

    return re.sub(rf'File "{re.escape(str(script))}", line (\d+)', repl, output)


def _collect() -> list:
    params = []
    for path in markdown_files():
        for program in programs_of(path):
            marks = [pytest.mark.skip(reason=f"{program.id}: {program.skip}")] if program.skip else []
            params.append(pytest.param(program, id=program.id, marks=marks))
    return params


@pytest.mark.timeout(TIMEOUT_WORLD + 60)
@pytest.mark.parametrize("program", _collect())
def test_code_block(program: Program, tmp_path: Path) -> None:
    if program.error:
        pytest.fail(program.error)
    outcome = run_program(program, tmp_path)
    what = f"under torchrun with {program.ranks} ranks" if program.ranks > 1 else "in one process"
    assert outcome.ok, f"{program.id} failed {what} (exit code {outcome.returncode}):\n{outcome.output}"


# ---- the runner itself --------------------------------------------------------------------


def _page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_markers(tmp_path: Path) -> None:
    text = (
        "# Page\n\n```python\nx = 1\n```\n\n% continue\n```python\nassert x == 1\n```\n\n"
        "<!-- skip-test: needs a GPU -->\n\n```python\nimport nothing_here\n```\n\n"
        "```bash\necho not python\n```\n\n- item\n\n  ```py\n  y = 2\n  ```\n"
    )
    progs = programs_of(_page(tmp_path, text))
    assert [p.blocks[0].line for p in progs] == [3, 14, 24]
    assert [b.line for b in progs[0].blocks] == [3, 8]
    assert progs[0].source == "x = 1\nassert x == 1\n"
    assert progs[0].markdown_line(2) == (tmp_path / "page.md", 9)
    assert progs[1].skip == "needs a GPU"
    assert progs[2].source == "y = 2\n"
    assert [p.ranks for p in progs] == [1, 1, 1]
    assert programs_of(_page(tmp_path, "```python\nimport iris.ccl\n```\n"))[0].ranks == RANKS
    assert programs_of(_page(tmp_path, "% ranks: 3\n```python\nimport iris.ccl\n```\n"))[0].ranks == 3


def test_marker_errors(tmp_path: Path) -> None:
    (prog,) = programs_of(_page(tmp_path, "% skip-test\n```python\npass\n```\n"))
    assert prog.error and "needs a reason" in prog.error
    (prog,) = programs_of(_page(tmp_path, "% continue\n```python\npass\n```\n"))
    assert prog.error and "no Python block before it" in prog.error
    (prog,) = programs_of(_page(tmp_path, "% ranks: many\n```python\npass\n```\n"))
    assert prog.error and "needs a number of ranks" in prog.error


def test_broken_block_fails(tmp_path: Path) -> None:
    """Negative control: a block that raises is reported as failing, at its markdown line."""
    page = _page(tmp_path, "# Broken\n\n```python\nx = 1 + 1\nassert x == 3, 'arithmetic'\n```\n")
    (prog,) = programs_of(page)
    outcome = run_program(prog, tmp_path)
    assert not outcome.ok
    assert "AssertionError: arithmetic" in outcome.output
    assert f'File "{page}", line 5' in outcome.output


def test_broken_world_fails(tmp_path: Path) -> None:
    """Negative control, multi-rank: one rank raising fails the world, which ends (the
    other rank, waiting for it, is stopped by torchrun) well before the deadline."""
    code = (
        "import torch.distributed as dist\n\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    raise RuntimeError('rank 1 gives up')\n"
        "dist.barrier()\n"
    )
    (prog,) = programs_of(_page(tmp_path, f"```python\n{code}```\n"))
    assert prog.ranks == RANKS
    outcome = run_program(prog, tmp_path)
    assert outcome.returncode not in (0, None), outcome.output
    assert "rank 1 gives up" in outcome.output


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_deadline_kills_every_rank(tmp_path: Path) -> None:
    """A world that outlives its deadline fails, and none of its ranks survives it."""
    code = (
        "# a torch.distributed world whose ranks never finish\n"
        "import os, time\n\n"
        "open(f\"rank{os.environ['RANK']}.pid\", 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    (prog,) = programs_of(_page(tmp_path, f"```python\n{code}```\n"))
    outcome = run_program(prog, tmp_path, timeout=20)
    assert outcome.returncode is None and "killed" in outcome.output
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert len(pids) == RANKS, f"the ranks did not start within the deadline:\n{outcome.output}"
    deadline = time.monotonic() + 10
    while (alive := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"ranks {alive} outlived the deadline"
