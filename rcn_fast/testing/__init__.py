"""What the test suite and the benchmarks share, shipped with the package so
``bench/`` runs without the ``tests/`` folder (nothing here is imported by
the rest of rcn_fast):

* :mod:`rcn_fast.testing.peers` -- the plain baselines the benchmarks time
  and the tests check (full-vocabulary label scoring, the per-question torch
  ``Categorical`` subset sampler of the published ReConnect code);
* :mod:`rcn_fast.testing.tiny_llm` -- a byte-level BPE tokenizer trained in
  code and tiny random-weight Llama / Qwen2 models;
* :mod:`rcn_fast.testing.tiny_retrieval` -- a tiny random-weight BERT, the
  installed all-MiniLM-L6-v2, corpora of real sentences;
* :mod:`rcn_fast.testing.rr_doubles` -- the scripted sampling LLM and NLI
  doubles of RR and a tiny NLI classifier;
* :mod:`rcn_fast.testing.data` -- where the benchmark files of ``../shared``
  are.

Building the tiny models needs torch, transformers and tokenizers (the
``[dev]`` or ``[bench]`` extra).
"""
