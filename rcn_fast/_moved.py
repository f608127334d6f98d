"""Module paths of earlier releases, kept importable after the round-5 move
of ``rcn_fast.llm`` and ``rcn_fast.eval`` into packages by domain.

``import rcn_fast.llm.hf`` (and every other path in :data:`MOVED`) gives
the module at its new place, the same object: a patch through either name
is seen by both. The old names are found by a finder on ``sys.meta_path``
that answers only for the names in :data:`MOVED`; it is installed by
``import rcn_fast``. New code imports the new paths (a test holds the
package to that).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Sequence

#: Old dotted module path -> where the module lives now.
MOVED: dict[str, str] = {
    # rcn_fast.llm: the backends
    "rcn_fast.llm.hf": "rcn_fast.llm.backends.hf",
    "rcn_fast.llm.vllm_engine": "rcn_fast.llm.backends.vllm_engine",
    "rcn_fast.llm.gguf_cache": "rcn_fast.llm.backends.gguf_cache",
    "rcn_fast.llm.logits": "rcn_fast.llm.backends.logits",
    "rcn_fast.llm.engine": "rcn_fast.llm.backends.engine",
    "rcn_fast.llm.engine.backend": "rcn_fast.llm.backends.engine.backend",
    "rcn_fast.llm.engine.gguf_file": "rcn_fast.llm.backends.engine.gguf_file",
    "rcn_fast.llm.engine.model": "rcn_fast.llm.backends.engine.model",
    "rcn_fast.llm.engine.prefix_cache": "rcn_fast.llm.backends.engine.prefix_cache",
    "rcn_fast.llm.engine.runner": "rcn_fast.llm.backends.engine.runner",
    "rcn_fast.llm.engine.tokenizer": "rcn_fast.llm.backends.engine.tokenizer",
    # rcn_fast.llm: the OpenAI-compatible client (rcn_fast.llm.openai is its package now)
    "rcn_fast.llm.openai_capabilities": "rcn_fast.llm.openai.capabilities",
    "rcn_fast.llm.openai_config": "rcn_fast.llm.openai.config",
    "rcn_fast.llm.openai_dialect": "rcn_fast.llm.openai.dialect",
    "rcn_fast.llm.openai_identity": "rcn_fast.llm.openai.identity",
    "rcn_fast.llm.openai_responses": "rcn_fast.llm.openai.responses",
    "rcn_fast.llm.openai_scoring": "rcn_fast.llm.openai.scoring",
    "rcn_fast.llm.openai_transport": "rcn_fast.llm.openai.transport",
    # rcn_fast.llm: the server
    "rcn_fast.llm.serve": "rcn_fast.llm.server.app",
    "rcn_fast.llm.serve_cli": "rcn_fast.llm.server.cli",
    "rcn_fast.llm.serve_limits": "rcn_fast.llm.server.limits",
    # rcn_fast.llm: label scoring (rcn_fast.llm.scoring is its package now)
    "rcn_fast.llm.scoring_reference": "rcn_fast.llm.scoring.reference",
    "rcn_fast.llm.scoring_triton": "rcn_fast.llm.scoring.triton_launch",
    "rcn_fast.llm.labels": "rcn_fast.llm.scoring.labels",
    "rcn_fast.llm.label_scoring": "rcn_fast.llm.scoring.served",
    # rcn_fast.eval: tasks (rcn_fast.eval.tasks is its package now)
    "rcn_fast.eval.task_spec": "rcn_fast.eval.tasks.spec",
    "rcn_fast.eval.task_sources": "rcn_fast.eval.tasks.sources",
    "rcn_fast.eval.task_loading": "rcn_fast.eval.tasks.loading",
    "rcn_fast.eval.task_limits": "rcn_fast.eval.tasks.limits",
    "rcn_fast.eval.lm_eval_tasks": "rcn_fast.eval.tasks.lm_eval",
    # rcn_fast.eval: running and reporting
    "rcn_fast.eval.plan": "rcn_fast.eval.run.plan",
    "rcn_fast.eval.executors": "rcn_fast.eval.run.executors",
    "rcn_fast.eval.checkpoint": "rcn_fast.eval.run.checkpoint",
    "rcn_fast.eval.shards": "rcn_fast.eval.run.shards",
    "rcn_fast.eval.ray_executor": "rcn_fast.eval.run.ray_executor",
    "rcn_fast.eval.runner": "rcn_fast.eval.run.runner",
    "rcn_fast.eval.loading": "rcn_fast.eval.run.loading",
    "rcn_fast.eval.reports": "rcn_fast.eval.report.results",
    "rcn_fast.eval.plot": "rcn_fast.eval.report.plot",
    "rcn_fast.eval.progress": "rcn_fast.eval.report.progress",
    "rcn_fast.eval.scoring": "rcn_fast.eval.metrics",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new place (the same object)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the target ran when imported); the import system
        set ``__spec__`` to the alias's, so the module's own is put back."""
        module.__spec__ = self._own_spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """A finder that answers only for the old names in :data:`MOVED`."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
