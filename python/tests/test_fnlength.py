"""ivtools.fnlength on real sources: what counts as a line of code, what is a function, the exit
status `make lint` reads."""

from ivtools import fnlength
from ivtools.fnlength import c_functions, python_functions


def py_function(code_lines: int) -> str:
    """A Python function with this many lines of code, padded with what must not count."""
    body = "\n".join(f"    x{i} = {i}  # a comment after code" for i in range(code_lines - 1))
    return ('def f():\n    """A docstring\n\n    over several lines."""\n'
            "    # a comment line\n\n" + body + "\n")


def test_python_docstrings_comments_and_blank_lines_do_not_count():
    [fn] = python_functions("m.py", py_function(80))
    assert (fn.name, fn.line, fn.code_lines) == ("f", 1, 80)


def test_python_nested_functions_count_in_their_outer_function_too():
    src = "@decorator\ndef outer():\n    def inner():\n        return 1\n    return inner\n"
    found = {fn.name: fn.code_lines for fn in python_functions("m.py", src)}
    assert found == {"outer": 5, "inner": 2}


def test_python_a_string_that_is_not_a_docstring_is_code():
    src = 'def f():\n    x = """not a docstring,\n    a value"""\n    return x\n'
    [fn] = python_functions("m.py", src)
    assert fn.code_lines == 4


C_SOURCE = r"""/* a { block } comment */
#include <stdio.h>
#define ITEM(x) do { f(x); } while (0)

struct pair { int a, b; };
static const struct pair pairs[] = { { 1, 2 }, { 3, 4 } };
typedef struct { int c; } cee;

static int cb(int (*fn)(int), const char *s)
{
	/* a comment line { */
	const char *brace = "}{";

	// another
	return fn(s[0]) + (brace[0] == '{');
}

__attribute__((noinline)) void last(void) { printf("%d\n", '}'); }
"""


def test_c_functions_are_found_and_only_code_lines_count():
    found = {fn.name: (fn.line, fn.code_lines) for fn in c_functions("x.c", C_SOURCE)}
    # cb: the braces and two statements; the initializer, the struct and the typedef are
    # not functions, braces in comments, strings and character literals do not nest.
    assert found == {"cb": (9, 4), "last": (18, 1)}


def test_the_check_fails_on_a_function_over_the_limit_and_names_it(tmp_path, capsys):
    (tmp_path / "ok.py").write_text(py_function(80))
    (tmp_path / "long.py").write_text(py_function(81))
    c_body = "".join(f"\tx += {i};\n" for i in range(79))
    (tmp_path / "long.c").write_text(f"int g(void)\n{{\n\tint x = 0;\n{c_body}\treturn x;\n}}\n")
    assert fnlength.main([str(tmp_path / "ok.py")]) == 0
    assert fnlength.main([str(tmp_path / p) for p in ("ok.py", "long.py", "long.c")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [f"{tmp_path}/long.c:1: g: 83 lines of code (max 80)",
                        f"{tmp_path}/long.py:1: f: 81 lines of code (max 80)"]


def test_the_project_files_are_its_c_and_python_wherever_they_are():
    files = set(fnlength.project_files())
    assert {"bench/native/ivbench.c", "abi/include/ivtrace/writer.h", "guest/kmod/ivtk_main.c",
            "python/ivtools/fnlength.py", "scripts/install-tracecompass"} <= files
    assert not [f for f in files if f.endswith((".rs", ".sh", ".md"))]
