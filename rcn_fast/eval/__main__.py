"""``python -m rcn_fast.eval`` (see :mod:`rcn_fast.eval.cli`)."""

import sys

from rcn_fast.eval.cli import main

if __name__ == "__main__":
    sys.exit(main())
