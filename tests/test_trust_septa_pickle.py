"""Issue 26 item 1: nothing in a SEPTA directory is unpickled.

A crafted ``predictor.pt`` / ``align.pt`` used to run its code when a
trained SEPTA folder was loaded (``torch.load(weights_only=False)``).
Checkpoints are now safetensors with JSON settings; an old pickle is
refused with how to convert it, and the conversion itself reads with
``torch.load(weights_only=True)``, so a crafted file fails there too.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from rcn_fast.data import MCQuestion  # noqa: E402
from rcn_fast.septa import (  # noqa: E402
    AlignConfig, AlignModel, GNNConfig, PredictorConfig, SamplerConfig, SeptaSystem, build_database,
    prepare_alignment, run_alignment, run_training, train_alignment,
)
from rcn_fast.septa.__main__ import main as septa_main  # noqa: E402
from rcn_fast.septa.checkpoint import (  # noqa: E402
    convert_directory, convert_pickle_checkpoint, load_checkpoint, save_checkpoint,
)
from rcn_fast.septa.gnn import SubgraphTable  # noqa: E402
from rcn_fast.septa.system import check_directory, node_features, read_manifest  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.septa.helpers import BagOfWordsEncoder, one_torch_thread, word_graph  # noqa: E402,F401

REFUSED = r"pickle \(torch\.save\) checkpoint .*python -m rcn_fast\.septa convert --dir"


class _Payload:
    """Unpickling this creates the directory ``marker`` (the side effect a
    crafted checkpoint would hide in its pickle)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _crafted(path: Path, marker: Path) -> Path:
    torch.save({"config": {}, "spec": {}, "state": _Payload(marker), "model": _Payload(marker)}, path)
    return path


def _questions(g, n=8):
    names = g.node_names
    return [MCQuestion(id=f"q{i}", question=f"What goes with {names[i]}?",
                       choices=[names[i + 1], names[i + 50], names[i + 100]], answer=0) for i in range(n)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    g = word_graph(240, 700, seed=1)
    enc = BagOfWordsEncoder(32)
    d = tmp_path_factory.mktemp("septa") / "septa"
    prepare_alignment(d, g, enc, num_pairs=48, eval_pairs=16, sampler=SamplerConfig(max_nodes=5, max_edges=8),
                      gnn=GNNConfig(hidden=16, heads=2))
    run_alignment(d, AlignConfig(dim=16, batch_size=16, max_steps=3))
    build_database(d, encoder=enc, limit=120)
    qs = _questions(g)
    run_training(d, qs, None, PredictorConfig(top_k=2, num_triples=2, epochs=1, batch_size=4), encoder=enc)
    return d, enc, qs


@pytest.fixture
def septa_copy(built, tmp_path):
    d, enc, qs = built
    c = tmp_path / "copy"
    shutil.copytree(d, c)
    return c, enc, qs


def _scores(d: Path, enc, qs) -> np.ndarray:
    s = SeptaSystem(d, encoder=enc)
    feats, _ = s.features(qs)
    return s.score(feats)


def test_crafted_predictor_pickle_is_refused_and_runs_nothing(septa_copy, tmp_path):
    d, enc, _ = septa_copy
    marker = tmp_path / "pwned"
    (d / "predictor.safetensors").unlink()
    _crafted(d / "predictor.pt", marker)
    for load in (lambda: SeptaSystem(d, encoder=enc), lambda: check_directory(d)):
        with pytest.raises(ValueError, match=REFUSED):
            load()
        assert not marker.exists()
    # the conversion refuses it too (weights-only reader), without running it
    with pytest.raises(ValueError, match="cannot be converted"):
        convert_directory(d)
    assert not marker.exists() and not (d / "predictor.safetensors").exists()
    # the same pickle under the new name: recognised and refused, not parsed
    (d / "predictor.pt").rename(d / "predictor.safetensors")
    with pytest.raises(ValueError, match=REFUSED):
        SeptaSystem(d, encoder=enc)
    assert not marker.exists()


def test_crafted_align_pickle_is_refused_by_build_db_and_the_cli(septa_copy, tmp_path, capsys):
    d, enc, _ = septa_copy
    marker = tmp_path / "pwned"
    (d / "align.safetensors").unlink()
    _crafted(d / "align.pt", marker)
    with pytest.raises(ValueError, match=REFUSED):
        build_database(d, encoder=enc)
    with pytest.raises(ValueError, match=REFUSED):
        AlignModel.load(d / "align.pt")
    assert septa_main(["build-db", "--dir", str(d), "--quiet"]) == 2
    assert re.search(REFUSED, capsys.readouterr().err)
    assert not marker.exists()


def test_crafted_training_state_is_refused(septa_copy, tmp_path):
    d, enc, _ = septa_copy
    marker = tmp_path / "pwned"
    (d / "align_state.safetensors").unlink()
    _crafted(d / "align_state.pt", marker)
    with pytest.raises(ValueError, match=REFUSED):  # the old resume file in place of the new one
        run_alignment(d, AlignConfig(dim=16, batch_size=16, max_steps=3))
    m = _align(d)
    state = _crafted(tmp_path / "state.safetensors", marker)
    with pytest.raises(ValueError, match=REFUSED):
        train_alignment(m, SubgraphTable.from_subgraphs(*_subgraphs(d)), np.zeros((4, 32), np.float32),
                        AlignConfig(dim=16, batch_size=2, max_steps=1), checkpoint=state)
    assert not marker.exists()


def _align(d: Path) -> AlignModel:
    return AlignModel.load(d / "align.safetensors", node_features(d, read_manifest(d)))


def _subgraphs(d: Path):
    from rcn_fast.kg import KnowledgeGraph
    from rcn_fast.septa.system import _load_align_data

    sg, _, _ = _load_align_data(d)
    return sg.select(np.arange(4)), KnowledgeGraph.load(d / "graph")


def test_round_trip_gives_identical_tensors_and_predictions(built, tmp_path):
    d, enc, qs = built
    # the aligned model: save -> load gives the same tensors and embeddings
    m = _align(d)
    m.save(tmp_path / "again.safetensors")
    m2 = AlignModel.load(tmp_path / "again.safetensors", node_features(d, read_manifest(d)))
    a, b = m.module.state_dict(), m2.module.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    with torch.no_grad():
        assert torch.equal(m.text_embed(x), m2.text_embed(x))
    # the predictor: two loads score alike, and the loaded weights are the saved ones
    ck = load_checkpoint(d / "predictor.safetensors")
    s = SeptaSystem(d, encoder=enc)
    assert all(torch.equal(v, ck["state"][k]) for k, v in s.predictor.state_dict().items())
    np.testing.assert_array_equal(_scores(d, enc, qs), _scores(d, enc, qs))


def test_training_state_round_trip_is_exact(tmp_path):
    """Optimizer state (int keys, tuples), RNG state, history, None, nested
    dicts of tensors of several dtypes: exactly what was saved."""
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    lin(torch.ones(4, 3)).sum().backward()
    opt.step()
    obj = {"optim": opt.state_dict(), "torch_rng": torch.get_rng_state(), "step": 7, "best": -1.0,
           "history": [{"loss": 0.5, "dev_acc": None}], "best_state": {"model": lin.state_dict()},
           "mask": torch.tensor([True, False]), "half": torch.ones(2, dtype=torch.bfloat16), "empty": torch.zeros(0),
           "$odd": {"a": 1}, "tied": [lin.weight, lin.weight]}
    save_checkpoint(tmp_path / "s.safetensors", obj)
    back = load_checkpoint(tmp_path / "s.safetensors")

    def same(x, y):
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x.detach(), y)
        if isinstance(x, dict):
            return type(y) is dict and list(x) == list(y) and all(same(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return type(x) is type(y) and len(x) == len(y) and all(same(a, b) for a, b in zip(x, y))
        return type(x) is type(y) and x == y

    assert same({k: (dict(v) if k == "optim" else v) for k, v in obj.items()}, back)
    opt2 = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    opt2.load_state_dict(back["optim"])  # a state torch accepts
    with pytest.raises(TypeError, match="cannot store a _Payload"):
        save_checkpoint(tmp_path / "bad.safetensors", {"x": _Payload(tmp_path / "never")})
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(ValueError, match="junk.safetensors is not a readable safetensors checkpoint"):
        load_checkpoint(tmp_path / "junk.safetensors")


def test_old_pickle_directory_converts_once_and_predicts_the_same(septa_copy, capsys):
    """An honest directory of an older rcn_fast (torch.save checkpoints) is
    refused, converted with the documented command, then scores exactly as
    before."""
    d, enc, qs = septa_copy
    before = _scores(d, enc, qs)
    for stem in ("align", "predictor"):
        torch.save(load_checkpoint(d / f"{stem}.safetensors"), d / f"{stem}.pt")  # the old format
        (d / f"{stem}.safetensors").unlink()
    with pytest.raises(ValueError, match=REFUSED):
        SeptaSystem(d, encoder=enc)
    assert septa_main(["convert", "--dir", str(d)]) == 0
    assert "predictor.safetensors" in capsys.readouterr().out
    np.testing.assert_array_equal(_scores(d, enc, qs), before)
    p = convert_pickle_checkpoint(d / "align.pt", d / "align2.safetensors")
    assert p.name == "align2.safetensors" and load_checkpoint(p)["spec"] == load_checkpoint(
        d / "align.safetensors")["spec"]


def test_no_pickle_reader_left_in_the_package():
    """No module of rcn_fast unpickles a file: no weights_only=False, no
    torch.load without weights_only=True, no pickle/joblib/dill import, no
    np.load(allow_pickle=True)."""
    bad = []
    pattern = re.compile(r"weights_only\s*=\s*False|allow_pickle\s*=\s*True|^\s*(import|from)\s+(pickle|cPickle|"
                         r"joblib|dill|cloudpickle|shelve)\b|pd\.read_pickle|torch\.load\((?![^)]*weights_only=True)",
                         re.M)
    for f in sorted((REPO / "rcn_fast").rglob("*.py")):
        text = f.read_text()
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{f.relative_to(REPO)}:{line}: {text.splitlines()[line - 1].strip()}")
    assert not bad, "\n".join(bad)
