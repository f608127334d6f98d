"""Progress bars of an evaluation: one bar of checkpointed questions per
task x pipeline x seed and one bar per pipeline stage under it; and, with
progress off (``--no-progress``), :func:`quiet_loading` silencing the bars
that loading a model draws (transformers' weight loading and downloads,
the GGUF conversion)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import time
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from rcn_fast.eval.run.plan import Unit


class StageBars:
    """Progress of one task x pipeline x seed on stderr: a bar of the
    checkpointed questions and, under it, one bar per pipeline stage
    (questions through that stage so far, questions/s and ETA; the postfix
    gives the stage's own seconds per question).

    The bars of the pipeline's declared ``stages`` that call the LLM under
    its config (stage names: a stage of its own kind, e.g. SEPTA's) are
    drawn up front, in order; the bars join the pipeline's ``observers``
    (a :class:`~rcn_fast.pipelines.base.StageObserver`: every LLM call of
    a stage names its stage and its batch).
    """

    def __init__(self, unit: Unit, pipe: Any) -> None:
        from tqdm.auto import tqdm

        from rcn_fast.pipelines.spec import llm_stage_names

        self._tqdm = tqdm
        self.total = len(unit.pending)
        self.main = tqdm(total=len(unit.questions), initial=len(unit.questions) - len(unit.pending), unit="q",
                         desc=f"{unit.task.name} | {unit.display} | seed {unit.seed}", file=sys.stderr,
                         dynamic_ncols=True, position=0)
        self.bars: dict[str, Any] = {}
        self.seen: dict[str, set[str]] = {}
        self.busy: dict[str, float] = {}
        self._mark = time.perf_counter()
        for name in llm_stage_names(pipe.stages, pipe.config):  # declared stages get their bars in order up front
            self._bar(name)
        pipe.observers.append(self)

    def _bar(self, stage: str) -> Any:
        if stage not in self.bars:
            self.bars[stage] = self._tqdm(total=self.total, unit="q", desc=f"  {stage}", file=sys.stderr,
                                          dynamic_ncols=True, position=len(self.bars) + 1, leave=True)
            self.seen[stage] = set()
            self.busy[stage] = 0.0
        return self.bars[stage]

    def batch_start(self) -> None:
        self._mark = time.perf_counter()

    def stage_start(self, stage: str) -> None:
        """A stage begins (its bar's clock starts at its first batch)."""
        self._bar(str(stage))

    def stage_done(self, stage: str, ids: Any) -> None:
        """``ids`` went through ``stage`` (a question counts once per stage)."""
        now = time.perf_counter()
        stage = str(stage)
        bar = self._bar(stage)
        seen = self.seen[stage]
        new = [i for i in dict.fromkeys(ids) if i not in seen]
        self.busy[stage] += now - self._mark
        self._mark = now
        if new:
            seen.update(new)
            bar.set_postfix_str(f"{self.busy[stage] / len(seen):.3g} s/q in stage", refresh=False)
            bar.update(len(new))

    def update(self, n: int) -> None:
        self.main.update(n)

    def close(self) -> None:
        for b in reversed(list(self.bars.values())):
            b.close()
        self.main.close()


@contextlib.contextmanager
def quiet_loading(quiet: bool = True, *, gguf: bool = True) -> Iterator[None]:
    """Silence the progress bars of loading a model, for this block only.

    With ``quiet``: transformers' bars (weight loading, hub downloads:
    ``transformers.utils.logging.disable_progress_bar``), huggingface_hub's
    download bars and the tqdm bar of transformers' GGUF conversion
    ("Converting and de-quantizing GGUF tensors") are off while the block
    runs, and each comes back as it was afterwards (transformers not yet
    imported is not imported for this: it starts its bar from
    huggingface_hub's switch if the load imports it). Libraries that are not
    installed are left alone (nothing is imported that the load would not
    import). ``quiet=False`` changes nothing. ``gguf=False``: the load
    reads no GGUF file, so the GGUF module (which imports torch's model
    code and a dozen tokenizers) is not imported to silence its bar.
    """
    if not quiet:
        yield
        return
    with contextlib.ExitStack() as stack:
        if importlib.util.find_spec("transformers") is not None:
            if "transformers" in sys.modules or gguf:
                from transformers.utils import logging as tf_logging

                if tf_logging.is_progress_bar_enabled():
                    tf_logging.disable_progress_bar()
                    stack.callback(tf_logging.enable_progress_bar)
                if gguf:
                    stack.enter_context(_gguf_bar_off())
            else:  # not imported yet (seconds): it starts its bar from huggingface_hub's switch, off below
                stack.callback(_transformers_bar_as_hub)
        if importlib.util.find_spec("huggingface_hub") is not None:
            from huggingface_hub import utils as hub_utils

            if not hub_utils.are_progress_bars_disabled():
                hub_utils.disable_progress_bars()
                stack.callback(hub_utils.enable_progress_bars)
        yield


def _transformers_bar_as_hub() -> None:
    """After a quiet block that imported transformers: its bar follows
    huggingface_hub's switch again (as an import outside the block would
    have set it)."""
    if "transformers.utils.logging" in sys.modules:
        from huggingface_hub import utils as hub_utils
        from transformers.utils import logging as tf_logging

        if not hub_utils.are_progress_bars_disabled():
            tf_logging.enable_progress_bar()


@contextlib.contextmanager
def _gguf_bar_off() -> Iterator[None]:
    """transformers' GGUF reader calls its module's ``tqdm`` directly (not
    the logging-controlled one): give it a disabled one for the block."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except Exception:  # noqa: BLE001 - an old or partial transformers: nothing to silence
        yield
        return
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


__all__ = ["StageBars", "quiet_loading"]
