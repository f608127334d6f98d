"""One answer turn for every multiple-choice pipeline (issue 54 item 5).

The ReConnect authors' code (src/generate.py) ends its four pipelines'
answers alike -- wo-RAG (``BasicRAG``), SR-RAG (``SingleRAG``), ZEBRA and
ReConnect (``OurRAG``): the assistant reply ``"Answer: "`` rendered by one
``apply_chat_template`` call, then its last token cut. rcn_fast's
``answer_render`` (one setting of every pipeline config) decides the end of
every label-scoring prompt. For the same question and model, vanilla,
single retrieval, ZEBRA and ReConnect must score after the same token ids:
the answer turn (from the template's last turn-start token to the end) is
identical, and under the default it is the authors' rendering on a Llama-3
template (the full ids equal theirs); ``closed_turn`` is their rule on any
template (ChatML included). The prompts are rendered by the real HF backend
over tiny trained tokenizers (no model download).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from rcn_fast import MCQuestion  # noqa: E402
from rcn_fast.kb import Example, ExampleKB, ExampleRetriever  # noqa: E402
from rcn_fast.pipelines import InMemoryRetriever, build  # noqa: E402
from rcn_fast.pipelines.base import answer_turn  # noqa: E402
from tests.pipelines.doubles import FACTS, HashEncoder, ScriptedLLM  # noqa: E402
from tests.test_pipelines_zebra import KB_ROWS  # noqa: E402
from tests.test_reconnect_parity import _hf_llm, _llama3_tokenizer  # noqa: E402

Q = MCQuestion("q", "What do plants need to grow?", ["sunlight", "salt", "ice"])
PIPELINES = ("vanilla", "single_retrieval", "zebra", "reconnect")

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _chatml_tokenizer():
    """A ChatML template (SmolLM2's kind: no trim, each turn ends ``<|im_end|>\\n``) on a tiny BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["Answer: A", "Answer:", "assistant\nAnswer:", "Question: What do plants need?\nOptions:\nA. sunlight"]
    tok.train_from_iterator(corpus * 20 + FACTS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                   chat_template=CHATML)


TEMPLATES = {"llama3": (_llama3_tokenizer, "<|start_header_id|>", "<|eot_id|>"),
             "chatml": (_chatml_tokenizer, "<|im_start|>", "<|im_end|>")}


def _score_chats(**settings) -> dict[str, list[dict]]:
    """Per pipeline, the chat it scores the labels of ``Q`` with (captured from a run)."""
    out = {}
    for name in PIPELINES:
        llm = ScriptedLLM()
        if name == "zebra":
            kb = ExampleKB(Example(i, q, c, explanations=e, answer=0) for i, q, c, e in KB_ROWS)
            p = build(name, llm=llm, retriever=ExampleRetriever(kb, HashEncoder()), top_k=2, **settings)
        elif name == "vanilla":
            p = build(name, llm=llm, **settings)
        else:
            p = build(name, llm=llm, retriever=InMemoryRetriever(HashEncoder(), FACTS), **settings)
        p.run(Q)
        scored = [c for kind, c in llm.chats if kind == "score"]
        assert len(scored) == 1, name
        out[name] = scored[0]
    return out


def _reference_ids(tok, chat: list[dict], end_of_turn: int) -> list[int]:
    """The authors' rule by hand: the turns with the reply ``Answer: `` as a complete message, rendered by
    ``apply_chat_template`` and tokenised, cut where the reply's end-of-turn token begins."""
    closed = [*[{"role": t["role"], "content": t["content"]} for t in chat[:-1]],
              {"role": "assistant", "content": "Answer: "}]
    ids = list(tok(tok.apply_chat_template(closed, tokenize=False), add_special_tokens=False)["input_ids"])
    return ids[:len(ids) - 1 - ids[::-1].index(end_of_turn)]


def _answer_turn_ids(ids: list[int], turn_start: int) -> list[int]:
    """The ids from the last turn-start token (the answer turn's header) to the end."""
    return ids[len(ids) - 1 - ids[::-1].index(turn_start):]


@pytest.mark.parametrize("template", list(TEMPLATES))
@pytest.mark.parametrize("render", ["prefill", "closed_turn", "trailing_space"])
def test_every_pipeline_scores_after_the_same_ids(template, render):
    make, start_token, end_token = TEMPLATES[template]
    tok = make()
    llm = _hf_llm(tok)
    start, end = tok.convert_tokens_to_ids(start_token), tok.convert_tokens_to_ids(end_token)
    chats = _score_chats(answer_render=render)
    ids = {name: llm.encode_chats([chat])[0] for name, chat in chats.items()}
    turns = {name: _answer_turn_ids(x, start) for name, x in ids.items()}
    assert len(set(map(tuple, turns.values()))) == 1, {n: tok.decode(t) for n, t in turns.items()}
    text = tok.decode(turns["vanilla"])
    spaced = render == "trailing_space" or (render == "closed_turn" and template == "chatml")  # Llama 3 trims
    assert text.endswith("Answer: " if spaced else "Answer:"), text
    assert end not in turns["vanilla"]  # the turn is never closed before the label
    # the knowledge differs: the prompts before the answer turn are the pipelines' own
    assert len({tuple(x) for x in ids.values()}) == len(PIPELINES)
    for name, chat in chats.items():
        if render == "closed_turn" or (render == "prefill" and template == "llama3"):
            assert ids[name] == _reference_ids(tok, chat, end), (name, template, render)


def test_default_is_the_references_rendering_for_every_pipeline():
    """Every pipeline's config defaults to the same answer turn, and the default prompts' pre-fills agree."""
    from rcn_fast.pipelines import PIPELINES as REGISTRY

    chats = _score_chats()
    assert {name: chat[-1] for name, chat in chats.items()} == {
        name: {"role": "assistant", "content": "Answer:"} for name in PIPELINES}
    for name, cls in REGISTRY.items():
        cfg = getattr(cls, "config_class", None)
        if cfg is not None and hasattr(cfg, "__dataclass_fields__") and "answer_render" in cfg.__dataclass_fields__:
            assert cfg.__dataclass_fields__["answer_render"].default == "prefill", name


def test_answer_turn_rule_and_checks():
    chat = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "Answer: \n"}]
    assert answer_turn(chat)[-1] == {"role": "assistant", "content": "Answer:"}
    assert answer_turn(chat, "trailing_space")[-1] == {"role": "assistant", "content": "Answer: "}
    assert answer_turn(chat, "closed_turn")[-1] == {"role": "assistant", "content": "Answer: ", "cut": "end_of_turn"}
    assert chat[-1]["content"] == "Answer: \n"  # the chat given is not changed
    with pytest.raises(ValueError, match="answer_render"):
        answer_turn(chat[:1])
    with pytest.raises(ValueError, match="answer_render"):
        answer_turn(chat, "space")
    with pytest.raises(ValueError, match="answer_render"):
        build("vanilla", llm=ScriptedLLM(), answer_render="cut")


def test_one_pipeline_arg_sets_every_pipelines_answer_turn():
    """``--pipeline-args answer_render=closed_turn`` reaches every pipeline that scores labels."""
    from rcn_fast.eval.pipeline_needs import split_pipeline_args

    args = split_pipeline_args({"answer_render": "closed_turn"}, list(PIPELINES))
    assert all(args[name].get("answer_render") == "closed_turn" for name in PIPELINES)
