"""``python -m rcn_fast.train_retriever --train FILE --base MODEL --out DIR``:
train an explanation- or concept-based retriever (see
:mod:`rcn_fast.retrieval.train`)."""

import sys

from rcn_fast.retrieval.train import main

if __name__ == "__main__":
    sys.exit(main())
