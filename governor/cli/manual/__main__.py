"""``python -m governor.cli.manual [--check] [--root DIR]``: write the generated parts of the manual
(governor/cli/manual/__init__.py) under DIR (default: the source tree this package lives in);
with --check write nothing and exit 1 naming each file that is not current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from governor.cli.manual.generate import generated

SOURCE_TREE = Path(__file__).resolve().parents[3]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m governor.cli.manual")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--root", type=Path, default=SOURCE_TREE, help="the source tree")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in generated().items():
        path = args.root / rel
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(rel)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    verb = "not current" if args.check else "written"
    for rel in stale:
        print(f"{rel}: {verb}")
    if args.check and stale:
        print("rerun: python -m governor.cli.manual", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
