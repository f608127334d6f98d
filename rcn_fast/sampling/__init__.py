"""Subset sampling for knowledge connection (ReConnect sec. 3.2).

* :func:`sample_subsets` -- the fused relevance-based sampler (native CPU /
  CUDA, numpy reference).
* :func:`sample` -- every strategy of ReConnect's Table 3 by name:
  ``"relevance"``, ``"random"``, ``"topk"``, ``"mmr"``, ``"cluster"``.
"""

from rcn_fast.sampling.reference import sample_subsets_reference
from rcn_fast.sampling.relevance import SAMPLE_SUBSETS, sample_subsets
from rcn_fast.sampling.strategies import STRATEGIES, sample

__all__ = ["sample", "STRATEGIES", "sample_subsets", "sample_subsets_reference", "SAMPLE_SUBSETS"]
