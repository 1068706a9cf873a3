"""Entry point compatible with the reference tool: ``python batch_runner.py --dataset_file ...``.

Equivalent to ``hermes-batch run ...``; also accepts ``--job FILE`` and every flag of
``hermes-batch run --help``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hermes.cli import main as cli_main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return cli_main(["run", *args])


if __name__ == "__main__":
    sys.exit(main())
