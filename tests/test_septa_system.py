"""The SEPTA directory: build-db resumes from its finished chunks, the
checks and fingerprints the evaluation runner relies on, the feature cache
key, and a failed ``align`` preparation leaving no directory behind."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast.data import MCQuestion  # noqa: E402
from rcn_fast.septa.checkpoint import load_checkpoint  # noqa: E402
from rcn_fast.septa import (  # noqa: E402
    AlignConfig,
    GNNConfig,
    PredictorConfig,
    SamplerConfig,
    build_database,
    prepare_alignment,
    run_alignment,
    run_training,
)
from rcn_fast.septa.system import check_directory, checkpoint_fingerprint  # noqa: E402
from tests.septa.helpers import BagOfWordsEncoder, one_torch_thread, word_graph  # noqa: E402,F401


@pytest.fixture
def aligned(tmp_path):
    g = word_graph(240, 700, seed=1)
    enc = BagOfWordsEncoder(32)
    d = tmp_path / "septa"
    prepare_alignment(d, g, enc, num_pairs=64, eval_pairs=16, sampler=SamplerConfig(max_nodes=5, max_edges=8),
                      gnn=GNNConfig(hidden=16, heads=2))
    run_alignment(d, AlignConfig(dim=16, batch_size=16, max_steps=4))
    return d, enc, g


def _questions(g, n=12):
    names = g.node_names
    return [MCQuestion(id=f"q{i}", question=f"What goes with {names[i]}?",
                       choices=[names[i + 1], names[i + 50], names[i + 100]], answer=0) for i in range(n)]


class _Interrupt(Exception):
    pass


def test_build_db_resumes_from_its_finished_chunks(aligned, monkeypatch):
    d, enc, g = aligned
    ref = build_database(d, encoder=enc, batch_size=50)
    ref_vecs, ref_texts, ref_centres = ref.get(np.arange(len(ref))), list(ref.texts), ref.centres.copy()
    n_chunks = math.ceil(len(ref) / 50)
    assert n_chunks >= 4 and not (d / "db_parts").exists()  # parts are removed once db/ is written
    shutil.rmtree(d / "db")

    calls = []
    real = SamplerConfig.sample

    def sample(self, graph, centres, fail_at=None):
        calls.append(len(centres))
        if fail_at is not None and len(calls) == fail_at:
            raise _Interrupt  # the process dies while the third chunk is being embedded
        return real(self, graph, centres)

    monkeypatch.setattr(SamplerConfig, "sample", lambda self, gr, c: sample(self, gr, c, fail_at=3))
    with pytest.raises(_Interrupt):
        build_database(d, encoder=enc, batch_size=50)
    assert sorted(p.name for p in (d / "db_parts").glob("part-*.npz")) == ["part-000000.npz", "part-000001.npz"]
    assert not (d / "db").exists()

    calls.clear()
    monkeypatch.setattr(SamplerConfig, "sample", lambda self, gr, c: sample(self, gr, c))
    db = build_database(d, encoder=enc, batch_size=50)
    assert len(calls) == n_chunks - 2  # only the unfinished chunks are sampled and embedded
    np.testing.assert_allclose(db.get(np.arange(len(db))), ref_vecs, rtol=1e-5, atol=1e-6)
    assert db.texts == ref_texts and np.array_equal(db.centres, ref_centres)
    assert not (d / "db_parts").exists()

    # parts written with another chunk size are not mixed in: the build starts afresh
    shutil.rmtree(d / "db")
    calls.clear()
    monkeypatch.setattr(SamplerConfig, "sample", lambda self, gr, c: sample(self, gr, c, fail_at=2))
    with pytest.raises(_Interrupt):
        build_database(d, encoder=enc, batch_size=50)
    calls.clear()
    monkeypatch.setattr(SamplerConfig, "sample", lambda self, gr, c: sample(self, gr, c))
    db = build_database(d, encoder=enc, batch_size=70)
    assert len(calls) == math.ceil(len(ref) / 70)
    np.testing.assert_allclose(db.get(np.arange(len(db))), ref_vecs, rtol=1e-5, atol=1e-6)


def test_checks_fingerprints_and_feature_cache(aligned):
    d, enc, g = aligned
    with pytest.raises(FileNotFoundError, match=r"has no db/, predictor\.safetensors \(run `python -m rcn_fast\.septa "
                                                r"build-db`, then `python -m rcn_fast\.septa train` first\)"):
        check_directory(d)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_directory(d / "nothing")
    build_database(d, encoder=enc)
    with pytest.raises(FileNotFoundError, match=r"has no predictor\.safetensors \(run `python -m rcn_fast\.septa train`"):
        check_directory(d)
    qs = _questions(g)
    cfg = PredictorConfig(top_k=2, num_triples=2, epochs=1, batch_size=4)
    run_training(d, qs, None, cfg, encoder=enc)
    assert check_directory(d)["predictor"] == cfg.to_dict()
    fp = checkpoint_fingerprint(d)
    assert checkpoint_fingerprint(d) == fp
    (d / "metrics.json").write_text("{}\n")  # not read by the pipeline: no change
    assert checkpoint_fingerprint(d) == fp
    features = set(d.glob("features_*.npz"))
    assert len(features) == 1

    # retraining in place changes the fingerprint; the same questions reuse their features
    (d / "predictor_state.safetensors").unlink()
    run_training(d, qs, None, PredictorConfig(top_k=2, num_triples=2, epochs=2, batch_size=4, seed=1), encoder=enc)
    fp2 = checkpoint_fingerprint(d)
    assert fp2 != fp and set(d.glob("features_*.npz")) == features

    # a rebuilt database (other centres) or another alignment: the features are computed afresh
    build_database(d, encoder=enc, limit=100)
    assert checkpoint_fingerprint(d) != fp2
    (d / "predictor_state.safetensors").unlink()
    run_training(d, qs, None, cfg, encoder=enc)
    assert len(set(d.glob("features_*.npz")) - features) == 1
    features = set(d.glob("features_*.npz"))
    (d / "align_state.safetensors").unlink()
    run_alignment(d, AlignConfig(dim=16, batch_size=16, max_steps=4, seed=1))  # align.safetensors rewritten
    (d / "predictor_state.safetensors").unlink()
    run_training(d, qs, None, cfg, encoder=enc)
    assert len(set(d.glob("features_*.npz")) - features) == 1
    # another encoder (same width): afresh too
    features = set(d.glob("features_*.npz"))
    (d / "predictor_state.safetensors").unlink()
    run_training(d, qs, None, cfg, encoder=BagOfWordsEncoder(32, seed=5))
    assert len(set(d.glob("features_*.npz")) - features) == 1


def test_failed_align_preparation_leaves_no_directory(tmp_path):
    enc = BagOfWordsEncoder(16)
    d = tmp_path / "new"
    with pytest.raises(FileNotFoundError, match="no TSV file"):
        prepare_alignment(d, f"tsv:{tmp_path / 'missing.tsv'}", enc)
    assert not d.exists()
    tsv = tmp_path / "tiny.tsv"
    tsv.write_text("a\tIsA\tb\n")
    with pytest.raises(ValueError, match="need at least 4"):
        prepare_alignment(d, f"tsv:{tsv}", enc)
    assert not d.exists()

    class Broken(BagOfWordsEncoder):
        def encode_passages(self, texts, **kw):
            raise RuntimeError("encoder failed")

    g = word_graph(40, 120)
    with pytest.raises(RuntimeError, match="encoder failed"):
        prepare_alignment(d, g, Broken(16), num_pairs=8, eval_pairs=4)
    assert not d.exists()  # created by the failed call: removed
    d.mkdir()
    with pytest.raises(RuntimeError, match="encoder failed"):
        prepare_alignment(d, g, Broken(16), num_pairs=8, eval_pairs=4)
    assert d.is_dir()  # the user's own directory is left alone


def test_finetune_encoder_trains_the_text_encoder(tmp_path):
    """The paper's setting (sec. 5.3): the text encoder and the text
    projection train with the predictor (their own learning rate); the
    fine-tuned weights are saved and the loaded system computes t and v
    with them. The default keeps the encoder frozen."""
    from rcn_fast.retrieval.encoders import Encoder
    from rcn_fast.septa import FinetunedText, SeptaSystem
    from tests.retrieval.tiny import make_tiny_bert

    g = word_graph(240, 700, seed=1)
    qs = _questions(g, 12)
    enc = Encoder.from_pretrained(make_tiny_bert(tmp_path / "bert", extra_words=list(g.node_names)),
                                  query_prefix="", passage_prefix="", max_length=64)
    d = tmp_path / "septa"
    prepare_alignment(d, g, enc, num_pairs=64, eval_pairs=16, sampler=SamplerConfig(max_nodes=5, max_edges=8),
                      gnn=GNNConfig(hidden=16, heads=2))
    run_alignment(d, AlignConfig(dim=16, batch_size=16, max_steps=4))
    build_database(d, encoder=enc, limit=120)
    cfg = PredictorConfig(top_k=2, num_triples=2, epochs=2, batch_size=4, finetune_encoder=True, encoder_lr=1e-3)
    res = run_training(d, qs, qs[:4], cfg, encoder=enc)
    assert res["epochs"] == 2 and 0.0 <= res["dev_acc"] <= 1.0
    ck = load_checkpoint(d / "predictor.safetensors")
    assert ck["config"]["finetune_encoder"] is True and ck["text_model"] is not None
    fresh = FinetunedText(enc, SeptaSystem(d, encoder=enc, load_predictor=False).align.module["text"])
    before = fresh.state_dict()
    changed = [k for k, v in ck["text_model"].items() if not torch.equal(v, before[k])]
    assert any(k.startswith("lm.encoder.") for k in changed), changed  # transformer weights moved
    assert any(k.startswith("proj.") for k in changed)  # and the text projection
    # the loaded system scores with the fine-tuned encoder: its t differs from the frozen encoder's
    sysm = SeptaSystem(d, encoder=enc)
    assert sysm.text_model is not None
    feats, _ = sysm.features(qs[:3])
    frozen = SeptaSystem(d, encoder=enc)
    frozen.text_model = None
    feats0, _ = frozen.features(qs[:3])
    np.testing.assert_array_equal(feats.G_ids, feats0.G_ids)  # retrieval: the frozen aligned space
    assert not np.allclose(feats.t, feats0.t) and not np.allclose(feats.v, feats0.v)
    # default: frozen encoder, nothing of it saved
    (d / "predictor_state.safetensors").unlink()
    run_training(d, qs, None, PredictorConfig(top_k=2, num_triples=2, epochs=1, batch_size=4), encoder=enc)
    ck = load_checkpoint(d / "predictor.safetensors")
    assert ck["text_model"] is None and SeptaSystem(d, encoder=enc).text_model is None
    # fine-tuning needs a transformers encoder
    (d / "predictor_state.safetensors").unlink()
    with pytest.raises(ValueError, match="finetune_encoder"):
        run_training(d, qs, None, cfg, encoder=BagOfWordsEncoder(32))
