"""The eval summary table's caption (sinklens/eval/summary.py) names what was set, never `None`."""
from sinklens.eval.summary import _caption


def test_caption_has_no_unset_values():
    rows = [{"task": "gsm8k", "model": "tiny-dlm", "mask_topk": 0, "control": None, "masking": {},
             "sampler_settings": {"steps": 4, "threshold": None, "block_length": 8}},
            {"task": "gsm8k", "model": "tiny-dlm", "mask_topk": 2, "control": None,
             "masking": {"ranking": "score", "threshold": None, "keep_self": False, "sink_eps": None},
             "sampler_settings": {"steps": 4, "threshold": None, "block_length": 8}}]
    text = _caption(rows, [])
    assert "None" not in text
    assert "steps=4" in text and "block_length=8" in text and "ranking=score" in text and "keep_self=False" in text
