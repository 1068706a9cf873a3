"""Entry point compatible with the reference tool: ``python batch_runner.py ...``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hermes.cli import main as cli_main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--list_tools" in args or "--list-tools" in args:
        rest = [a for a in args if a not in ("--list_tools", "--list-tools")]
        return cli_main(["tools", *rest])
    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
