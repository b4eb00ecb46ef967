"""Formatting shared by the sections of docs/performance.md."""


def f1(v, nd=1):
    return "–" if v is None else f"{v:,.{nd}f}"


def ratio(a, b):
    return None if (a is None or b is None or b <= 0) else a / b


def git_line(git: dict) -> str:
    """`commit abc123def456`, and the paths that had uncommitted changes when it ran."""
    dirty = git.get("uncommitted") or []
    shown = ", ".join(dirty[:6]) + (f" and {len(dirty) - 6} more" if len(dirty) > 6 else "")
    return f"commit {str(git.get('commit'))[:12]}" + \
        (f", with uncommitted changes in {shown}" if dirty else "")
