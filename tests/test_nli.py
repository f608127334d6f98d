"""rcn_fast.nli: a tiny random-weight BertForSequenceClassification saved to
disk and loaded through NLIModel.from_pretrained; label mapping from the
config; batching against a per-pair reference forward pass."""

from __future__ import annotations

import os
from types import SimpleNamespace

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.nli import NLIModel, label_indices, load_nli  # noqa: E402
from tests.pipelines.rr_doubles import make_tiny_nli  # noqa: E402
from tests.torch_state import pinned_torch_threads  # noqa: E402

PREMISES = ["Plants need sunlight to make food.", "A magnet attracts iron.", "Ice melts when heated.",
            "The heart pumps blood through the body.", "Fish breathe with gills.", "Salt dissolves in water."]
HYPOTHESES = ["Plants use light.", "Iron is pulled by magnets.", "Heat turns ice into water.",
              "Blood moves because of the heart.", "Fish have lungs.", "Salt cannot dissolve."]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with pinned_torch_threads(1):
        yield


@pytest.fixture(scope="module")
def nli_dir(tmp_path_factory):
    return make_tiny_nli(tmp_path_factory.mktemp("nli") / "tiny-nli")


def reference_probs(model_dir, premises, hypotheses) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    out = []
    with torch.no_grad():
        for p, h in zip(premises, hypotheses):
            enc = tok(p, h, return_tensors="pt")
            out.append(torch.softmax(model(**enc).logits[0], -1).numpy())
    return np.stack(out)


def test_loads_and_matches_the_reference(nli_dir):
    nli = NLIModel.from_pretrained(nli_dir, batch_size=4, device="cpu")
    assert (nli.entailment_index, nli.contradiction_index) == (0, 2)
    assert nli.labels == ["entailment", "neutral", "contradiction"]
    s = nli.predict(PREMISES, HYPOTHESES)
    assert len(s) == 6 and s.probs.shape == (6, 3)
    assert s.entailment.dtype == np.float32 and s.contradiction.shape == (6,)
    np.testing.assert_allclose(s.probs.sum(1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(s.entailment, s.probs[:, 0])
    np.testing.assert_array_equal(s.contradiction, s.probs[:, 2])
    ref = reference_probs(nli_dir, PREMISES, HYPOTHESES)
    np.testing.assert_allclose(s.probs, ref, atol=2e-5)
    assert s.probs.std(0).max() > 1e-3  # the outputs depend on the input
    # batch size and order do not change a pair's scores
    one = NLIModel.from_pretrained(nli_dir, batch_size=1, device="cpu").predict(PREMISES[::-1], HYPOTHESES[::-1])
    np.testing.assert_allclose(one.probs[::-1], s.probs, atol=2e-5)
    assert nli.calls == 1 and len(nli.predict([], [])) == 0 and nli.calls == 1
    assert load_nli(str(nli_dir)).labels == nli.labels and load_nli(nli) is nli


def _probs_of(model_dir, enc) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        return torch.softmax(model(**enc).logits, -1).numpy()


def test_long_pairs_lose_premise_tokens_only(nli_dir):
    """RR's hypothesis (the sentence under test) is kept whole: a pair over
    max_length is cut in the premise (only_first), not longest-first; a
    hypothesis too long to keep whole falls back to longest-first."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(nli_dir))
    premise = " ".join(PREMISES)  # ~40 tokens
    hyp = "Plants use light and fish have gills and ice melts."  # ~12 tokens
    max_len = 20
    nli = NLIModel.from_pretrained(nli_dir, max_length=max_len, batch_size=4, device="cpu")
    got = nli.predict([premise, PREMISES[0]], [hyp, HYPOTHESES[0]]).probs
    only = tok([premise], [hyp], truncation="only_first", max_length=max_len, return_tensors="pt")
    longest = tok([premise], [hyp], truncation="longest_first", max_length=max_len, return_tensors="pt")
    n_hyp = len(tok(hyp, add_special_tokens=False)["input_ids"])
    ids = only["input_ids"][0].tolist()
    assert len(ids) == max_len and ids[-n_hyp - 1 : -1] == tok(hyp, add_special_tokens=False)["input_ids"]
    assert only["input_ids"].tolist() != longest["input_ids"].tolist()  # the two strategies do differ here
    np.testing.assert_allclose(got[0], _probs_of(nli_dir, only)[0], atol=2e-5)
    assert np.abs(got[0] - _probs_of(nli_dir, longest)[0]).max() > 1e-4
    np.testing.assert_allclose(got[1], reference_probs(nli_dir, PREMISES[:1], HYPOTHESES[:1])[0], atol=2e-5)
    # a hypothesis longer than max_length alone: scored longest-first, no error; its batch-mates unaffected
    long_h = " ".join(HYPOTHESES * 3)
    got2 = nli.predict([PREMISES[0], premise], [long_h, hyp]).probs
    ref = tok([PREMISES[0]], [long_h], truncation="longest_first", max_length=max_len, return_tensors="pt")
    np.testing.assert_allclose(got2[0], _probs_of(nli_dir, ref)[0], atol=2e-5)
    np.testing.assert_allclose(got2[1], got[0], atol=2e-5)


def test_label_mapping_from_config():
    def cfg(id2label, label2id=None):
        return SimpleNamespace(num_labels=len(id2label), id2label=id2label, label2id=label2id or {})

    assert label_indices(cfg({0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}))[:2] == (2, 0)  # roberta-large-mnli
    assert label_indices(cfg({0: "contradiction", 1: "entailment", 2: "neutral"}))[:2] == (1, 0)  # cross-encoder
    assert label_indices(cfg({0: "", 1: "", 2: ""}, {"entailment": 2, "contradiction": 0}))[:2] == (2, 0)
    generic = cfg({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"})
    with pytest.raises(ValueError, match="label_names"):
        label_indices(generic)
    assert label_indices(generic, ["entailment", "neutral", "contradiction"])[:2] == (0, 2)
    with pytest.raises(ValueError, match="label_names"):
        label_indices(generic, ["entailment", "contradiction"])
    with pytest.raises(ValueError):  # binary RTE-style labels have no contradiction
        label_indices(cfg({0: "entailment", 1: "not_entailment"}))


def test_generic_labels_need_names(tmp_path):
    d = make_tiny_nli(tmp_path / "generic", id2label={0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"})
    with pytest.raises(ValueError, match="config: cannot tell"):
        NLIModel.from_pretrained(d, device="cpu")
    nli = NLIModel.from_pretrained(d, device="cpu", label_names=["contradiction", "neutral", "entailment"])
    s = nli.predict(PREMISES[:2], HYPOTHESES[:2])
    np.testing.assert_array_equal(s.entailment, s.probs[:, 2])


def test_bad_inputs(nli_dir):
    nli = NLIModel.from_pretrained(nli_dir, device="cpu")
    with pytest.raises(ValueError, match="hypotheses:"):
        nli.predict(["a", "b"], ["c"])
    with pytest.raises(TypeError, match="premises:"):
        nli.predict("a", "b")
    with pytest.raises(TypeError, match="hypotheses:"):
        nli.predict(["a"], [3])
    with pytest.raises(ValueError, match="batch_size"):
        NLIModel.from_pretrained(nli_dir, batch_size=0)
    with pytest.raises(TypeError, match="nli:"):
        load_nli(None)
    with pytest.raises(ValueError, match="model:"):
        NLIModel.from_pretrained(nli_dir.parent / "missing-dir")
