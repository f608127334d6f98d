"""The package's public names stay importable from ``rcn_fast`` and its
subpackages' ``__init__`` (README, docs), at the modules' real paths; no
compatibility layer keeps paths of a layout that was never released
(issue 51 item 4: ``rcn_fast/_moved.py`` and its ``sys.meta_path`` finder
are gone)."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

from tests.test_architecture import all_imports

#: module -> the names users import from it (README, docs/ and the packages' ``__all__``).
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
    "rcn_fast.llm.backends.engine": ("GGUFLLM", "EngineConfig", "NonFiniteLogitsError", "UnsupportedModel"),
    "rcn_fast.llm.backends.hf": ("HFLLM", "HFConfig"),
    "rcn_fast.llm.openai": ("OpenAILLM", "OpenAIConfig", "ServerError", "load_spec"),
    "rcn_fast.llm.scoring": ("LabelScoreError", "check_label_scores", "LOGPROB_TOLERANCE", "choice_logprobs",
                             "choice_logprobs_from_hidden", "choice_logprobs_reference",
                             "choice_logprobs_hidden_reference", "label_token_ids", "pack_label_ids",
                             "CHOICE_LOGPROBS", "CHOICE_LOGPROBS_HIDDEN", "MAX_TILE_LOGITS", "MAX_TILE_HIDDEN",
                             "combine_reference"),
    "rcn_fast.llm.server.app": ("make_server",),
    "rcn_fast.llm.server.cli": ("main",),
    "rcn_fast.eval": ("evaluate", "EvalConfig", "EvalError", "TaskSpec", "TaskError", "available_tasks", "get_task",
                      "resolve_task", "load_task_questions", "MODEL_PACKAGES_HINT"),
    "rcn_fast.eval.metrics": ("score", "scored"),
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


#: Module paths of the pre-0.1.0 layout (never released); the package answers none of them.
UNRELEASED_PATHS = ("rcn_fast.llm.hf", "rcn_fast.llm.engine", "rcn_fast.llm.serve", "rcn_fast.llm.openai_transport",
                    "rcn_fast.llm.label_scoring", "rcn_fast.eval.scoring", "rcn_fast.eval.task_spec",
                    "rcn_fast.eval.runner", "rcn_fast.eval.plan", "rcn_fast.eval.executors")


def test_no_finder_of_its_own_is_installed_by_import_rcn_fast():
    """``import rcn_fast`` leaves ``sys.meta_path`` as it found it (a fresh interpreter, no fixture)."""
    code = ("import sys; before = [type(f).__module__ for f in sys.meta_path]; import rcn_fast, rcn_fast.llm, "
            "rcn_fast.eval; after = [type(f).__module__ for f in sys.meta_path]; "
            "print(before == after, any(m.startswith('rcn_fast') for m in after))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]


@pytest.mark.parametrize("old", UNRELEASED_PATHS)
def test_paths_of_the_unreleased_layout_are_import_errors(old):
    code = f"import rcn_fast, importlib; importlib.import_module({old!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (old, r.stderr[-400:])


def test_an_unknown_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rcn_fast.llm.no_such_module")
    with pytest.raises(AttributeError, match="rcn_fast.llm.openai"):
        importlib.import_module("rcn_fast.llm.openai").no_such_name


def test_the_package_imports_only_real_paths():
    """Every ``rcn_fast`` import in the package names a module that exists in the source tree or as a
    compiled module (a walk of every import in rcn_fast/)."""
    modules, found = all_imports()
    bad = []
    for imp in found:
        if imp.target in modules:
            continue
        try:
            spec = importlib.util.find_spec(imp.target)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            bad.append(f"{imp.file}: {imp.target}")
    assert not bad, bad
