"""SEPTA: subgraph retrieval enhanced by graph-text alignment, for
multiple-choice commonsense QA (a trained system; no LLM).

Offline steps (``python -m rcn_fast.septa align|build-db|train``, or the
functions below) fill one directory that the ``"septa"`` pipeline loads:

1. :func:`prepare_alignment` + :func:`run_alignment` -- BFS subgraphs
   (:func:`rcn_fast.kg.bfs_subgraphs`) and their sentences; a GraphGPS-style
   GNN (:func:`SubgraphEncoder`) aligned with a frozen text encoder by
   symmetric InfoNCE (:func:`info_nce`), with checkpoints and resume.
2. :func:`build_database` -- eq. 9 vectors (:func:`subgraph_vectors`) of a
   subgraph per node in a cosine :class:`SubgraphDB` (rcn_fast.FlatIndex).
3. :func:`run_training` -- query enhancement (:class:`QueryEnhancer`),
   retrieval, and the attention predictor (:func:`SeptaPredictor`, eqs.
   10-13) trained with cross-entropy and RAdam; the text encoder frozen
   (default, CPU-friendly) or fine-tuned with it as in the paper
   (``PredictorConfig(finetune_encoder=True)``, :func:`FinetunedText`).

Then ``rcn_fast.pipelines.build("septa", llm=None, checkpoint=DIR)``.
Needs torch and numba: ``pip install "rcn_fast[septa]"``.
"""

from rcn_fast.septa.align import AlignConfig, AlignModel, info_nce, recall_at_k, subgraph_vectors, train_alignment
from rcn_fast.septa.gnn import GNNConfig, GPSLayer, SubgraphEncoder, SubgraphTable
from rcn_fast.septa.predictor import (
    FinetunedText,
    PredictorConfig,
    QuestionFeatures,
    SeptaPredictor,
    accuracy,
    train_predictor,
)
from rcn_fast.septa.query import EnhancedQuery, EntityLinker, QueryEnhancer
from rcn_fast.septa.system import (
    SamplerConfig,
    SeptaSystem,
    build_database,
    prepare_alignment,
    read_manifest,
    run_alignment,
    run_training,
)
from rcn_fast.septa.vectordb import SubgraphDB

__all__ = [
    "AlignConfig", "AlignModel", "info_nce", "recall_at_k", "subgraph_vectors", "train_alignment", "GNNConfig",
    "GPSLayer", "SubgraphEncoder", "SubgraphTable", "PredictorConfig", "QuestionFeatures", "SeptaPredictor",
    "accuracy", "train_predictor", "FinetunedText", "EnhancedQuery", "EntityLinker", "QueryEnhancer", "SamplerConfig",
    "SeptaSystem", "build_database", "prepare_alignment", "read_manifest", "run_alignment", "run_training",
    "SubgraphDB",
]
