"""Lines of code in the package, as issue 17 counts them: no blank lines, comments or
docstrings (module, class and function docstrings, and any other bare string statement), and
no migrations.

    python bench/count_code_lines.py [--top 20] [django_throttle]
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

_LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> int:
    """The lines holding code: some token that is not layout, outside a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        for statement in body if isinstance(body, list) else ():
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                end = statement.end_lineno or statement.lineno
                docstrings.update(range(statement.lineno, end + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _LAYOUT:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="django_throttle")
    parser.add_argument("--top", type=int, default=20, help="largest modules to list")
    args = parser.parse_args()
    counts = {
        path: code_lines(path.read_text("utf-8"))
        for path in sorted(Path(args.package).rglob("*.py"))
        if "migrations" not in path.parts
    }
    for path, count in sorted(counts.items(), key=lambda item: -item[1])[: args.top]:
        print(f"{count:5} {path}")
    print(f"{sum(counts.values()):5} lines of code in {len(counts)} modules")


if __name__ == "__main__":
    main()
