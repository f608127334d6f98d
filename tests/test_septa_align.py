"""SEPTA graph encoder and alignment: InfoNCE and eq. 9 against hand
computation, padding invariance, alignment raises held-out recall@1, resume."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.kg import bfs_subgraphs, subgraph_text  # noqa: E402
from rcn_fast.septa import (  # noqa: E402
    AlignConfig,
    AlignModel,
    GNNConfig,
    SubgraphTable,
    info_nce,
    recall_at_k,
    subgraph_vectors,
    train_alignment,
)
from tests.septa.helpers import BagOfWordsEncoder, one_torch_thread, word_graph  # noqa: E402,F401


def test_info_nce_matches_hand_computation():
    rng = np.random.default_rng(0)
    e, h = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    tau = 0.3
    en = e / np.linalg.norm(e, axis=1, keepdims=True)
    hn = h / np.linalg.norm(h, axis=1, keepdims=True)
    s = en @ hn.T / tau
    g2t = -np.mean([s[i, i] - np.log(np.exp(s[i]).sum()) for i in range(5)])  # eq. 5
    t2g = -np.mean([s[i, i] - np.log(np.exp(s[:, i]).sum()) for i in range(5)])  # eq. 7
    loss, a, b = info_nce(torch.tensor(e), torch.tensor(h), tau)
    assert float(a) == pytest.approx(g2t, rel=1e-9) and float(b) == pytest.approx(t2g, rel=1e-9)
    assert float(loss) == pytest.approx((g2t + t2g) / 2, rel=1e-9)  # eq. 8
    with pytest.raises(ValueError, match="e, h"):
        info_nce(torch.zeros(3, 2), torch.zeros(2, 2), 0.1)


def test_eq9_subgraph_vectors():
    e = np.array([[3.0, 4.0], [0.0, 2.0]])
    h = np.array([[0.0, 10.0], [1.0, 0.0]])
    # row 0: ||h|| / ||e|| = 10 / 5 = 2 -> (2 * [3, 4] + [0, 10]) / 2 = [3, 9]
    # row 1: 1 / 2 -> ([0, 1] + [1, 0]) / 2 = [0.5, 0.5]
    want = np.array([[3.0, 9.0], [0.5, 0.5]])
    assert np.allclose(subgraph_vectors(e, h), want)
    assert np.allclose(subgraph_vectors(torch.tensor(e), torch.tensor(h)).numpy(), want)


def test_recall_at_k():
    e = np.eye(4)
    h = np.eye(4)[[0, 1, 3, 2]]
    assert recall_at_k(e, h, 1) == 0.5
    assert recall_at_k(e, np.eye(4), 1) == 1.0


def _setup(num_nodes=600, num_edges=2000, n=364):
    g = word_graph(num_nodes, num_edges)
    enc = BagOfWordsEncoder(64)
    sg = bfs_subgraphs(g, np.arange(n), p=0.6, max_depth=2, max_nodes=8, seed=0)
    temb = enc.encode_passages([subgraph_text(g, sg.edge_ids(i)) for i in range(len(sg))])
    return g, enc, sg, temb, enc.encode_passages(g.node_names)


@pytest.mark.parametrize("features", ["text", "learned"])
def test_gnn_batches_of_different_sizes(features):
    g, enc, sg, temb, nf = _setup(200, 600, 20)
    tab = SubgraphTable.from_subgraphs(sg, g)
    # local edges agree with the slow per-subgraph conversion
    for i in range(len(sg)):
        src, dst, rel = sg.local_edges(i, g)
        e0, e1 = tab.edge_ptr[i], tab.edge_ptr[i + 1]
        assert np.array_equal(tab.src[e0:e1], src) and np.array_equal(tab.dst[e0:e1], dst)
        assert np.array_equal(tab.rel[e0:e1], rel)
    m = AlignModel(GNNConfig(hidden=32, heads=4, dropout=0.0, node_features=features), 64, 16, g.num_relations,
                   g.num_nodes, nf if features == "text" else None)
    m.module.eval()
    sizes = np.diff(sg.node_ptr)
    small, big = int(np.argmin(sizes)), int(np.argmax(sizes))
    assert sizes[small] < sizes[big]
    with torch.no_grad():
        alone = m.graph_embed(tab.batch([small]))
        mixed = m.graph_embed(tab.batch([big, small, big]))
        allb = m.graph_embed(tab.batch(np.arange(len(sg))))
    assert alone.shape == (1, 16) and mixed.shape == (3, 16) and allb.shape == (len(sg), 16)
    # padding never leaks into a subgraph's embedding
    assert torch.allclose(alone[0], mixed[1], atol=1e-5)
    assert torch.allclose(mixed[0], mixed[2], atol=1e-6)
    with pytest.raises(ValueError, match="node_features"):
        AlignModel(GNNConfig(node_features="text"), 64, 16, g.num_relations, g.num_nodes, None)


def test_alignment_raises_heldout_recall():
    g, enc, sg, temb, nf = _setup()
    tr, te = np.arange(300), np.arange(300, 364)
    t_tr = SubgraphTable.from_subgraphs(sg.select(tr), g)
    t_te = SubgraphTable.from_subgraphs(sg.select(te), g)
    m = AlignModel(GNNConfig(hidden=32, heads=2, dropout=0.0), 64, 32, g.num_relations, g.num_nodes, nf)
    before = recall_at_k(*m.embed_all(t_te, temb[te]))
    hist = train_alignment(m, t_tr, temb[tr], AlignConfig(dim=32, batch_size=32, epochs=10, lr=3e-3))
    after = recall_at_k(*m.embed_all(t_te, temb[te]))
    first = np.mean([h["loss"] for h in hist[:5]])
    last = np.mean([h["loss"] for h in hist[-5:]])
    assert last < 0.5 * first, (first, last)
    # 64 held-out pairs: chance is 1/64 (measured: 0.03 -> 0.84)
    assert before < 0.15 and after > 0.5 and after > before + 0.4, (before, after)


def test_resume_gives_the_uninterrupted_result(tmp_path):
    g, enc, sg, temb, nf = _setup(200, 600, 96)
    tab = SubgraphTable.from_subgraphs(sg, g)
    cfg = AlignConfig(dim=16, batch_size=16, max_steps=8, checkpoint_every=1, lr=1e-2)
    gc = GNNConfig(hidden=16, heads=2, dropout=0.1)

    def model():
        return AlignModel(gc, 64, 16, g.num_relations, g.num_nodes, nf, seed=3)

    ref = model()
    h_ref = train_alignment(ref, tab, temb, cfg)

    class Killed(Exception):
        pass

    def kill_at_5(step, loss):
        if step == 5:
            raise Killed

    m1 = model()
    with pytest.raises(Killed):
        train_alignment(m1, tab, temb, cfg, checkpoint=tmp_path / "state.safetensors", on_step=kill_at_5)
    m2 = model()
    h2 = train_alignment(m2, tab, temb, cfg, checkpoint=tmp_path / "state.safetensors")
    assert [h["step"] for h in h2] == list(range(1, 9))
    assert [h["loss"] for h in h2] == pytest.approx([h["loss"] for h in h_ref], rel=1e-5)
    for (k, a), (_, b) in zip(ref.module.state_dict().items(), m2.module.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), k
    with pytest.raises(ValueError, match="checkpoint"):
        train_alignment(model(), tab, temb, AlignConfig(dim=16, batch_size=8, max_steps=8),
                        checkpoint=tmp_path / "state.safetensors")
