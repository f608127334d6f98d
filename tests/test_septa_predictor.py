"""SEPTA predictor (eqs. 10-13) against hand computation, the subgraph
vector database, query enhancement, and end-to-end predictor training on
real CommonsenseQA training questions with a tiny encoder."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.kg import KnowledgeGraph  # noqa: E402
from rcn_fast.septa import (  # noqa: E402
    EntityLinker,
    PredictorConfig,
    QueryEnhancer,
    SeptaPredictor,
    SubgraphDB,
    subgraph_vectors,
)
from tests.septa.helpers import BagOfWordsEncoder, one_torch_thread  # noqa: E402,F401


def test_attention_matches_hand_computation():
    torch.manual_seed(0)
    d, dt, H, k = 4, 3, 2, 5
    m = SeptaPredictor(d, dt, heads=H, lam=0.3, dropout=0.0).eval()
    t = torch.randn(2, 3, d, dtype=torch.float64)
    G = torch.randn(2, 3, k, d, dtype=torch.float64)
    v = torch.randn(2, 3, dt, dtype=torch.float64)
    m = m.double()
    r, w = m.attend(t, G)
    assert r.shape == (2, 3, d) and w.shape == (2, 3, H, k)
    Wq = m.wq.weight.detach().numpy()  # [H*d, d]: rows h*d:(h+1)*d are head h's W_Q^T
    Wk, Wv, Wo = (x.weight.detach().numpy() for x in (m.wk, m.wv, m.wo))
    tn, Gn, vn = t.numpy(), G.numpy(), v.numpy()
    for b in range(2):
        for c in range(3):
            heads = []
            for h in range(H):
                sl = slice(h * d, (h + 1) * d)
                q = tn[b, c] @ Wq[sl].T  # t W_Q^(h)
                K = Gn[b, c] @ Wk[sl].T
                V = Gn[b, c] @ Wv[sl].T
                a = K @ q / math.sqrt(d)  # eq. 10
                a = np.exp(a - a.max())
                a /= a.sum()
                assert np.allclose(w[b, c, h].detach().numpy(), a)
                heads.append(a @ V)
            r_ref = np.concatenate(heads) @ Wo.T
            assert np.allclose(r[b, c].detach().numpy(), r_ref)
            p_hat = (tn[b, c] + r_ref) @ m.w1.weight.detach().numpy()[0] + m.w1.bias.item()  # eq. 11
            p_til = vn[b, c] @ m.w2.weight.detach().numpy()[0] + m.w2.bias.item()  # eq. 12
            assert float(m(t, G, v)[b, c].detach()) == pytest.approx(0.3 * p_hat + 0.7 * p_til)  # eq. 13


def test_lambda_and_masks():
    torch.manual_seed(1)
    t, G, v = torch.randn(2, 4, 6), torch.randn(2, 4, 3, 6), torch.randn(2, 4, 5)
    only_kg = SeptaPredictor(6, 5, heads=1, lam=1.0, dropout=0.0).eval()
    assert torch.equal(only_kg(t, G, v), only_kg(t, G, torch.randn(2, 4, 5)))
    only_text = SeptaPredictor(6, 5, heads=1, lam=0.0, dropout=0.0).eval()
    assert torch.equal(only_text(t, G, v), only_text(torch.randn(2, 4, 6), torch.randn(2, 4, 3, 6), v))
    m = SeptaPredictor(6, 5, heads=3, dropout=0.0).eval()
    cm = torch.tensor([[True, True, True, False], [True, True, True, True]])
    p = m(t, G, v, choice_mask=cm)
    assert torch.isinf(p[0, 3]) and torch.isfinite(p[1]).all()
    gm = torch.ones(2, 4, 3, dtype=torch.bool)
    gm[0, 0] = False  # nothing retrieved: r = 0
    r, w = m.attend(t, G, gm)
    assert torch.all(r[0, 0] == 0) and torch.all(w[0, 0] == 0)
    gm[0, 1, 2] = False  # a padded slot gets no weight; the rest renormalise
    r2, w2 = m.attend(t, G, gm)
    assert torch.all(w2[0, 1, :, 2] == 0) and torch.allclose(w2[0, 1].sum(-1), torch.ones(3))
    r3, _ = m.attend(t[0, 1], G[0, 1, :2])
    assert torch.allclose(r2[0, 1], r3, atol=1e-6)


def test_subgraph_db_search_and_storage(tmp_path):
    rng = np.random.default_rng(0)
    e, h = rng.standard_normal((50, 8)).astype(np.float32), rng.standard_normal((50, 8)).astype(np.float32)
    db = SubgraphDB.from_embeddings(e, h, np.arange(100, 150), [f"text {i}" for i in range(50)])
    g = subgraph_vectors(e, h)
    assert np.allclose(db.get([[3, -1]])[0, 0], g[3], atol=1e-5) and np.all(db.get([[3, -1]])[0, 1] == 0)
    q = rng.standard_normal((4, 8)).astype(np.float32)
    sc, ids = db.search(q, 5)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    want = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ gn.T  # cosine (sec. 4.2)
    for i in range(4):
        assert np.allclose(sc[i], np.sort(want[i])[::-1][:5], atol=1e-5)
        assert set(ids[i]) == set(np.argsort(-want[i])[:5])
    db.save(tmp_path / "db")
    back = SubgraphDB.load(tmp_path / "db")
    assert back.texts == db.texts and np.array_equal(back.centres, db.centres)
    assert np.allclose(back.get(np.arange(50)), g, atol=1e-5)
    sc2, ids2 = back.search(q, 5)
    assert np.array_equal(ids2, ids)
    with pytest.raises(FileNotFoundError, match="db.json"):
        SubgraphDB.load(tmp_path)
    with pytest.raises(ValueError, match="equal lengths"):
        SubgraphDB(g, np.arange(3), ["a"] * 50)


def test_entity_linking_and_query_enhancement():
    g = KnowledgeGraph.from_triples([
        ("ice cream", "is_a", "dessert"), ("ice", "is_a", "water"), ("cream", "part_of", "milk"),
        ("dog", "capable_of", "bark"), ("dog", "at_location", "kennel"), ("kennel", "used_for", "sleeping"),
        ("the", "related_to", "a"), ("puppy", "is_a", "dog"),
    ])
    link = EntityLinker(g)
    names = lambda ids: [g.node_names[i] for i in ids]  # noqa: E731
    assert names(link.link("Where would the dogs eat ice cream?")) == ["dog", "ice cream", "ice", "cream"]
    assert names(link.link("THE Kennel")) == ["kennel"]  # stop word 'the' skipped
    # wide random word vectors: cosine ~ shared words / sqrt(len * len)
    enh = QueryEnhancer(g, BagOfWordsEncoder(4096), num_triples=2)
    (a,) = enh.enhance([("Where will the dog sleep?", "kennel")])
    assert a.base == "Where will the dog sleep? kennel"
    assert names(a.nodes) == ["dog", "kennel"]
    # candidates: the 4 triples touching dog + kennel's 1 more; overlap 2/6, then 1/sqrt(18)
    assert a.triples == ["dog can be found at kennel", "dog can bark"]
    assert a.text == a.base + ". " + ". ".join(a.triples) + "."
    (b,) = enh.enhance([("Nothing matches here", "zzz")])
    assert b.triples == [] and b.text == b.base


class _MentionEncoder:
    """Texts that mention ``word`` -> e0, the others -> e1 (so similarity
    says exactly which triples belong with the choice)."""

    def __init__(self, word):
        self.word = word

    def _enc(self, texts):
        return np.asarray([[1.0, 0.0] if self.word in t else [0.0, 1.0] for t in texts], dtype=np.float32)

    encode_queries = encode_passages = _enc


def test_busy_question_node_does_not_push_out_the_choice_triples():
    # "hub" (a question word) has 300 edges, all with lower ids than the choice's own triple
    triples = [("hub", "related_to", f"thing{i:03d}") for i in range(300)] + [("kennel", "part_of", "house")]
    g = KnowledgeGraph.from_triples(triples)
    enh = QueryEnhancer(g, _MentionEncoder("kennel"), num_triples=10)
    nodes, cands = enh.candidates("Where is the hub?", "kennel")
    assert [g.node_names[v] for v in nodes] == ["hub", "kennel"]
    assert 300 in g.incident_edges(nodes) and 300 not in g.incident_edges(nodes)[:256]  # the old first-256 rule
    assert 300 in cands and len(cands) == 1 + enh.max_per_node  # the choice's triple + hub's share
    (a,) = enh.enhance([("Where is the hub?", "kennel")])
    assert len(a.triples) == 10 and a.triples[0] == "kennel is a part of house"

    # a busy choice node: its edges to question nodes come first, beyond its own share
    triples = ([("hub", "related_to", f"thing{i:03d}") for i in range(300)]
               + [("house", "related_to", f"stuff{i:03d}") for i in range(100)] + [("hub", "at_location", "house")])
    g = KnowledgeGraph.from_triples(triples)
    enh = QueryEnhancer(g, _MentionEncoder("house"), num_triples=10, max_per_node=8, max_candidates=12)
    _, cands = enh.candidates("Where is the hub?", "house")
    assert cands[0] == 400  # the bridge hub -> house
    assert cands[1:9] == list(range(300, 308))  # house's share, lowest ids first
    assert cands[9:] == [0, 1, 2]  # hub fills what is left of max_candidates
    (a,) = enh.enhance([("Where is the hub?", "house")])
    assert "hub can be found at house" in a.triples
    with pytest.raises(ValueError, match="max_per_node"):
        QueryEnhancer(g, _MentionEncoder("x"), max_per_node=-1)


def test_predictor_trains_on_real_questions(shared_data, tmp_path):
    """End to end on 240 real CSQA training questions: a graph from their
    stems, a tiny random-weight BERT encoder, align -> build-db -> train."""
    from rcn_fast.data import load_questions
    from rcn_fast.retrieval.encoders import Encoder
    from rcn_fast.septa import AlignConfig, GNNConfig, SamplerConfig, build_database, prepare_alignment, run_alignment
    from rcn_fast.septa import run_training
    from rcn_fast.septa.query import STOPWORDS, tokenize
    from tests.retrieval.tiny import make_tiny_bert

    train = load_questions(shared_data / "csqa" / "csqa-train.jsonl", limit=240)
    dev = load_questions(shared_data / "csqa" / "csqa-dev.jsonl", limit=40)
    triples = []
    for q in train:  # adjacent content words of each stem (no answers)
        w = [t for t in tokenize(q.question) if t not in STOPWORDS]
        triples += [(a, "related_to", b) for a, b in zip(w, w[1:])]
    g = KnowledgeGraph.from_triples(triples, source="csqa-stems")
    words = sorted({w for q in train + dev for s in [q.question] + q.choices for w in tokenize(s)})
    enc = Encoder.from_pretrained(make_tiny_bert(tmp_path / "bert", extra_words=words), query_prefix="",
                                  passage_prefix="", max_length=128)
    d = tmp_path / "septa"
    prepare_alignment(d, g, enc, num_pairs=200, eval_pairs=40, sampler=SamplerConfig(max_nodes=6, max_edges=8),
                      gnn=GNNConfig(hidden=32, heads=2))
    run_alignment(d, AlignConfig(dim=32, batch_size=32, epochs=1))
    build_database(d, limit=300)
    res = run_training(d, train, dev, PredictorConfig(top_k=4, epochs=8, patience=8, lr=1e-2, dropout=0.0,
                                                      batch_size=16), encoder=enc)
    hist = res["history"]
    losses = [h["loss"] for h in hist]
    assert len(hist) == 8 and res["train_questions"] == 240
    assert abs(hist[0]["first_loss"] - math.log(5)) < 0.05  # starts at chance
    assert losses[-1] < losses[0] - 0.1 and losses[-1] < losses[len(losses) // 2], losses
    # the best dev epoch is kept (which epoch that is varies with the machine's float rounding on 40 dev
    # questions; test_the_best_dev_epoch_is_kept pins the rule on scripted accuracies)
    devs = [h["dev_acc"] for h in hist]
    assert res["dev_acc"] == max(devs), (devs, res["dev_acc"])
    # without a dev split the last epoch is kept: it fits its training questions far above chance
    # (1 in 5; measured 0.66 with seed 0 and 0.63 with seed 1 on these settings)
    (d / "predictor_state.safetensors").unlink()
    res = run_training(d, train, None, PredictorConfig(top_k=4, epochs=20, patience=20, lr=1e-2, dropout=0.0,
                                                       batch_size=16), encoder=enc)
    losses = [h["loss"] for h in res["history"]]
    assert len(losses) == 20 and losses[-1] < losses[0] - 0.4, losses
    assert res["train_acc"] >= 0.45, res["train_acc"]
    with pytest.raises(ValueError, match="lam"):
        PredictorConfig(lam=1.5)


def test_the_best_dev_epoch_is_kept(monkeypatch):
    """Dev accuracies scripted to peak at epoch 2 of 5 (a tie at epoch 4): the model
    returned holds epoch 2's weights, not the last epoch's nor the tie's."""
    import torch

    import rcn_fast.septa.predictor as P

    rng = np.random.default_rng(0)
    Q, C, k, d, dt = 24, 3, 2, 8, 6
    feats = P.QuestionFeatures(t=rng.standard_normal((Q, C, d)).astype(np.float32),
                               G=rng.standard_normal((Q, C, k, d)).astype(np.float32),
                               G_ids=np.zeros((Q, C, k), np.int64), G_scores=np.ones((Q, C, k), np.float32),
                               v=rng.standard_normal((Q, C, dt)).astype(np.float32),
                               choice_mask=np.ones((Q, C), bool), answers=rng.integers(0, C, Q).astype(np.int64))
    scripted = iter([0.2, 0.6, 0.3, 0.6, 0.1])
    monkeypatch.setattr(P, "accuracy", lambda *a, **kw: next(scripted))
    model = SeptaPredictor(d, dt, dropout=0.0)
    weights = []
    hist = P.train_predictor(model, feats, PredictorConfig(epochs=5, patience=5, lr=1e-2, batch_size=8), dev=feats,
                             on_epoch=lambda rec: weights.append({n: v.detach().clone()
                                                                  for n, v in model.state_dict().items()}))
    assert [h["dev_acc"] for h in hist] == [0.2, 0.6, 0.3, 0.6, 0.1] and len(weights) == 5
    kept = model.state_dict()
    assert all(torch.equal(kept[n], weights[1][n]) for n in kept)  # epoch 2
    assert not all(torch.equal(kept[n], weights[-1][n]) for n in kept)  # the epochs did move the weights
    assert not all(torch.equal(kept[n], weights[3][n]) for n in kept)  # a later tie does not replace the best
