"""One input boundary: every file epycd reads goes through epycd/readfile.py.

A path a person or another process can point at may be a FIFO (a plain `open` waits for a
writer for ever), /dev/zero (a plain `read` grows without bound), a folder or a huge file.
`epycd.readfile` opens without blocking, refuses what is not a regular file and reads at
most a cap. This test walks every module under epycd/ (ast) and fails on any other way of
reading a file, naming the module, the line and the call, and how to fix it. What may read
otherwise is the short list of `EXEMPT` (module, function) pairs below, each with its reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "epycd"
BOUNDARY = "epycd/readfile.py"

EXEMPT: dict[tuple[str, str], str] = {
    ("epycd/engines/vllm/model/footprint.py", "_read"): (
        "shipped data: data/footprint/VERSION.json inside the package"
    ),
    ("epycd/engines/vllm/model/registry_tables.py", "load_table"): (
        "shipped data: data/vllm/VERSION.json inside the package"
    ),
    ("epycd/engines/llama_cpp/model/format.py", "load_table"): (
        "shipped data: data/llama.cpp/VERSION.json (tables_dir) inside the package"
    ),
    ("epycd/engines/vllm/model/registry_tables.py", "read_registry_source"): (
        "the maintainer's table builder (python -m ...registry_tables) reading a vLLM wheel; "
        "no epycctl command or epycd reaches it"
    ),
    ("epycd/engines/llama_cpp/model/format.py", "read_source_file"): (
        "the maintainer's table builder (python -m ...llama_cpp.model.format) reading a "
        "llama.cpp source archive; no epycctl command or epycd reaches it"
    ),
    ("epycd/host/files.py", "read_required"): "/proc and /sys of the host root (detection)",
    ("epycd/host/files.py", "read_optional"): "/proc and /sys of the host root (detection)",
    ("epycd/settings.py", "trusted_admin_group"): (
        "root's epycd.conf read with O_NOFOLLOW and an owner check of the open descriptor: "
        "stricter than readfile (regular file, non-blocking, capped as readfile reads)"
    ),
    ("epycd/atomic.py", "fsync_dir"): "a folder's descriptor for fsync: no bytes are read",
    ("epycd/cli/export.py", "write_new"): "a write (O_WRONLY | O_CREAT | O_EXCL)",
    ("epycd/cli/export.py", "write_files"): "a folder's descriptor (O_DIRECTORY) to write in",
    ("epycd/approval/install.py", "state_lock"): "the state lock file: flock, never read",
}
"""(module, function) -> why it may read a file without epycd/readfile.py."""

FIX = (
    "read it with epycd.readfile (read_bytes, read_text, read_json_object or read_model, "
    "with a cap constant of epycd/readfile.py; add one there if none fits); only shipped "
    "data, /proc and /sys through epycd/host/files.py, writes and lock files may be added to "
    "EXEMPT in tests/test_input_boundary.py, with the reason"
)

READ_METHODS = {"read_text", "read_bytes"}
"""Path's whole-file reads (`epycd.readfile.read_text` is called by its bare name)."""
MODULE_READS = {
    ("json", "load"),
    ("tomllib", "load"),
    ("tomli", "load"),
    ("pickle", "load"),
    ("yaml", "load"),
    ("tarfile", "open"),
    ("tarfile", "TarFile"),
    ("zipfile", "ZipFile"),
    ("io", "open"),
    ("io", "FileIO"),
    ("codecs", "open"),
    ("gzip", "open"),
    ("mmap", "mmap"),
    ("np", "fromfile"),
    ("np", "memmap"),
    ("np", "load"),
    ("numpy", "fromfile"),
    ("numpy", "memmap"),
    ("numpy", "load"),
    ("torch", "load"),
    ("safetensors", "safe_open"),
    ("linecache", "getline"),
    ("fileinput", "input"),
}
"""module.function calls that read a file."""
BARE_READS = {"safe_open", "fromfile", "memmap", "FileIO"}
"""Reads called by a bare imported name."""
WRITE_ONLY_FLAGS = {"O_WRONLY"}


@dataclass(frozen=True)
class Read:
    module: str
    line: int
    function: str
    call: str

    def describe(self) -> str:
        return f"{self.module}:{self.line}: {self.call} in {self.function}()"


def _mode_reads(call: ast.Call, position: int) -> bool:
    """Whether an open-like call's mode (positional `position` or mode=) reads: the default
    "r" does, a constant without r or + does not, anything else is taken as reading."""
    mode: ast.expr | None = call.args[position] if len(call.args) > position else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    if mode is None:
        return True
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return "r" in mode.value or "+" in mode.value
    return True


def _flag_names(node: ast.expr) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name)
    }


def _reads(call: ast.Call) -> str | None:
    """The call as written when it reads a file, else None."""
    func = call.func
    text = ast.unparse(func)
    if isinstance(func, ast.Name):
        if func.id == "open" and _mode_reads(call, 1):
            return f"{text}()"
        return f"{text}()" if func.id in BARE_READS else None
    if not isinstance(func, ast.Attribute):
        return None
    owner = ast.unparse(func.value)
    if func.attr in READ_METHODS and owner != "readfile":
        return f"{text}()"
    if (owner, func.attr) in MODULE_READS:
        return f"{text}()"
    if owner == "os" and func.attr == "open":
        flags = call.args[1] if len(call.args) > 1 else None
        if flags is None or not _flag_names(flags) & WRITE_ONLY_FLAGS:
            return f"{text}()"
        return None
    if owner == "os" and func.attr == "fdopen":
        return f"{text}()" if _mode_reads(call, 1) else None
    if func.attr == "open" and owner not in {"os", "webbrowser"}:  # Path.open and the like
        return f"{text}()" if _mode_reads(call, 0) else None
    return None


class Finder(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.found: list[Read] = []

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = _scoped
    visit_AsyncFunctionDef = _scoped
    visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        call = _reads(node)
        if call is not None:
            function = ".".join(self.scope) or "<module>"
            self.found.append(Read(self.module, node.lineno, function, call))
        self.generic_visit(node)


def reads_in(source: str, module: str) -> list[Read]:
    finder = Finder(module)
    finder.visit(ast.parse(source))
    return finder.found


def package_reads() -> list[Read]:
    found: list[Read] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE.parent))
        if module != BOUNDARY:
            found += reads_in(path.read_text(encoding="utf-8"), module)
    return found


def _allowed(read: Read) -> bool:
    key = (read.module, read.function)
    return key in EXEMPT


def test_every_read_goes_through_readfile() -> None:
    stray = [read for read in package_reads() if not _allowed(read)]
    assert not stray, (
        f"{len(stray)} read(s) outside {BOUNDARY}:\n"
        + "\n".join("  " + read.describe() for read in stray)
        + f"\nFix: {FIX}"
    )


def test_every_exemption_is_still_needed() -> None:
    """An exemption whose read is gone is removed, so the list stays short and true."""
    used = {(read.module, read.function) for read in package_reads()}
    stale = sorted(set(EXEMPT) - used)
    assert not stale, f"exemptions with no read left (remove them from EXEMPT): {stale}"


def test_exemptions_say_why() -> None:
    assert all(reason.strip() for reason in EXEMPT.values())
    assert len(EXEMPT) <= 15, "the exemptions are a short list: read through readfile instead"


@pytest.mark.parametrize(
    ("source", "call"),
    [
        ("p.read_text()", "p.read_text()"),
        ("Path(x).read_bytes()", "Path(x).read_bytes()"),
        ("open(p)", "open()"),
        ("open(p, 'rb')", "open()"),
        ("open(p, mode='r+')", "open()"),
        ("p.open()", "p.open()"),
        ("p.open('rb')", "p.open()"),
        ("os.open(p, os.O_RDONLY)", "os.open()"),
        ("os.open(p, flags)", "os.open()"),
        ("os.fdopen(fd)", "os.fdopen()"),
        ("json.load(handle)", "json.load()"),
        ("tomllib.load(handle)", "tomllib.load()"),
        ("tarfile.open(p)", "tarfile.open()"),
        ("io.open(p)", "io.open()"),
        ("np.fromfile(p)", "np.fromfile()"),
        ("numpy.memmap(p)", "numpy.memmap()"),
        ("safe_open(p, 'pt')", "safe_open()"),
        ("zipfile.ZipFile(p)", "zipfile.ZipFile()"),
    ],
)
def test_finder_sees_each_way_of_reading(source: str, call: str) -> None:
    found = reads_in(f"def f():\n    {source}\n", "epycd/x.py")
    assert [(read.call, read.function, read.line) for read in found] == [(call, "f", 2)]


@pytest.mark.parametrize(
    "source",
    [
        "read_text(p, CAP)",
        "readfile.read_bytes(p, CAP)",
        "open(p, 'w')",
        "p.open('ab')",
        "os.open(p, os.O_WRONLY | os.O_CREAT)",
        "os.fdopen(fd, 'w')",
        "json.loads(text)",
        "webbrowser.open(url)",
    ],
)
def test_finder_passes_what_does_not_read(source: str) -> None:
    assert reads_in(f"def f():\n    {source}\n", "epycd/x.py") == []
