"""The left-to-right reference likelihood (sinklens.eval.loglik.reference_loglik_l2r): one
definition for DLMs and ARMs. On an ARM it equals the teacher-forced probe (the same
quantity); on a DLM its pass i is prompt + ref_<i + masks, scored at position i."""
import pytest
import torch

import sinklens
from sinklens.eval.config import EvalConfig
from sinklens.eval.loglik import reference_loglik, reference_loglik_l2r
from sinklens.masking.config import MaskingConfig

torch.set_num_threads(1)
PROMPT, REF = [5, 9, 12, 7, 20], [14, 3, 17, 8]


@pytest.fixture(scope="module")
def arm():
    return sinklens.load("tiny-arm", dtype="float32")


@pytest.fixture(scope="module")
def dlm():
    return sinklens.load("tiny-dlm", dtype="float32")


def test_arm_l2r_equals_teacher_forcing(arm):
    off = MaskingConfig(mask_k=0)
    l2r, tf = reference_loglik_l2r(arm, PROMPT, REF, off), reference_loglik(arm, PROMPT, REF, off)
    assert l2r["unmasked"] == pytest.approx(tf["unmasked"], abs=1e-4)
    assert l2r["masked"] == l2r["unmasked"] and l2r["tokens"] == len(REF)


def test_dlm_l2r_is_the_chain_of_one_token_passes(dlm):
    """Recomputed here by hand: pass i = prompt + ref_<i + (R - i) masks, log-softmax at p + i."""
    want = 0.0
    for i in range(len(REF)):
        x = torch.tensor([PROMPT + REF[:i] + [dlm.mask_id] * (len(REF) - i)])
        logp = torch.log_softmax(dlm.forward_logits(x)[0, len(PROMPT) + i].double(), -1)
        want += float(logp[REF[i]])
    got = reference_loglik_l2r(dlm, PROMPT, REF, MaskingConfig(mask_k=0))
    assert got["unmasked"] == pytest.approx(want, abs=1e-4)
    # and it is not the fully masked probe (which hides ref_<i as well): the two differ
    assert got["unmasked"] != pytest.approx(reference_loglik(dlm, PROMPT, REF, MaskingConfig(mask_k=0))["unmasked"], abs=1e-3)


@pytest.mark.parametrize("name", ["arm", "dlm"])
def test_masking_the_sinks_moves_l2r(name, request):
    m = request.getfixturevalue(name)
    out = reference_loglik_l2r(m, PROMPT, REF, MaskingConfig(mask_k=1))
    assert out["masked"] != pytest.approx(out["unmasked"], abs=1e-4)


def test_l2r_needs_loglik(tmp_path):
    with pytest.raises(ValueError, match="--loglik-l2r .* --no-loglik"):
        EvalConfig(model="tiny-dlm", task="arith", out=str(tmp_path), loglik=False, loglik_l2r=True)


@pytest.mark.slow
def test_l2r_through_eval_and_summary(tmp_path):
    import csv

    from sinklens.eval import records
    from sinklens.eval.runner import run_eval
    from sinklens.eval.stats import mean_stderr
    dirs = run_eval(EvalConfig(model="tiny-arm", task="arith", out=str(tmp_path), limit=3, mask_topk=(0, 1),
                               loglik_l2r=True, progress=False))
    k1 = records.collect(dirs[-1])
    change = mean_stderr([(r["loglik_l2r"]["masked"] - r["loglik_l2r"]["unmasked"]) / r["loglik_l2r"]["tokens"]
                          for r in k1])
    rows = {r["row"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    assert float(rows["K=1 (ε0)"]["ll_l2r_change"]) == pytest.approx(change[0])
    assert float(rows["K=1 (ε0)"]["ll_l2r_change_se"]) == pytest.approx(change[1])
    assert float(rows["Unmasked"]["ll_l2r_change"]) == 0.0
    assert "l2r " in (tmp_path / "summary.md").read_text()
