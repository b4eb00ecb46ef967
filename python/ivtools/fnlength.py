"""ivtools.fnlength - no function of the project's C or Python is over 80 lines of code.

The Rust of host/ is held to that by clippy's too_many_lines; this is the same rule for the
rest, run by `make lint` (lint-fnlength). A line of code is a line with something on it that is
not a comment; a Python docstring does not count either. A C function's lines run from its
opening brace to its closing one (its body, as clippy counts), a Python function's from its
first decorator or `def` to its last line. Nested functions count in the function that holds
them, as clippy counts a closure's lines in its function.

    python3 -m ivtools.fnlength [--max N] [FILE...]

Without files it checks every C file (.c, .h) and Python file (.py, or a python shebang) git
tracks or would track: all of them are ours (guest/kmod's too; checkpatch checks its style, not
its functions' length). It prints each function over the limit as
`path:line: name: N lines of code (max M)`, longest first, and exits 1 if there is one.
"""

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from ivtools import REPO

MAX_LINES = 80


@dataclass(frozen=True)
class Function:
    """One function: where it starts and how many lines of code it has."""

    path: str
    line: int
    name: str
    code_lines: int


# ---- Python ---------------------------------------------------------------------------------


def _python_noncode_lines(source: str, tree: ast.AST) -> set[int]:
    """The lines that hold only a comment or a docstring (blank lines are found by the caller)."""
    skip: set[int] = set()
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            skip.add(tok.start[0])
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    skip -= code  # a comment after code leaves the line a line of code
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            doc = node.body[0] if node.body else None
            if (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)):
                skip.update(range(doc.lineno, doc.end_lineno + 1))
    return skip


def python_functions(path: str, source: str) -> list[Function]:
    """Every function and method of one Python file with its lines of code."""
    tree = ast.parse(source, filename=path)
    lines = source.splitlines()
    skip = _python_noncode_lines(source, tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            span = range(start, node.end_lineno + 1)
            n = sum(1 for i in span if i not in skip and lines[i - 1].strip())
            found.append(Function(path, node.lineno, node.name, n))
    return found


# ---- C --------------------------------------------------------------------------------------

# Comments, then string and character literals (which may hold braces or comment markers).
_C_TOKENS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
# A preprocessor directive with its continuation lines (a macro's braces are not a function's).
_C_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
# A function definition's header ends in its name and parameter list (then maybe attributes).
_C_NAME = re.compile(r"(\w+)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*(?:__attribute__.*)?$", re.S)


def _c_code_only(source: str) -> str:
    """The source with comments and directives blanked and literals replaced by `""`, every
    newline kept so that offsets still give the line."""
    def blank(m: re.Match) -> str:
        text = m.group(0)
        if text.startswith(("/", "#")) or text.lstrip().startswith("#"):
            return re.sub(r"[^\n]", " ", text)
        return '""' + "\n" * text.count("\n")
    return _C_DIRECTIVE.sub(blank, _C_TOKENS.sub(blank, source))


def _c_function_name(header: str) -> re.Match | None:
    """Where the function's name is if the text before a `{` at file scope is a function's
    header; None for an initializer (`= {`) or a type's definition (no parameter list)."""
    if "=" in header:
        return None
    return _C_NAME.search(header.rstrip())


def c_functions(path: str, source: str) -> list[Function]:
    """Every function definition at file scope of one C file with its lines of code.

    A brace count over the code without comments, directives and literals: a `{` at depth 0
    whose header (the text since the last `;`, `}` or `{` at depth 0) ends in a parameter list
    opens a function. A definition whose braces an #if splits is not supported (none are)."""
    text = _c_code_only(source)
    lines = text.splitlines()
    found, depth, last, opened = [], 0, 0, None
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                m = _c_function_name(text[last:i])
                opened = (m.group(1), text.count("\n", 0, last + m.start(1)),
                          text.count("\n", 0, i)) if m else None
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                if opened:
                    name, at, first = opened
                    end = text.count("\n", 0, i)
                    n = sum(1 for ln in lines[first:end + 1] if ln.strip())
                    found.append(Function(path, at + 1, name, n))
                opened, last = None, i + 1
        elif ch == ";" and depth == 0:
            last = i + 1
    return found


# ---- the check ------------------------------------------------------------------------------


def functions(path: str, root: Path = REPO) -> list[Function]:
    """The functions of one file (relative to root), C if it ends in .c or .h, else Python."""
    source = (root / path).read_text()
    if path.endswith((".c", ".h")):
        return c_functions(path, source)
    return python_functions(path, source)


def _is_python(path: str) -> bool:
    """A .py file, or a file without a suffix whose shebang runs python (scripts/, vm/)."""
    if path.endswith(".py"):
        return True
    if "." in Path(path).name:
        return False
    try:
        with open(REPO / path, "rb") as f:
            first = f.readline(100)
    except (IsADirectoryError, FileNotFoundError):
        return False
    return first.startswith(b"#!") and b"python" in first


def project_files() -> list[str]:
    """The C and Python files git tracks or would track."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout.split("\n")
    return [f for f in listed if f.endswith((".c", ".h")) or (f and _is_python(f))]


def too_long(paths: list[str], limit: int, root: Path = REPO) -> list[Function]:
    """The functions of these files with more than `limit` lines of code, longest first."""
    over = [fn for p in paths for fn in functions(p, root) if fn.code_lines > limit]
    return sorted(over, key=lambda fn: -fn.code_lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ivtools.fnlength", description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=MAX_LINES, help="lines of code allowed (80)")
    ap.add_argument("files", nargs="*", help="files to check (default: the project's C and Python)")
    args = ap.parse_args(argv)
    # Files named on the command line are relative to where it runs, the project's to REPO.
    paths, root = (args.files, Path.cwd()) if args.files else (project_files(), REPO)
    over = too_long(paths, args.max, root)
    for fn in over:
        print(f"{fn.path}:{fn.line}: {fn.name}: {fn.code_lines} lines of code (max {args.max})")
    if over:
        print(f"fnlength: {len(over)} function(s) over {args.max} lines of code: split them into "
              "named steps", file=sys.stderr)
        return 1
    print(f"fnlength: ok ({len(paths)} files, no function over {args.max} lines of code)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
