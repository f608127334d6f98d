"""Knowledge graphs for SEPTA: loaders, CSR graph, BFS subgraph sampling and
textualisation.

* :class:`KnowledgeGraph` -- node/relation vocabularies, triples, CSR adjacency;
  ``save`` / ``load``.
* Loaders: :func:`load_conceptnet` (assertions CSV), :func:`load_tsv`
  (head, relation, tail), :func:`load_wordnet` (Debian ``wordnet-base``
  files), :func:`load_graph` (spec string).
* :func:`bfs_subgraphs` -- one seeded BFS subgraph per centre node (numba or
  the Python reference, identical results) -> :class:`Subgraphs`.
* :data:`RELATION_TEMPLATES`, :func:`subgraph_text`, :func:`triple_text` --
  edges as sentences.

Examples
--------
>>> from rcn_fast.kg import KnowledgeGraph, bfs_subgraphs, subgraph_text
>>> g = KnowledgeGraph.from_triples([("dog", "is_a", "animal"), ("dog", "capable_of", "bark")])
>>> sg = bfs_subgraphs(g, [0], p=1.0, max_depth=1, max_nodes=3, backend="reference")
>>> subgraph_text(g, sg.edge_ids(0))
'dog is a kind of animal. dog can bark.'
"""

from rcn_fast.kg.graph import KnowledgeGraph, random_graph
from rcn_fast.kg.loaders import (
    WORDNET_DIR,
    WORDNET_HINT,
    concept_name,
    iter_conceptnet,
    load_conceptnet,
    load_graph,
    load_tsv,
    load_wordnet,
    wordnet_available,
)
from rcn_fast.kg.sampler import Subgraphs, bfs_one_reference, bfs_subgraphs, numba_available
from rcn_fast.kg.templates import (
    RELATION_TEMPLATES,
    edge_texts,
    join_sentences,
    normalize_relation,
    subgraph_text,
    triple_text,
)

__all__ = [
    "KnowledgeGraph", "random_graph", "load_conceptnet", "iter_conceptnet", "load_tsv", "load_wordnet",
    "load_graph", "wordnet_available", "concept_name", "WORDNET_DIR", "WORDNET_HINT", "Subgraphs",
    "bfs_subgraphs", "bfs_one_reference", "numba_available", "RELATION_TEMPLATES", "edge_texts",
    "join_sentences", "normalize_relation", "subgraph_text", "triple_text",
]
