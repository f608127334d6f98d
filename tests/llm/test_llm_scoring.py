"""Choice-label scoring: Triton kernels (TRITON_INTERPRET=1 on CPU, compiled
on CUDA) against the torch reference, and the reference against an
independent float64 numpy formula."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rcn_fast import BackendUnavailableError  # noqa: E402
from rcn_fast.llm.scoring.choice import (  # noqa: E402
    CHOICE_LOGPROBS,
    choice_logprobs,
    choice_logprobs_from_hidden,
    choice_logprobs_hidden_reference,
    choice_logprobs_reference,
    pack_label_ids,
)
from rcn_fast.testing.peers import full_vocab_then_gather, make_ids  # noqa: E402  (the benchmarks' baseline)

HAS_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()
needs_triton = pytest.mark.skipif(
    not HAS_TRITON or not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="triton missing, or neither CUDA nor TRITON_INTERPRET=1",
)
DEVICE = "cuda" if CUDA else "cpu"

# logits path: gathers are exact, so every dtype is compared at fp32 precision
TOL_LOGITS = {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}
# hidden path: the inputs are already rounded to their dtype and both the
# kernel and the reference accumulate in fp32, so only the summation order
# differs: measured at most 1e-6 for every dtype (TRITON_INTERPRET=1, H <= 96).
# A kernel that accumulated in the input dtype errs by ~4e-4 (fp16) and
# ~6e-3 (bf16) on the same inputs, so these bounds catch it.
TOL_HIDDEN = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-5, 2e-5), torch.bfloat16: (2e-5, 2e-5)}


def numpy_reference(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """float64: label mass = sum of exp(logit) over present spellings."""
    B, C, S = ids.shape
    out = np.full((B, C), -np.inf)
    for b in range(B):
        lab = np.full(C, -np.inf)
        for c in range(C):
            xs = [logits[b, t] for t in ids[b, c] if t >= 0]
            if xs:
                m = max(xs)
                lab[c] = -np.inf if m == -np.inf else m + np.log(np.sum(np.exp(np.array(xs) - m)))
        if np.isfinite(lab).any():
            m = lab.max()
            out[b] = lab - (m + np.log(np.exp(lab - m).sum()))
    return out


def assert_same(got, ref, tol):
    lp, arg = got
    rlp, rarg = ref
    assert lp.dtype == torch.float32 and arg.dtype == torch.int64
    assert lp.shape == rlp.shape and arg.shape == rarg.shape
    rtol, atol = tol if isinstance(tol, tuple) else (tol, tol)
    torch.testing.assert_close(lp.cpu(), rlp.cpu(), rtol=rtol, atol=atol)
    assert torch.equal(torch.isneginf(lp.cpu()), torch.isneginf(rlp.cpu()))


def test_reference_matches_float64_formula():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 50, generator=gen) * 4
    logits[0, :] = float("-inf")
    ids = make_ids(9, 6, 3, 50, gen)
    ids[1, 2] = -1
    lp, arg = choice_logprobs_reference(logits, ids)
    ref = numpy_reference(logits.double().numpy(), ids.numpy())
    np.testing.assert_allclose(lp.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert arg[0] == -1
    best = np.where(np.isfinite(ref).any(1), np.argmax(np.where(np.isfinite(ref), ref, -np.inf), 1), -1)
    np.testing.assert_array_equal(arg.numpy(), best)


def test_full_vocab_baseline_agrees_with_reference():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(7, 333, generator=gen) * 5
    ids = make_ids(7, 5, 2, 333, gen)
    torch.testing.assert_close(full_vocab_then_gather(logits, ids), choice_logprobs_reference(logits, ids)[0], rtol=1e-5, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B,C,S,V", [(1, 1, 1, 7), (3, 5, 2, 129), (17, 12, 3, 1000), (4, 26, 2, 301)])
def test_triton_logits_matches_reference(dtype, B, C, S, V):
    gen = torch.Generator().manual_seed(B * 1000 + C)
    logits = (torch.randn(B, V, generator=gen) * 3).to(dtype).to(DEVICE)
    ids = make_ids(B, C, S, V, gen).to(DEVICE)
    got = choice_logprobs(logits, ids, backend="triton")
    ref = choice_logprobs(logits, ids, backend="torch")
    assert_same(got, ref, TOL_LOGITS[dtype])
    assert torch.equal(got[1].cpu(), ref[1].cpu())


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B,C,S,H,V", [(1, 1, 1, 5, 7), (3, 5, 2, 33, 129), (6, 12, 3, 96, 400)])
def test_triton_hidden_matches_reference(dtype, B, C, S, H, V):
    gen = torch.Generator().manual_seed(H)
    hidden = torch.randn(B, H, generator=gen).to(dtype).to(DEVICE)
    weight = (torch.randn(V, H, generator=gen) / H**0.5).to(dtype).to(DEVICE)
    bias = torch.randn(V, generator=gen).to(dtype).to(DEVICE)
    ids = make_ids(B, C, S, V, gen).to(DEVICE)
    for b in (None, bias):
        got = choice_logprobs_from_hidden(hidden, weight, ids, b, backend="triton")
        ref = choice_logprobs_hidden_reference(hidden, weight, ids, b)
        assert_same(got, ref, TOL_HIDDEN[dtype])
    # and the hidden path equals scoring the full logits
    full = hidden.float() @ weight.float().T
    assert_same(choice_logprobs_from_hidden(hidden, weight, ids, backend="triton"),
                choice_logprobs_reference(full, ids), TOL_HIDDEN[dtype])


@needs_triton
def test_triton_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(8, 300, generator=gen).to(DEVICE)
    logits = base[::2, 1::2]  # both strides non-unit
    ids = make_ids(4, 4, 4, 150, gen).to(DEVICE).transpose(1, 2)  # [B, S=4, C=4] view -> strided
    assert not logits.is_contiguous() and not ids.is_contiguous()
    assert_same(choice_logprobs(logits, ids, backend="triton"), choice_logprobs_reference(logits.contiguous(), ids.contiguous()), 1e-5)
    hidden = torch.randn(20, 3, generator=gen).to(DEVICE).T  # [3, 20], stride (1, 3)
    weight = torch.randn(20, 150, generator=gen).to(DEVICE).T  # [150, 20], stride (1, 150)
    ids2 = make_ids(3, 3, 2, 150, gen).to(DEVICE)
    assert_same(choice_logprobs_from_hidden(hidden, weight, ids2, backend="triton"),
                choice_logprobs_hidden_reference(hidden.contiguous(), weight.contiguous(), ids2), (1e-4, 1e-4))


@needs_triton
def test_triton_edge_cases_ties_neg_inf_and_padding():
    logits = torch.tensor(
        [
            [1.0, 1.0, 0.5, 0.0, 0.0],  # a tie between labels 0 and 1: the first wins
            [float("-inf")] * 5,  # nothing scored: -inf everywhere, argmax -1
            [0.0, float("-inf"), 2.0, 0.0, 0.0],  # one spelling -inf, the other counts
            [3.0, 0.0, 0.0, 0.0, 0.0],  # row with a padded (absent) label
        ],
        device=DEVICE,
    )
    ids = torch.tensor(
        [
            [[0, -1], [1, -1], [2, 3]],
            [[0, 1], [2, -1], [3, 4]],
            [[1, 2], [0, -1], [3, -1]],
            [[0, -1], [-1, -1], [1, 2]],
        ],
        device=DEVICE,
    )
    for backend in ("triton", "torch"):
        lp, arg = choice_logprobs(logits, ids, backend=backend)
        assert arg.cpu().tolist() == [0, -1, 0, 0], backend
        assert torch.isneginf(lp[1]).all() and torch.isneginf(lp[3, 1])
        assert lp[0, 0] == lp[0, 1]
        np.testing.assert_allclose(lp[2].cpu().numpy(), numpy_reference(logits.cpu().double().numpy(), ids.cpu().numpy())[2], rtol=1e-6)
    assert_same(choice_logprobs(logits, ids, backend="triton"), choice_logprobs(logits, ids, backend="torch"), 1e-6)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_nan_and_pos_inf_rows_are_not_scored(backend):
    """One rule for both backends: a NaN or +inf among a row's present
    spellings makes the whole row NaN with argmax -1; absent spellings and
    other rows are unaffected; -inf is an ordinary score."""
    logits = torch.tensor(
        [
            [0.0, NAN, 1.0, 0.5],  # NaN in label 1
            [0.0, INF, 1.0, 0.5],  # +inf in label 1
            [NAN, 2.0, 1.0, 0.5],  # NaN only under an absent (-1) spelling's clamp target: row is fine
            [0.0, 1.0, -INF, 0.5],  # -inf: an ordinary score
            [0.3, 0.2, 0.1, NAN],  # NaN in the second spelling of label 2
        ],
        device=DEVICE,
    )
    ids = torch.tensor(
        [
            [[0, -1], [1, -1], [2, -1]],
            [[0, -1], [1, -1], [2, -1]],
            [[1, -1], [2, -1], [-1, -1]],
            [[0, -1], [1, -1], [2, 3]],
            [[0, -1], [1, -1], [2, 3]],
        ],
        device=DEVICE,
    )
    lp, arg = choice_logprobs(logits, ids, backend=backend)
    lp, arg = lp.cpu(), arg.cpu()
    assert torch.isnan(lp[[0, 1, 4]]).all()
    assert not torch.isnan(lp[[2, 3]]).any()
    assert arg.tolist() == [-1, -1, 0, 1, -1]
    assert torch.isneginf(lp[2, 2])
    clean = logits.cpu().nan_to_num(nan=-1e9)
    ref = numpy_reference(clean.double().numpy(), ids.cpu().numpy())
    np.testing.assert_allclose(lp[[2, 3]].numpy(), ref[[2, 3]], rtol=1e-6, atol=1e-6)

    # the hidden path: NaN in a hidden state, in a label's LM-head row, and in an unused row
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 8, generator=gen)
    weight = torch.randn(6, 8, generator=gen)
    hidden[0, 5] = NAN
    weight[4, 2] = NAN  # a label token of row 1 only
    weight[5, 0] = NAN  # nobody's label
    hids = torch.tensor([[[0], [1]], [[4], [2]], [[1], [3]]])
    hidden, weight, hids = hidden.to(DEVICE), weight.to(DEVICE), hids.to(DEVICE)
    hl, ha = choice_logprobs_from_hidden(hidden, weight, hids, backend=backend)
    hl, ha = hl.cpu(), ha.cpu()
    assert torch.isnan(hl[:2]).all() and ha[:2].tolist() == [-1, -1]
    ref_lp, ref_arg = choice_logprobs_hidden_reference(hidden, weight, hids)
    torch.testing.assert_close(hl[2], ref_lp[2].cpu(), rtol=1e-5, atol=1e-5)
    assert ha[2] == ref_arg[2].cpu() and ref_arg[:2].tolist() == [-1, -1]


def test_label_tile_caps_send_large_cases_to_torch():
    from rcn_fast.llm.scoring.choice import CHOICE_LOGPROBS_HIDDEN, MAX_TILE_HIDDEN, MAX_TILE_LOGITS

    ctx = {"device": "cuda", "forced": False}
    # hidden kernel: next_pow2(C) * next_pow2(S) <= 256
    big = {**ctx, "C": 40, "S": 5}  # 64 * 8 = 512
    reasons = dict(CHOICE_LOGPROBS_HIDDEN.report(big))
    if HAS_TRITON:
        assert "512-entry tile" in reasons["triton"] and f"at most {MAX_TILE_HIDDEN}" in reasons["triton"]
    assert reasons["torch"] is None
    assert CHOICE_LOGPROBS_HIDDEN.select(big).name == "torch"
    with pytest.raises(BackendUnavailableError, match="tile"):
        CHOICE_LOGPROBS_HIDDEN.select(big, "triton")
    ok = {**ctx, "C": 32, "S": 8}  # exactly 256
    why = dict(CHOICE_LOGPROBS_HIDDEN.report(ok))["triton"]
    assert why is None or "tile" not in why
    # logits kernel: <= 4096
    assert "tile" not in (dict(CHOICE_LOGPROBS.report(big))["triton"] or "")
    huge = {**ctx, "C": 1024, "S": 8}  # 1024 * 8 = 8192
    if HAS_TRITON:
        assert f"at most {MAX_TILE_LOGITS}" in dict(CHOICE_LOGPROBS.report(huge))["triton"]
    assert CHOICE_LOGPROBS.select(huge).name == "torch"


@needs_triton
def test_triton_hidden_at_the_tile_cap():
    gen = torch.Generator().manual_seed(11)
    B, C, S, H, V = 2, 32, 8, 40, 300
    hidden = torch.randn(B, H, generator=gen).to(DEVICE)
    weight = (torch.randn(V, H, generator=gen) / H**0.5).to(DEVICE)
    ids = make_ids(B, C, S, V, gen).to(DEVICE)
    assert_same(choice_logprobs_from_hidden(hidden, weight, ids, backend="triton"),
                choice_logprobs_hidden_reference(hidden, weight, ids), (1e-4, 1e-4))


def test_dispatch_and_argument_errors(monkeypatch):
    logits = torch.randn(2, 10)
    ids = torch.tensor([[0, 1], [2, 3]])  # [B, C]: one spelling per label
    lp, _ = choice_logprobs(logits, ids, backend="torch")
    assert lp.shape == (2, 2)
    if not CUDA:
        # the interpreter is never chosen automatically, only by name
        assert CHOICE_LOGPROBS.select({"device": "cpu", "C": 2, "S": 1, "forced": False}).name == "torch"
        if HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1":
            assert CHOICE_LOGPROBS.select({"device": "cpu", "C": 2, "S": 1, "forced": True}, "triton").name == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if not CUDA:
        assert CHOICE_LOGPROBS.select({"device": "cpu", "C": 2, "S": 1}).name == "torch"
        with pytest.raises(BackendUnavailableError, match="triton"):
            choice_logprobs(logits, ids, backend="triton")
    monkeypatch.setenv("RCN_FAST_BACKEND", "choice_logprobs=torch")
    assert CHOICE_LOGPROBS.select({"device": DEVICE, "C": 2, "S": 1}).name == "torch"
    with pytest.raises(TypeError, match="label_ids: expected int32 or int64"):
        choice_logprobs(logits, ids.float())
    with pytest.raises(ValueError, match="vocabulary size 10"):
        choice_logprobs(logits, torch.tensor([[0, 10], [1, 2]]))
    with pytest.raises(ValueError, match="label_ids: expected 2 rows"):
        choice_logprobs(logits, torch.tensor([[0, 1]]))
    with pytest.raises(TypeError, match="logits: expected float32"):
        choice_logprobs(logits.double(), ids)
    with pytest.raises(ValueError, match="weight: expected 10 columns"):
        choice_logprobs_from_hidden(torch.randn(2, 10), torch.randn(5, 4), ids)


def test_pack_label_ids_pads_ragged_rows():
    packed = pack_label_ids([[[1, 2], [3]], [[4]]])
    assert packed.tolist() == [[[1, 2], [3, -1]], [[4, -1], [-1, -1]]]


def test_label_token_ids_spellings_and_vocab_pieces():
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rcn_fast.llm.scoring.choice import label_token_ids

    # a SentencePiece-style (Metaspace) tokenizer: "A" and " A" both encode to "▁A"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(["Answer: A B C", "A cat. B is C."] * 20,
                            trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"], show_progress=False))
    sp = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")
    vocab = sp.get_vocab()
    assert sp.encode("A", add_special_tokens=False) == sp.encode(" A", add_special_tokens=False) == [vocab["\u2581A"]]
    assert label_token_ids(sp, ["A"], vocab_pieces=False) == [[vocab["\u2581A"]]]
    assert sorted(label_token_ids(sp, ["A", "B"])[0]) == sorted([vocab["A"], vocab["\u2581A"]])
    # custom spellings: only their own pieces
    assert label_token_ids(sp, ["A"], spellings=("{}",), vocab_pieces=True)[0] == [vocab["\u2581A"], vocab["A"]]
    with pytest.raises(ValueError, match="not a single token"):
        label_token_ids(sp, ["Answer: A"])
