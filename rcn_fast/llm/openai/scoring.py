"""Label scoring over an OpenAI-compatible server (see
:mod:`rcn_fast.llm.openai.client` for what is exact and when it falls back).

Exact scores go through :func:`rcn_fast.llm.scoring.served.exact_label_scores`,
the algorithm the vLLM engine uses too: spellings found in the next-token
top log-probs (under a string only they decode to) take that value, the
rest the prompt log-prob of ``prefix + [t]``. The fallback reads the
next-token top log-probs, asking again with 8 times as many for rows where
a spelling is missing, up to the server's cap or ``max_top_logprobs``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Sequence

from rcn_fast.llm.scoring import served as label_scoring
from rcn_fast.llm.base import logsumexp
from rcn_fast.llm.openai.capabilities import PostPrompts, Prober
from rcn_fast.llm.openai.dialect import Chat, Dialect
from rcn_fast.llm.openai.responses import NoPromptLogprobs, ServerError, choices, top_chat, top_completion
from rcn_fast.llm.openai.responses import usage_tokens
from rcn_fast.llm.openai.transport import Transport

#: Next-token top log-probs of one prompt: (token string -> log-prob, entries the server sent).
Top = tuple[dict[str, float], int]


class LabelScorer:
    """Label scores (before the log-softmax over the labels) from one server.

    Parameters
    ----------
    transport, dialect, prober
        The client's (its config is ``transport.config``).
    post_prompts : callable
        ``post_prompts(prompts, fields)``: token-id prompts (or their text)
        to ``/completions``, prompt token count checked.
    ask_chat : callable
        ``ask_chat(chat, fields)``: one ``/chat/completions`` request.
    warn : callable
        ``warn(key, message)``: a warning logged once per key.
    """

    def __init__(self, transport: Transport, dialect: Dialect, prober: Prober, post_prompts: PostPrompts,
                 ask_chat: Callable[[Chat, dict[str, Any]], dict[str, Any]], warn: Callable[[str, str], None]) -> None:
        self.transport, self.dialect, self.prober = transport, dialect, prober
        self.post_prompts, self.ask_chat, self.warn = post_prompts, ask_chat, warn
        self._unique: set[str] | None = None

    @property
    def where(self) -> str:
        return self.transport.base_url

    # ---------------------------------------------------------------- token-id prompts
    def score_tokens(self, tok: Any, prefixes: list[list[int]], spell: list[list[list[int]]],
                     rows: list[list[str]]) -> list[list[float]]:
        """Label scores of token-id prefixes: exact where the server gives
        prompt log-probs, else from the top log-probs (per ``label_scoring``)."""
        mode = self.transport.config.label_scoring
        if mode != "top_logprobs":
            if self.prober.exact(prefixes[0], spell[0][0][0]):
                return self._score_exact(tok, prefixes, spell)
            why = self.prober.record.exact_why
            if mode == "prompt_logprobs":
                raise ServerError(f"{self.where}/completions: label_scoring='prompt_logprobs' but the server "
                                  f"returns no prompt log-probs for token-id prompts: {why}")
            self.warn("top", f"{self.where}: no prompt log-probs ({why}); label scores come from "
                             f"the next-token top log-probs (exact only where every spelling is among them)")
        spell_strs = [[list(dict.fromkeys(tok.decode([t]) for t in ts)) for ts in row] for row in spell]
        self.prober.token_prompts(prefixes[0])

        def fetch(todo: list[int], k: int) -> list[Top]:
            return self._fetch_top(prefixes, todo, k)

        return self._escalate(fetch, spell_strs, rows, len(tok))

    def _unique_strings(self, tok: Any) -> set[str]:
        """Token strings that exactly one vocabulary entry decodes to (a
        top-log-probs entry keyed by such a string names its token)."""
        if self._unique is None:
            counts = Counter(tok.batch_decode([[i] for i in range(len(tok))]))
            self._unique = {t for t, n in counts.items() if n == 1}
        return self._unique

    def _fetch_top(self, prefixes: list[list[int]], rows: list[int], k: int) -> list[Top]:
        """Next-token top-``k`` log-probs after each of ``prefixes[rows]``."""
        per = 1 if self.prober.record.text_prompts else self.transport.config.prompts_per_request
        chunks = [rows[i : i + per] for i in range(0, len(rows), per)]

        def one(chunk: list[int]) -> list[Top]:
            out = self.post_prompts([prefixes[i] for i in chunk], self.dialect.top_fields(k))
            res = []
            for c in choices(out, len(chunk)):
                top = top_completion(c)
                if top is None:
                    raise RuntimeError(f"{self.where}/completions: the server returned no next-token "
                                       f"logprobs; label scoring needs logprobs")
                res.append(top)
            return res

        return [t for part in self.transport.map(one, chunks) for t in part]

    def _score_exact(self, tok: Any, prefixes: list[list[int]], spell: list[list[list[int]]]) -> list[list[float]]:
        """Exact label scores: the top log-probs first (``top_logprobs_first``;
        one prompt per row, so the server's prefix cache serves it), then
        prompt log-probs (vLLM recomputes the whole prefill of a request
        with prompt log-probs)."""
        cfg = self.transport.config
        cap = self.prober.record.top_cap
        k = min(cfg.top_logprobs, cap if cap is not None else cfg.top_logprobs)
        tops: list[dict[int, float]] | None = None
        if cfg.top_logprobs_first and k > 0:
            try:
                fetched: list[Top] | None = self._fetch_top(prefixes, list(range(len(prefixes))), k)
            except ServerError as exc:
                if exc.status not in (400, 422):
                    raise
                self.prober.cap_top(0)  # the server refuses k top log-probs
                fetched = None
            if fetched is not None:
                uniq = self._unique_strings(tok)
                tops = []
                for b, row in enumerate(spell):
                    found = {}
                    for t in (t for ts in row for t in ts):
                        key = tok.decode([t])
                        if key in uniq and key in fetched[b][0]:
                            found[t] = fetched[b][0][key]
                    tops.append(found)
        n = cfg.prompts_per_request
        fields = self.dialect.exact_fields()

        def one(chunk: list[tuple[int, int]]) -> list[float]:
            prompts = [prefixes[b] + [t] for b, t in chunk]
            out = self.post_prompts(prompts, fields)
            try:
                return self.dialect.prompt_logprobs(out, prompts)
            except NoPromptLogprobs as exc:
                raise ServerError(f"{self.where}/completions: {exc}") from None

        def prompt_logprobs(jobs: list[tuple[int, int]]) -> list[float]:
            chunks = [jobs[i : i + n] for i in range(0, len(jobs), n)]
            return [v for part in self.transport.map(one, chunks) for v in part]

        return label_scoring.exact_label_scores(spell, tops, prompt_logprobs)

    # ---------------------------------------------------------------- chat mode
    def score_top_chat(self, valid: list[Chat], rows: list[list[str]]) -> tuple[list[list[float]], list[int]]:
        """Label scores of chats from ``/chat/completions``' top log-probs,
        and each chat's prompt token count (as the server reports it)."""
        spellings = self.transport.config.label_spellings
        spell_strs = [[list(dict.fromkeys(sp.format(lab) for sp in spellings)) for lab in row] for row in rows]
        lens = [0] * len(valid)

        def fetch(todo: list[int], k: int) -> list[Top]:
            def one(i: int) -> Top:
                out = self.ask_chat(valid[i], self.dialect.chat_top_fields(k))
                lens[i] = usage_tokens(out, "prompt_tokens") or 0
                top = top_chat(out)
                if top is None:
                    raise RuntimeError(f"{self.where}/chat/completions: the server returned no next-token "
                                       f"logprobs; label scoring needs logprobs/top_logprobs")
                return top

            return self.transport.map(one, todo)

        return self._escalate(fetch, spell_strs, rows, None), lens

    # ---------------------------------------------------------------- the top-log-probs fallback
    def _escalate(self, fetch: Callable[[list[int], int], list[Top]], spell_strs: list[list[list[str]]],
                  rows: list[list[str]], vocab: int | None) -> list[list[float]]:
        """The top-log-probs fallback over all rows: ask with ``k`` entries,
        again with 8k for rows missing a spelling, up to the cap; label
        scores before the log-softmax over the labels."""
        cfg = self.transport.config
        cap = cfg.max_top_logprobs or vocab or (1 << 17)
        if self.prober.record.top_cap is not None:
            cap = min(cap, self.prober.record.top_cap)
        k = min(cfg.top_logprobs, cap)
        tops: list[dict[str, float]] = [{} for _ in rows]
        asked = [0] * len(rows)
        sizes = [0] * len(rows)
        todo = list(range(len(rows)))
        while todo:
            try:
                got = fetch(todo, k)
            except ServerError as exc:
                if exc.status not in (400, 422) or k == min(cfg.top_logprobs, cap):
                    raise
                self.prober.cap_top(k // 8)  # the server refuses k: its cap is below
                break
            grew = set()
            for i, (t, n) in zip(todo, got):
                if n > sizes[i]:  # no more entries for a larger k: the server sent all it has
                    grew.add(i)
                tops[i], asked[i], sizes[i] = t, k, n
            todo = [i for i in todo if i in grew and any(s not in tops[i] for lab in spell_strs[i] for s in lab)]
            if k >= cap:
                break
            k = min(cap, k * 8)
        return [self._row_scores(i, row, tops[i], spell_strs[i], asked[i]) for i, row in enumerate(rows)]

    def _row_scores(self, i: int, row: Sequence[str], top: dict[str, float], spell_strs: list[list[str]],
                    asked: int) -> list[float]:
        scores = []
        for c, lab in enumerate(row):
            found = [top[s] for s in spell_strs[c] if s in top]
            if not found:
                raise ValueError(
                    f"labels[{i}]: label {lab!r} is not among the server's top {asked} next tokens after "
                    f"chats[{i}], so it cannot be scored; use a server with prompt log-probs for token-id prompts "
                    f"(vLLM, SGLang, rcn_fast.llm.server.app) with tokenizer=, or raise the server's cap on log-probs "
                    f"(vLLM: --max-logprobs) and max_top_logprobs"
                )
            if len(found) < len(spell_strs[c]):
                self.warn("partial", f"{self.where}: some label spellings are outside the server's top "
                                     f"log-probs (e.g. {lab!r} of row {i}); those labels are scored from "
                                     f"the spellings found (a lower bound)")
            scores.append(logsumexp(found))
        return scores


__all__ = ["LabelScorer", "Top"]
