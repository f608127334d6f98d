"""The imports users have (README, docs, the packages' ``__all__`` of the
release before the round-5 move) keep working, every old module path gives
the module at its new place, and the package itself imports only the new
paths."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.test_architecture import all_imports

#: module -> the names users import from it (README, docs/ and the ``__all__``
#: of these modules as they were before the move).
PUBLIC: dict[str, tuple[str, ...]] = {
    "rcn_fast": ("topn", "sample_subsets", "FlatIndex", "build_info", "BackendUnavailableError", "MCQuestion",
                 "connect", "Connection", "__version__"),
    "rcn_fast.data": ("load_questions", "load_open_questions", "load_yes_no_questions"),
    "rcn_fast.retrieval": ("Encoder", "Retriever", "BuildConfig", "build_corpus"),
    "rcn_fast.pipelines": ("InMemoryRetriever", "PIPELINES"),
    "rcn_fast.nli": ("NLIModel",),
    "rcn_fast.model_files": ("refuse_remote_code",),
    "rcn_fast.sampling": ("sample_subsets_reference",),
    "rcn_fast.llm": ("LLM", "ContextLengthWarning", "Cost", "CostTracker", "Generation", "GenerationParams",
                     "render_chat", "validate_chats", "load_llm", "register_backend", "HFLLM", "HFConfig",
                     "OpenAILLM", "OpenAIConfig", "VLLMEngine", "CallCache", "CachedLLM", "choice_logprobs",
                     "choice_logprobs_from_hidden", "label_token_ids", "LabelScoreError", "preflight",
                     "PreflightError"),
    "rcn_fast.llm.base": ("LLM", "GenerationParams", "LocalBackend", "stop_token_ids"),
    "rcn_fast.llm.chat": ("render_closed_turn", "render_chat"),
    "rcn_fast.llm.registry": ("register_backend",),
    "rcn_fast.llm.seeded": ("SeededSampler", "draw", "row_key", "sample_seed"),
    "rcn_fast.llm.engine": ("GGUFLLM", "EngineConfig", "NonFiniteLogitsError", "UnsupportedModel"),
    "rcn_fast.llm.hf": ("HFLLM", "HFConfig"),
    "rcn_fast.llm.openai": ("OpenAILLM", "OpenAIConfig", "ServerError", "load_spec"),
    "rcn_fast.llm.scoring": ("LabelScoreError", "check_label_scores", "LOGPROB_TOLERANCE", "choice_logprobs",
                             "choice_logprobs_from_hidden", "choice_logprobs_reference",
                             "choice_logprobs_hidden_reference", "label_token_ids", "pack_label_ids",
                             "CHOICE_LOGPROBS", "CHOICE_LOGPROBS_HIDDEN", "MAX_TILE_LOGITS", "MAX_TILE_HIDDEN",
                             "combine_reference"),
    "rcn_fast.llm.serve": ("make_server",),
    "rcn_fast.llm.serve_cli": ("main",),
    "rcn_fast.eval": ("evaluate", "EvalConfig", "EvalError", "TaskSpec", "TaskError", "available_tasks", "get_task",
                      "resolve_task", "load_task_questions", "MODEL_PACKAGES_HINT"),
    "rcn_fast.eval.scoring": ("score", "scored"),
    "rcn_fast.eval.tasks": ("TaskSpec", "TaskError", "TaskCountWarning", "available_tasks", "registry", "get_task",
                            "resolve_task", "load_task_questions", "task_corpus", "split_inline_choices",
                            "spec_from_dict", "spec_key", "hub_load_args", "check_limit", "normalize_name",
                            "PACKAGE_DIR", "TASKS_DIR", "PARQUET_REVISION", "KINDS"),
    "rcn_fast.integrations": (),
    "rcn_fast.serve": ("main",),
    "rcn_fast.train_retriever": (),
    "rcn_fast.kb": ("ExampleKB", "entry_text"),
    "rcn_fast.kernels": (),
    "rcn_fast.septa": (),
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_import_works(module):
    mod = importlib.import_module(module)
    missing = [n for n in PUBLIC[module] if not hasattr(mod, n)]
    assert not missing, f"{module} no longer offers {missing}"


def test_every_moved_path_is_the_module_at_its_new_place():
    from rcn_fast._moved import MOVED

    for old, new in MOVED.items():
        a, b = importlib.import_module(old), importlib.import_module(new)
        assert a is b, old
        assert b.__name__ == new and b.__spec__.name == new, f"{new}'s spec was replaced by the alias {old}"


def test_a_patch_through_the_old_path_is_seen_at_the_new_one(monkeypatch):
    import rcn_fast.llm.backends.engine.model as new

    monkeypatch.setattr("rcn_fast.llm.engine.model.UnsupportedModel", KeyError)
    assert new.UnsupportedModel is KeyError


def test_old_paths_import_in_a_fresh_interpreter():
    """The finder is installed by ``import rcn_fast`` itself: a fresh process
    that imports an old path first (no test fixture involved) gets it."""
    code = ("import rcn_fast.llm.openai_transport as t, rcn_fast.eval.task_spec as s; "
            "from rcn_fast.eval.scoring import score; "
            "print(t.__name__, s.__name__, score.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["rcn_fast.llm.openai.transport", "rcn_fast.eval.tasks.spec", "rcn_fast.eval.metrics"]


def test_an_unknown_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rcn_fast.llm.no_such_module")
    with pytest.raises(AttributeError, match="rcn_fast.llm.openai"):
        importlib.import_module("rcn_fast.llm.openai").no_such_name


def test_the_package_imports_only_new_paths():
    """Old paths are for users; rcn_fast's own modules import the modules
    where they live (a walk of every import in rcn_fast/)."""
    from rcn_fast._moved import MOVED

    _, found = all_imports()
    old = sorted({f"{imp.file}: {imp.target}" for imp in found if imp.target in MOVED})
    assert not old, old
