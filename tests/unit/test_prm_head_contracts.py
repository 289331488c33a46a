"""The PRM head's feature path (tentalis_pipelines/reviewers/prm_head.py) on a stand-in trunk, from its
docstrings: a character tokenizer and a toy base model whose block ``k`` hidden state at position ``t``
is ``[id_t * (k + 1), t]``, so every feature, pooling, layer stack, padding and surprise is known by hand
(a unit test builds no model). Also ``load_trunk``'s cut over a stand-in causal LM, and the steps'
tokenisation at its limits. Written from the mutmut target ``prm_head``'s survivors
(tools/mutants/reports/prm_head.md)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from tentalis_pipelines.reviewers import prm_head as ph


class CharTokenizer:
    """One token per character (its code point)."""

    def __init__(self, pad_token_id=None):
        self.pad_token_id = pad_token_id

    def __call__(self, text, add_special_tokens=True):
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class ToyBase(nn.Module):
    """Block ``k``'s hidden state at position ``t`` is ``[id_t * (k + 1), t]`` (``k = 0``: the embeddings)."""

    def __init__(self, depth: int):
        super().__init__()
        self.config = SimpleNamespace(hidden_size=2, num_hidden_layers=depth)
        self.layers = nn.ModuleList(nn.Linear(1, 1) for _ in range(depth))
        self.norm = nn.LayerNorm(2)
        self.calls: list[tuple[torch.Tensor, torch.Tensor, bool]] = []

    def forward(self, input_ids, attention_mask, output_hidden_states=False):
        self.calls.append((input_ids.clone(), attention_mask.clone(), output_hidden_states))
        ids = input_ids.float()
        pos = torch.arange(ids.shape[1], dtype=torch.float32).expand_as(ids)
        hs = tuple(torch.stack([ids * (k + 1), pos], -1) for k in range(len(self.layers) + 1))
        return SimpleNamespace(last_hidden_state=hs[-1], hidden_states=hs if output_hidden_states else None)


def toy_head(hidden):
    """Logits over 128 code points: every token 0 but "1", whose logit is the position."""
    logits = torch.zeros(hidden.shape[0], 128)
    logits[:, ord("1")] = hidden[:, 1]
    return logits


def trunk(layer: int = 2, *, full: bool = False, pad=None) -> ph.Trunk:
    return ph.Trunk(ToyBase(layer + 1 if full else layer), CharTokenizer(pad), layer, torch.device("cpu"), torch.float32,
                    lm_head=toy_head if full else None)


def h(ids: list[int], k: int, t: int) -> list[float]:
    return [ids[t] * (k + 1), t]


def test_tokenize_keeps_whole_steps_within_the_limit():
    ids, spans = ph.tokenize_solution_spans(CharTokenizer(), "ab", ["c", "de"], 9)
    assert ids == [ord(c) for c in "ab\n\nc\n\nde"] and spans == [(2, 4), (5, 8)]
    assert ph.tokenize_solution(CharTokenizer(), "ab", ["c", "de"], 9) == (ids, [4, 8])
    # One token short: the second step would end past the limit, so it and every later one are cut.
    assert ph.tokenize_solution_spans(CharTokenizer(), "ab", ["c", "de", "f"], 8) == (ids[:5], [(2, 4)])
    # The problem takes at most half the limit.
    assert ph.tokenize_solution(CharTokenizer(), "abcdefgh", ["x"], 9) == ([ord(c) for c in "abcd\n\nx"], [6])
    assert ph.tokenize_solution(CharTokenizer(), "ab", [], 9) == ([97, 98], [])


def test_step_features_pool_the_trunks_last_block_per_step_in_input_order():
    tr = trunk(2)
    sols = [("abc", ["d", "ef"]), ("a", ["b"]), ("xy", [])]
    ids0 = [ord(c) for c in "abc\n\nd\n\nef"]
    ids1 = [ord(c) for c in "a\n\nb"]
    last = ph.step_features(tr, sols)
    assert [f.dtype for f in last] == [np.float32] * 3
    np.testing.assert_allclose(last[0], [h(ids0, 2, 5), h(ids0, 2, 9)])
    np.testing.assert_allclose(last[1], [h(ids1, 2, 3)])
    assert last[2].shape == (0, 2)  # no step: an empty [0, dim]
    mean = ph.step_features(tr, sols, pooling="mean")
    np.testing.assert_allclose(mean[0], [np.mean([h(ids0, 2, t) for t in range(3, 6)], 0),
                                         np.mean([h(ids0, 2, t) for t in range(6, 10)], 0)])
    both = ph.step_features(tr, sols, pooling="last+mean")
    np.testing.assert_allclose(both[0], np.concatenate([last[0], mean[0]], 1))
    assert both[2].shape == (0, 4)


def test_solutions_are_batched_by_length_with_right_padding_and_the_same_features():
    sols = [("abcdef", ["g"]), ("a", ["b"]), ("abc", ["d"])]
    for pad, want_pad in ((None, 0), (7, 7)):
        tr = trunk(2, pad=pad)
        one_batch = ph.step_features(tr, sols)
        ((ids, mask, _),) = tr.model.calls
        lengths = [4, 6, 9]  # shortest first
        assert ids.shape == (3, 9) and mask.tolist() == [[1] * n + [0] * (9 - n) for n in lengths]
        assert ids[0, 4:].tolist() == [want_pad] * 5 and ids[0, :4].tolist() == [ord(c) for c in "a\n\nb"]
        tr.model.calls.clear()
        # 9 tokens a batch at most: 4 + 6 fit as two rows of 6 (12 > 9: no), so every solution runs alone.
        alone = ph.step_features(tr, sols, batch_tokens=9)
        assert [c[0].shape for c in tr.model.calls] == [(1, 4), (1, 6), (1, 9)]
        for a, b in zip(one_batch, alone):
            np.testing.assert_allclose(a, b)
    tr = trunk(2)
    ph.step_features(tr, sols, batch_tokens=12)  # two rows of 6 fit exactly: 12 <= 12
    assert [c[0].shape for c in tr.model.calls] == [(2, 6), (1, 9)]


def test_several_layers_come_from_one_pass():
    tr = trunk(3)
    ids = [ord(c) for c in "ab\n\nc"]
    (f,) = ph.step_features(tr, [("ab", ["c"])], layers=[1, 3])
    assert f.shape == (1, 2, 2) and tr.model.calls[0][2] is True
    np.testing.assert_allclose(f[0], [h(ids, 1, 4), h(ids, 3, 4)])
    (empty,) = ph.step_features(tr, [("ab", [])], layers=[1, 3], pooling="last+mean")
    assert empty.shape == (0, 2, 4) and empty.dtype == np.float32
    assert ph.step_features(tr, [("ab", ["c"])])[0].shape == (1, 2) and tr.model.calls[-1][2] is False


def test_step_features_refuse_what_the_trunk_cannot_give():
    tr = trunk(2)
    for layers in ([0, 2], [1, 3]):
        with pytest.raises(ValueError, match=r"must lie in 1\.\.2"):
            ph.step_features(tr, [("a", ["b"])], layers=layers)
    ph.step_features(tr, [("a", ["b"])], layers=[1, 2])  # both ends allowed
    with pytest.raises(ValueError, match="pooling 'max' is not one of"):
        ph.step_features(tr, [("a", ["b"])], pooling="max")
    with pytest.raises(ValueError, match="load_trunk\\(..., full=True\\)"):
        ph.step_features_and_surprise(tr, [("a", ["b"])], surprise=True)
    assert ph.step_features_and_surprise(tr, [("a", ["b"])])[1] is None


def _hand_surprise(ids, spans):
    lp = [0.0]
    for t in range(1, len(ids)):
        logits = [0.0] * 128
        logits[ord("1")] = float(t - 1)  # the head reads position t - 1 to predict token t
        lse = math.log(sum(math.exp(x) for x in logits))
        lp.append(logits[ids[t]] - lse)
    rows = []
    for a, b in spans:
        seg = lp[a: b + 1]
        dig = [lp[j] for j in range(a, b + 1) if chr(ids[j]).isdigit()] or seg
        rows.append([sum(seg) / len(seg), min(seg), sum(dig) / len(dig), min(dig)])
    return rows


def test_a_full_trunk_reads_its_block_and_gives_each_steps_surprise():
    tr = trunk(2, full=True)  # three blocks run; the features still come from block 2
    sols = [("a1", ["b1", "c"]), ("a", ["1", "2x1"])]
    feats, surprise = ph.step_features_and_surprise(tr, sols, surprise=True)
    for (problem, steps), f, s in zip(sols, feats, surprise):
        ids, spans = ph.tokenize_solution_spans(tr.tokenizer, problem, steps, 1024)
        np.testing.assert_allclose(f, [h(ids, 2, b) for _, b in spans])
        np.testing.assert_allclose(s, _hand_surprise(ids, spans), rtol=1e-5, atol=1e-5)
    assert tr.digit_tokens[ord("1")] is True and tr.digit_tokens[ord("c")] is False
    assert ph.step_features_and_surprise(tr, [("a", [])], surprise=True)[1][0].shape == (0, 4)


def test_step_surprise_by_hand():
    lp = torch.tensor([0.0, -1.0, -3.0, -2.0, -5.0])
    digit = [False, False, True, False, False]
    got = ph.step_surprise(lp, [(1, 3), (3, 4)], digit)
    assert got.tolist() == [[-2.0, -3.0, -3.0, -3.0], [-3.5, -5.0, -3.5, -5.0]]  # no digit: the whole span
    assert ph.step_surprise(lp, [], digit).shape == (0, len(ph.SURPRISE_FEATURES))


def test_head_features_pass_the_configs_limit_layers_and_pooling():
    tr = trunk(3)
    sols = [("ab", ["cd", "ef", "gh"])]
    cfg = ph.HeadConfig(layer=3, layers=(1, 3), pooling="mean", max_tokens=10)  # the third step would end at 13
    (got,) = ph.head_features(tr, sols, cfg)
    (want,) = ph.step_features(tr, sols, max_tokens=10, layers=[1, 3], pooling="mean")
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got, want.reshape(2, 4))


def test_step_features_defaults_keep_1024_tokens_and_batch_4096():
    tr = trunk(1)
    (kept,) = ph.step_features(tr, [("p" * 500, ["s" * 522])])  # ends at token 1024 exactly
    (cut,) = ph.step_features(tr, [("p" * 500, ["s" * 523])])
    assert (len(kept), len(cut)) == (1, 0)
    tr.model.calls.clear()
    ph.step_features(tr, [("p" * 238, ["x"])] * 17)  # 17 rows of 241 tokens: 4097 > 4096
    assert [c[0].shape[0] for c in tr.model.calls] == [16, 1]
    tr.model.calls.clear()
    ph.step_features(tr, [("p" * 238, ["x"])] * 17, max_tokens=1024, batch_tokens=4097)
    assert [c[0].shape[0] for c in tr.model.calls] == [17]


@pytest.mark.parametrize("features", ["hidden", "surprise", "hidden+surprise"])
def test_head_features_read_what_the_config_names(features):
    tr = trunk(2, full=features != "hidden")
    sols = [("a1", ["b1", "c"]), ("a", [])]
    cfg = ph.HeadConfig(layer=2, pooling="last", center=True, features=features)
    got = ph.head_features(tr, sols, cfg)
    feats, surprise = ph.step_features_and_surprise(tr, sols, layers=[2], pooling="last", surprise=cfg.surprise)
    hidden = [ph.shape_features(f, True) for f in feats]
    want = {"hidden": hidden, "surprise": surprise,
            "hidden+surprise": [np.concatenate([a, b], 1) for a, b in zip(hidden, surprise or [])]}[features]
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape[1] == ph.feature_dim(cfg, 2)
        np.testing.assert_allclose(g, w, rtol=1e-6)


class _Moved(nn.Linear):
    """A layer that records where it was moved."""

    def to(self, *args, **kwargs):
        self.moved_to = args
        return super().to(*args, **kwargs)


class _ToyLM:
    def __init__(self, depth):
        self.model = ToyBase(depth)
        self.model.to = lambda *args: (setattr(self.model, "moved_to", args), nn.Module.to(self.model, *args))[1]
        self.lm_head = _Moved(2, 128)


def test_load_trunk_cuts_the_model_after_its_layer_or_keeps_it_whole(monkeypatch, tmp_path):
    import transformers

    made = []

    def fake_lm(path, dtype=None):
        made.append((path, dtype))
        return _ToyLM(4)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_lm)
    tokenizers = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: tokenizers.append(path) or CharTokenizer())
    resolved = []
    real_dtype = ph.resolve_dtype
    monkeypatch.setattr(ph, "resolve_dtype", lambda dtype, device: resolved.append((dtype, device)) or real_dtype(dtype, device))
    folder = tmp_path / "SmolLM2-135M"
    tr = ph.load_trunk(folder, 2, device="cpu", dtype="float32")
    assert made == [(str(folder), torch.float32)] and tokenizers == [str(folder)] and isinstance(tr.tokenizer, CharTokenizer)
    assert resolved == [("float32", torch.device("cpu"))] and tr.model.moved_to == (torch.device("cpu"),)
    assert (tr.layer, tr.name, tr.device, tr.dtype, tr.lm_head) == (2, "SmolLM2-135M", torch.device("cpu"), torch.float32, None)
    assert len(tr.model.layers) == 2 and tr.model.config.num_hidden_layers == 2 and isinstance(tr.model.norm, nn.Identity)
    assert not tr.model.training and not any(p.requires_grad for p in tr.model.parameters())
    full = ph.load_trunk(folder, 4, device="cpu", dtype="float32", full=True)
    assert len(full.model.layers) == 4 and isinstance(full.model.norm, nn.LayerNorm) and full.model.config.num_hidden_layers == 4
    assert isinstance(full.lm_head, nn.Linear) and not full.lm_head.training and full.lm_head.moved_to == (torch.device("cpu"),)
    auto = ph.load_trunk(folder, 2)  # the defaults: the best device here and its dtype
    assert auto.device == ph.resolve_device("auto") and resolved[-1] == ("auto", auto.device)
    assert not any(p.requires_grad for p in full.lm_head.parameters())
    assert ph.load_trunk(folder, 1, device="cpu", dtype="float32").layer == 1  # both ends of 1..depth
    for bad in (0, 5):
        with pytest.raises(ValueError, match=rf"layer {bad} is outside the model's 1\.\.4 blocks"):
            ph.load_trunk(folder, bad, device="cpu", dtype="float32")


# ------------------------------------------------------------------------------------------ the head
def test_the_head_standardises_then_maps_to_one_logit():
    head = ph.PRMHead(2)
    assert set(head.state_dict()) == {"mean", "scale", "net.weight", "net.bias"}
    assert head.mean.tolist() == [0.0, 0.0] and head.scale.tolist() == [1.0, 1.0]
    assert isinstance(ph.PRMHead(2, hidden=-1).net, nn.Linear) and head.dropout.p == 0.0
    one = ph.PRMHead(2, hidden=1)  # one hidden unit is a hidden layer too
    assert isinstance(one.net, nn.Sequential) and one.net[0].weight.shape == (1, 2)
    assert one.eval()(torch.ones(2)).shape == ()
    with torch.no_grad():
        head.mean.copy_(torch.tensor([1.0, 2.0]))
        head.scale.copy_(torch.tensor([2.0, 4.0]))
        head.net.weight.copy_(torch.tensor([[1.0, -1.0]]))
        head.net.bias.fill_(0.5)
        x = torch.tensor([[3.0, 6.0], [1.0, 2.0], [5.0, 2.0]])
        assert head(x).tolist() == [0.5, 0.5, 2.5]  # ((x - mean) / scale) . w + b
        assert head(x[2]).shape == () and float(head(x[2])) == 2.5  # one step: one logit


def test_a_hidden_layer_head_keeps_its_layout_and_drops_out_while_training():
    head = ph.PRMHead(3, hidden=4, dropout=1.0)
    assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == {
        "mean": (3,), "scale": (3,), "net.0.weight": (4, 3), "net.0.bias": (4,), "net.2.weight": (1, 4), "net.2.bias": (1,)}
    assert isinstance(head.net[1], nn.GELU) and head.dropout.p == 1.0
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0], [2.0, 2.0, 2.0]])
    with torch.no_grad():
        head.mean.copy_(torch.tensor([0.5, 0.0, 1.0]))
        head.scale.copy_(torch.tensor([2.0, 1.0, 0.5]))
        head.eval()
        z = (x - head.mean) / head.scale
        want = (torch.nn.functional.gelu(z @ head.net[0].weight.T + head.net[0].bias) @ head.net[2].weight.T + head.net[2].bias)[:, 0]
        got = head(x)
        assert got.shape == (3,) and torch.allclose(got, want)
        head.train()  # everything dropped: the output layer's bias alone
        assert head(x).tolist() == [float(head.net[2].bias)] * 3


def _cfg(**kw):
    return ph.HeadConfig(**{"epochs": 120, "lr": 0.1, "weight_decay": 0.0, **kw})


def _p(head, x):
    with torch.no_grad():
        return torch.sigmoid(head(torch.as_tensor(x))).tolist()


def test_train_head_balances_the_classes_on_weighted_counts():
    x = np.ones((4, 2), np.float32)  # no information: the head learns the (weighted) base rate
    y = np.array([1, 1, 1, 0])
    assert _p(ph.train_head(x, y, _cfg(balance=False)), x[:1]) == pytest.approx([0.75], abs=0.01)
    assert _p(ph.train_head(x, y, _cfg()), x[:1]) == pytest.approx([0.5], abs=0.01)
    w = np.array([1, 1, 1, 3], np.float32)
    assert _p(ph.train_head(x, y, _cfg(balance=False), w), x[:1]) == pytest.approx([0.5], abs=0.01)
    assert _p(ph.train_head(x, np.array([1, 0, 0, 0]), _cfg()), x[:1]) == pytest.approx([0.5], abs=0.01)  # one positive
    assert _p(ph.train_head(x, np.zeros(4), _cfg()), x[:1])[0] < 0.05  # one class only: no balancing by 0
    assert _p(ph.train_head(x, np.ones(4), _cfg()), x[:1])[0] > 0.95


def test_train_head_standardises_is_seeded_and_weights_scale_free():
    x = np.array([[0.0, 5.0], [2.0, 5.0], [4.0, 5.0], [6.0, 5.0]], np.float32)
    y = np.array([0, 0, 1, 1])
    cfg = ph.HeadConfig(epochs=20, hidden=3, dropout=0.0, seed=3)
    head = ph.train_head(x, y, cfg)
    assert not head.training and head.net[0].weight.shape == (3, 2)
    assert head.mean.tolist() == [3.0, 5.0] and head.scale.tolist() == pytest.approx([float(np.std(x[:, 0], ddof=1)), 1e-4])
    again = ph.train_head(x, y, cfg)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))
    twice = ph.train_head(x, y, cfg, np.full(4, 2.0, np.float32))  # weights all 2: the same loss as all 1, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), twice.state_dict().values()))
    w = np.array([1.0, 0.3, 2.0, 0.7])
    narrow = ph.train_head(x, y, cfg, w.astype(np.float32))
    wide = ph.train_head(x.astype(np.float64), y, cfg, w)  # float64 inputs: the same float32 training
    assert all(torch.equal(a, b) for a, b in zip(narrow.state_dict().values(), wide.state_dict().values()))
    decayed = ph.train_head(x, y, ph.HeadConfig(epochs=20, hidden=3, seed=3, weight_decay=0.0))
    assert not torch.equal(head.net[0].weight, decayed.net[0].weight)  # weight_decay reaches the optimiser
    other = ph.train_head(x, y, ph.HeadConfig(epochs=20, hidden=3, seed=4))
    assert not torch.equal(head.net[0].weight, other.net[0].weight)
    torch.manual_seed(3)
    untrained = ph.PRMHead(2, 3, 0.25)
    kept = ph.train_head(x, y, ph.HeadConfig(epochs=0, hidden=3, dropout=0.25, seed=3))
    assert torch.equal(kept.net[0].weight, untrained.net[0].weight) and kept.dropout.p == 0.25


def test_train_head_refuses_what_it_cannot_learn_from():
    x = np.zeros((3, 2), np.float32)
    for feats, labels in ((np.zeros(3), [0, 1, 0]), (x, [0, 1]), (np.zeros((0, 2)), [])):
        with pytest.raises(ValueError, match="train_head needs features"):
            ph.train_head(feats, np.asarray(labels), ph.HeadConfig())
    with pytest.raises(ValueError, match=r"^PRM labels must be 0 \(wrong\) or 1 \(correct\)$"):
        ph.train_head(x, np.array([0, 2, 1]), ph.HeadConfig())
    for w in ([1, 1], [1, -1, 1], [1, float("nan"), 1], [0, 0, 0]):
        with pytest.raises(ValueError, match="weights must be 3 finite non-negative numbers"):
            ph.train_head(x, np.array([0, 1, 0]), ph.HeadConfig(epochs=1), np.asarray(w, np.float32))
    ph.train_head(x, np.array([0, 1, 0]), ph.HeadConfig(epochs=1), np.array([0, 1, 0], np.float32))  # some zeros: fine


class _NotWeights(dict):
    """A state dict that is not plain weights: loading it would run this module's code."""


def test_a_checkpoint_refuses_a_head_file_that_is_not_plain_weights(tmp_path):
    folder = ph.HeadCheckpoint(ph.PRMHead(3), ph.HeadConfig(), 0.5, "m").save(tmp_path / "v")
    torch.save(_NotWeights(torch.load(folder / "head.pt")), folder / "head.pt")
    with pytest.raises(Exception, match="(?i)weights only|weights_only"):
        ph.HeadCheckpoint.load(folder)


def test_a_checkpoint_manifest_is_readable_and_saving_again_overwrites(tmp_path):
    import datetime as dt

    when = dt.datetime(2026, 12, 7, 12, 0)
    ck = ph.HeadCheckpoint(ph.PRMHead(2), ph.HeadConfig(), 0.5, "m", {"trained_at": when})
    folder = ck.save(tmp_path / "v")
    text = (folder / "manifest.json").read_text()
    meta = __import__("json").loads(text)
    assert meta["trained_at"] == str(when)  # what JSON cannot hold is written as its text
    assert text == __import__("json").dumps(meta, indent=2, sort_keys=True)  # indented, keys sorted: diffs stay small
    ck.threshold = 0.25
    assert ph.HeadCheckpoint.load(ck.save(folder)).threshold == 0.25


def test_a_checkpoint_round_trips_through_its_folder(tmp_path):
    head = ph.PRMHead(3, hidden=2, dropout=0.3)
    cfg = ph.HeadConfig(layer=6, hidden=2, dropout=0.3, pooling="last+mean", rule="drop", drop=0.2, center=True)
    ck = ph.HeadCheckpoint(head, cfg, 0.375, "SmolLM2", {"labels": "v3", "f1": 0.5})
    folder = ck.save(tmp_path / "heads" / "v1")
    assert folder == tmp_path / "heads" / "v1" and {p.name for p in folder.iterdir()} == {"head.pt", "manifest.json"}
    meta = __import__("json").loads((folder / "manifest.json").read_text())
    assert (meta["threshold"], meta["base_model"], meta["dim"], meta["labels"], meta["f1"]) == (0.375, "SmolLM2", 3, "v3", 0.5)
    back = ph.HeadCheckpoint.load(folder)
    assert (back.config, back.threshold, back.base_model, back.manifest) == (cfg, 0.375, "SmolLM2", {"labels": "v3", "f1": 0.5})
    assert not back.head.training and back.head.dropout.p == 0.3
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), back.head.state_dict().values()))
    assert back.rule == ph.DecisionRule("drop", 0.375, 0.2)


# ------------------------------------------------------------------------------------------ decisions
def test_choose_threshold_takes_midpoints_and_ends_with_ties_to_the_lowest():
    # sol 0 errs at step 1, sol 1 is correct: any threshold in (0.2, 0.6] is perfect; the midpoint 0.4 is the first.
    assert ph.choose_threshold([[0.9, 0.2], [0.8, 0.6]], [1, -1]) == (pytest.approx(0.4), 1.0)
    # Only the top end makes both first steps errors while the correct solution stays correct? No: the
    # correct one has no step at all, so every threshold keeps it; the top end catches both first steps.
    t, f1 = ph.choose_threshold([[0.5], [0.7], []], [0, 0, -1])
    assert f1 == 1.0 and t == pytest.approx(0.7 + 1e-6, abs=1e-9)
    # Every solution correct at any threshold below every score: the bottom end, exactly.
    t, f1 = ph.choose_threshold([[0.5, 0.6], [0.3]], [-1, 0])
    assert f1 == 1.0 and 0.3 < t <= 0.5 and t == pytest.approx(0.4)
    t, f1 = ph.choose_threshold([[0.5, 0.6], [0.7]], [-1, -1])  # no erroneous solution: F1 undefined, lowest kept
    assert t == pytest.approx(0.5 - 1e-6, abs=1e-9) and f1 == 0.0
    with pytest.raises(ValueError, match="^choose_threshold needs at least one scored step$"):
        ph.choose_threshold([[], []], [-1, 0])


def test_choose_threshold_with_calculator_flags_counts_a_flagged_step_as_an_error():
    scores, labels = [[0.9, 0.8], [0.9, 0.8]], [1, -1]
    assert ph.choose_threshold(scores, labels)[1] < 1.0  # the scores alone cannot tell them apart
    t, f1 = ph.choose_threshold(scores, labels, flags=[[False, True], [False, False]])
    assert f1 == 1.0 and t == pytest.approx(0.8 - 1e-6, abs=1e-9)


def test_first_error_with_flags_reads_past_either_list():
    assert ph.first_error_with_flags([0.9, 0.9], 0.5, [False, False, True]) == 2  # a flag past the scores
    assert ph.first_error_with_flags([0.9, 0.9, 0.1], 0.5, [False]) == 2  # a score past the flags
    assert ph.first_error_with_flags([0.5, None, 0.9], 0.5, [False, False]) == -1  # at the threshold: not an error
    assert ph.first_error_with_flags([None, 0.4], 0.5, []) == 1
    assert ph.first_error_with_flags([], 0.5, []) == -1


def test_decision_rules_at_their_edges():
    assert ph.DecisionRule("threshold", 0.5, drop=0.1).predict([0.9, 0.7]) == -1  # the drop is not this rule's
    assert ph.DecisionRule("argmin", 0.5).predict([0.9, 0.5, 0.7]) == -1  # its lowest at the threshold: none
    assert ph.DecisionRule("argmin", 0.5).predict([0.9, 0.4, None, 0.3]) == 3
    assert ph.DecisionRule("drop", 0.5, 0.25).predict([0.75, 0.5]) == -1  # at the threshold, exactly the drop: no
    assert ph.DecisionRule("drop", 0.5, 0.25).predict([0.75, 0.4375]) == 1  # below the threshold
    assert ph.DecisionRule("drop", 0.125, 0.25).predict([0.75, 0.5, 0.75, None, 0.375]) == 4  # 0.375 < 2/3 - 0.25


def test_choose_rule_by_kind_with_ties_to_the_first():
    scores, labels = [[0.9, 0.2], [0.8, 0.6]], [1, -1]
    rule, f1 = ph.choose_rule(scores, labels)
    assert rule == ph.DecisionRule("threshold", pytest.approx(0.4)) and f1 == 1.0
    rule, f1 = ph.choose_rule(scores, labels, "argmin")
    assert (rule.kind, rule.drop, f1) == ("argmin", 1.0, 1.0) and rule.threshold == pytest.approx(0.2 - 1e-6 + (0.4 - 0.2 + 1e-6) / 100 * 1, abs=0.01)
    rule, f1 = ph.choose_rule(scores, labels, "drop", drops=(0.3, 0.05))
    assert (rule.kind, rule.drop, f1) == ("drop", 0.3, 1.0)  # both drops reach 1.0: the first kept
    for kind in ("argmin", "drop"):
        with pytest.raises(ValueError, match="^choose_rule needs at least one scored step$"):
            ph.choose_rule([[]], [0], kind)


def test_the_calculator_flags_false_equations_only():
    flags = ph.calculator_flags("Tom has 3 bags of 4 apples.", ["\\(3 \\times 4 = 12\\)", "12 + 2 = 15", "So he is happy."])
    assert flags == [False, True, False]


def test_plain_arithmetic_unescapes_dollars_and_shape_features_are_float32():
    assert ph.plain_arithmetic("costs \\$5") == "costs $5"
    assert ph.shape_features(np.ones((2, 3), np.float64), False).dtype == np.float32
    got = ph.pool_steps(torch.arange(12.0).reshape(3, 2, 2), [(0, 1), (2, 2)], "last+mean")
    assert got.shape == (2, 2, 4)  # several layers: last and mean side by side per layer
    assert got[0, 0].tolist() == [4.0, 5.0, 2.0, 3.0]


def test_head_config_names_a_bad_feature_kind():
    with pytest.raises(ValueError, match="HeadConfig.features 'logits' is not one of"):
        ph.HeadConfig(features="logits")


def _steps_and_labels(n: int, errors_below: float):
    """``n`` one-step solutions scoring i/1000 (i = 1..n); those under ``errors_below`` err at step 0."""
    scores = [[i / 1000] for i in range(1, n + 1)]
    return scores, [0 if s[0] < errors_below else -1 for s in scores]


def _candidates(scores):
    v = sorted({s for ss in scores for s in ss})
    return [v[0] - 1e-6] + [(a + b) / 2 for a, b in zip(v, v[1:])] + [v[-1] + 1e-6]


def test_choose_threshold_tries_every_midpoint_up_to_400_candidates_then_401_quantiles():
    scores, labels = _steps_and_labels(399, 0.25)  # 400 candidates: all tried
    assert len(_candidates(scores)) == 400
    t, f1 = ph.choose_threshold(scores, labels)
    assert f1 == 1.0 and t == pytest.approx(0.2495, abs=1e-12)  # the midpoint between 0.249 and 0.250
    scores, labels = _steps_and_labels(500, 0.25)  # 501 candidates: 401 quantiles of them
    q = sorted(set(np.quantile(np.asarray(_candidates(scores)), np.linspace(0, 1, 401)).tolist()))
    t, f1 = ph.choose_threshold(scores, labels)
    assert f1 == 1.0 and t == min(x for x in q if 0.249 < x <= 0.25) and t != pytest.approx(0.2495, abs=1e-9)


def test_choose_rule_tries_101_quantiles_of_the_candidates():
    scores, labels = [[0.9, 0.2], [0.8, 0.6]], [1, -1]
    q = sorted(set(np.quantile(np.asarray(_candidates(scores)), np.linspace(0, 1, 101)).tolist()))
    rule, f1 = ph.choose_rule(scores, labels, "argmin")
    assert f1 == 1.0 and rule.threshold == min(x for x in q if x > 0.2)  # the first that catches 0.2 and spares 0.6
    top = [[0.5], [0.6], [0.7], []]  # every first step must be an error: only the top end, 1e-6 above 0.7, does it
    rule, f1 = ph.choose_rule(top, [0, 0, 0, -1], "drop", drops=(0.1,))
    assert (f1, rule.drop) == (1.0, 0.1) and rule.threshold == pytest.approx(0.7 + 1e-6, abs=1e-12)
    rule, f1 = ph.choose_rule([[0.5, 0.6], [0.7]], [-1, -1], "argmin")  # no erroneous solution: the lowest kept
    assert rule.threshold == pytest.approx(0.5 - 1e-6, abs=1e-12)


def test_feature_dim_by_hand():
    assert ph.feature_dim(ph.HeadConfig(layer=3, layers=(1, 3), pooling="last+mean"), 8) == 32
    assert ph.feature_dim(ph.HeadConfig(layer=3, pooling="mean"), 8) == 8
    assert ph.feature_dim(ph.HeadConfig(layer=3, layers=(1, 3), pooling="last+mean", features="hidden+surprise"), 8) == 36
    assert ph.feature_dim(ph.HeadConfig(layer=3, layers=(1, 3), features="surprise"), 8) == 4


def _oof_data():
    rng = np.random.default_rng(0)
    feats = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(6)]
    labels = [[1, int(i % 2)] for i in range(6)]
    return feats, labels, [f"p{i}" for i in range(6)]


def test_out_of_fold_scores_defaults_and_weights():
    feats, labels, groups = _oof_data()
    cfg = ph.HeadConfig(epochs=5)
    plain = ph.out_of_fold_scores(feats, labels, groups, cfg)
    assert plain == ph.out_of_fold_scores(feats, labels, groups, cfg, folds=5, seed=0, trains=[True] * 6, weights=[1.0] * 6)
    assert plain != ph.out_of_fold_scores(feats, labels, groups, cfg, folds=6)
    assert plain != ph.out_of_fold_scores(feats, labels, groups, cfg, seed=1)
    assert plain != ph.out_of_fold_scores(feats, labels, groups, cfg, weights=[1.0, 0.01, 1.0, 0.01, 1.0, 0.01])
    assert [len(s) for s in plain] == [2] * 6


def test_out_of_fold_scores_name_what_is_missing():
    feats, labels, groups = _oof_data()
    cfg = ph.HeadConfig(epochs=1)
    with pytest.raises(ValueError, match="needs one label list and one group per solution, got 6 features, 5 label lists, 6 groups"):
        ph.out_of_fold_scores(feats, labels[:5], groups, cfg)
    with pytest.raises(ValueError, match="needs one weight per solution, got 2 for 6"):
        ph.out_of_fold_scores(feats, labels, groups, cfg, weights=[1.0, 1.0])
    with pytest.raises(ValueError, match="fold 0 leaves no training solution"):
        ph.out_of_fold_scores(feats, labels, groups, cfg, trains=[False] * 6)
