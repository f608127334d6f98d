"""Running an evaluation: plan, execute, keep every finished answer.

* :mod:`~rcn_fast.eval.run.runner` -- :func:`~rcn_fast.eval.evaluate`;
* :mod:`~rcn_fast.eval.run.plan` -- tasks x pipelines x seeds -> units;
* :mod:`~rcn_fast.eval.run.loading` -- the models, encoder and retrievers a
  run needs, each loaded at most once;
* :mod:`~rcn_fast.eval.run.executors` -- running units in this process;
* :mod:`~rcn_fast.eval.run.ray_executor` -- ``--executor ray``;
* :mod:`~rcn_fast.eval.run.shards` -- which questions a shard answers;
* :mod:`~rcn_fast.eval.run.checkpoint` -- durable per-question records;
* :mod:`~rcn_fast.eval.run.permute` -- ``--permute-choices``: questions
  under cyclic permutations of their choices.
"""
