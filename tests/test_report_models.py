"""`sinklens report` on traces of real models: SmolLM2-135M (ARM) and the official-format tiny LLaDA (DLM)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sinklens.analysis import analyze
from sinklens.cli import main

ARM_FIGURES = ["fig01_received_layer29_mean", "fig03_score_distribution", "fig04_attention_maps", "fig05_layer_head",
               "fig07_sink_positions", "fig10_eps_sweep",
               # causal model: the sink figures again with the causal baseline removed
               "fig05_layer_head_uniform_ratio", "fig07_sink_positions_uniform_ratio", "fig10_eps_sweep_uniform_ratio"]


@pytest.mark.slow
def test_report_on_real_smollm2_trace(smollm2, tmp_path):
    import torch

    from sinklens.samplers.capture import CaptureOptions

    torch.set_num_threads(1)
    ids = smollm2.apply_chat_template("Name three colours.")
    path = tmp_path / "smollm2.arrow"
    smollm2.generate(torch.tensor([ids]), max_new_tokens=4, trace=str(path),
                     capture=CaptureOptions(map_slices=((0, 0),)))
    out = tmp_path / "report"
    assert main(["report", str(path), "--out", str(out), "--quiet"]) == 0
    for name in ARM_FIGURES:
        assert (out / f"{name}.png").is_file() and (out / f"{name}.svg").is_file(), name
    assert (out / "table2_sink_tokens.csv").is_file() and (out / "table2_sink_tokens_uniform_ratio.md").is_file()
    s = json.loads((out / "summary.json").read_text())["traces"][0]
    assert s["causal"] is True and s["figures_skipped"] == {}
    # readouts it was not traced with are listed apart, with the flag that records them
    assert "--diagonal" in s["readouts_not_available"]["readout_diagonal_heads"]
    assert "no masked query rows" in s["readouts_not_available"]["readout_mask_ranking"]      # an ARM
    assert s["also"][0]["units"] == "uniform_ratio"
    assert any("sum one query row" in n for n in s["notes"])    # decode steps sum one query row
    # SmolLM2's known first-token sink (0.4-0.96 of attention at position 0) at the prefill step
    a = analyze(path)
    assert a.n_queries[0] == len(ids) and (a.n_queries[1:] == 1).all()
    assert (a.largest_pos[0] == 0).mean() > 0.5
    share0 = a.step_scores(0)[..., 0] / a.n_queries[0]             # (L, H) fraction of all attention on key 0
    assert 0.4 < float(np.median(share0)) < 0.96
    assert (out / "index.html").stat().st_size > 10_000


DLM_FIGURES = ["fig01_received_layer1_mean", "fig03_score_distribution", "fig04_attention_maps", "fig05_layer_head",
               "fig07_sink_positions", "fig10_eps_sweep"]


@pytest.mark.slow
def test_report_on_llada_fixture_trace(fixtures_dir, tmp_path):
    """A real DLM trace (the official-format tiny LLaDA checkpoint, LLaDA sampler with blocks):
    every DLM figure, blocks read from the sampler arguments, per-group attention used."""
    import torch

    import sinklens
    from sinklens.samplers.capture import CaptureOptions

    torch.set_num_threads(1)
    m = sinklens.load(str(fixtures_dir / "llada"))
    ids = torch.randint(0, 290, (1, 12), generator=torch.Generator().manual_seed(0))
    path = tmp_path / "llada.arrow"
    m.generate(ids, steps=8, gen_length=16, block_length=8, trace=str(path), capture=CaptureOptions(map_slices=((1, 0),)))
    out = tmp_path / "report"
    assert main(["report", str(path), "--out", str(out), "--quiet"]) == 0
    for name in DLM_FIGURES:
        assert (out / f"{name}.png").is_file() and (out / f"{name}.svg").is_file(), name
    assert not (out / "fig05_layer_head_uniform_ratio.png").exists()       # bidirectional: no second set
    a = analyze(path)
    assert (a.source.block_length, a.source.prompt_length, a.source.causal) == (8, 12, False)
    assert a.source.group_names == ("masked", "unmasked")
    # mask state fed to the model: all 16 generated positions at step 0, the last 2 at the last step (2 per step)
    assert (a.n_queries == 28).all() and a.is_masked[0, 12:].all() and a.is_masked[-1].sum() == 2
    s = json.loads((out / "summary.json").read_text())["traces"][0]
    assert s["masked_unmasked_splits"]["groups"] == ["masked", "unmasked"]
    assert s["units"] == "scaled_sum" and s["figures_skipped"] == {}
