"""What ships holds no machine's path, and the study's random-init control runs for every shipped
twin without its teacher.

A training config that recorded `init_from: /work/runs/...` made `sinklens replicate --study` exit 2
on every other machine: the control step validated the teacher's folder."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "sinklens"
# an absolute path into a machine's own folders (a user's home, a scratch or work area)
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root|home|tmp|Users|mnt|scratch)/[\w.-]")
TWINS = sorted(p.parent.parent for p in (PKG / "assets").glob("*/training/train_config.json"))


def shipped_files() -> list[Path]:
    """The package (code and data), the docs, the README and the tests' fixture files."""
    files = [REPO / "README.md"] + [p for root in (PKG, REPO / "docs") for p in root.rglob("*") if p.is_file()]
    files += [p for p in (REPO / "tests").rglob("*") if p.is_file() and p.suffix != ".py"]
    return [p for p in files if "__pycache__" not in p.parts]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None                     # weights, images, traces
    return data.decode("utf-8", "replace")


def test_no_shipped_file_holds_a_machine_path():
    hits = []
    for path in shipped_files():
        text = _text(path)
        for m in MACHINE_PATH.finditer(text or ""):
            line = text[:m.start()].count("\n") + 1
            hits.append(f"{path.relative_to(REPO)}:{line}: {text.splitlines()[line - 1].strip()[:120]}")
    assert hits == [], "\n".join(hits)


def test_the_scan_finds_a_machine_path(tmp_path):
    """The pattern catches what it is for, and not a relative folder or a URL."""
    assert MACHINE_PATH.search('"init_from": "/work/runs/story9-arm-4l"')
    assert MACHINE_PATH.search("--out /tmp/evreal") and MACHINE_PATH.search("cd /home/me/x")
    assert not MACHINE_PATH.search('"out": "runs/story9-arm-4l"')
    assert not MACHINE_PATH.search("https://example.org/home/page and sinklens/assets/tiny-dlm")


def test_twins_name_their_teacher_portably():
    assert {t.name for t in TWINS} >= {"tiny-dlm", "tiny-arm", "story9-dlmarm-4l"}
    from sinklens.train.config import TrainConfig
    for twin in TWINS:
        conf = json.loads((twin / "training" / "train_config.json").read_text())
        assert conf.get("init_from", "") in ["", *(t.name for t in TWINS)], (twin.name, conf.get("init_from"))
        TrainConfig.from_dict(conf)        # valid here, as on any machine with the package
    assert json.loads((PKG / "assets" / "story9-dlmarm-4l" / "training" / "train_config.json").read_text())[
        "init_from"] == "story9-arm-4l"


@pytest.mark.parametrize("twin", TWINS, ids=[t.name for t in TWINS])
def test_study_random_control_runs_for_every_shipped_twin(twin, tmp_path):
    """`sinklens study`'s control step for each twin: the twin loaded with `random_init` (its shape
    and format, every weight re-initialised), traced on one held-out problem by the study's own path,
    even with the training config pointing at a teacher that is not on this machine; the trace
    records that it is the control."""
    from sinklens.experiments.demo_model import DemoModel
    from sinklens.experiments.replicate import trace_problems
    from sinklens.experiments.study import CONTROL_SEED, LOAD, sampler_kwargs, twin_files
    from sinklens.trace.reader import open_trace
    from sinklens.train.data import DataConfig, generate

    folder, conf = twin_files(twin.name)
    conf = {**conf, "init_from": "/nonexistent/teacher-run"}
    problem = generate(1, seed=0, split="heldout", cfg=DataConfig(**conf["data"]))
    # the sampler settings the study traces the control with, 16 new tokens in one block (fast)
    kwargs = {k: 16 if k in ("gen_length", "max_new_tokens", "steps", "block_length") else v
              for k, v in sampler_kwargs(conf).items()}
    control = DemoModel(str(folder), "control", kwargs, {**LOAD, "random_init": CONTROL_SEED})
    paths, _ = trace_problems(control, problem, tmp_path, progress=False)
    assert len(paths) == 1 and open_trace(str(paths[0])).meta["model"]["random_init"] == CONTROL_SEED


def test_ship_records_no_machine_path(tmp_path):
    """`ship` writes the run folder relative to its parent and the teacher by its twin's name; a
    teacher given only as a path is refused rather than shipped."""
    from sinklens.train.ship import ship
    run = tmp_path / "runs" / "student"
    (run / "export").mkdir(parents=True)
    (run / "ckpt").mkdir()
    (run / "export" / "model.safetensors").write_bytes(b"weights")
    (run / "ckpt" / "state.json").write_text(json.dumps({"step": 2, "tokens": 10}))
    (run / "log.jsonl").write_text("{}\n")
    (run / "curves.png").write_bytes(b"png")
    teacher_run = tmp_path / "runs" / "teacher"
    (run / "config.json").write_text(json.dumps({"kind": "dlm-shift", "init_from": str(teacher_run), "out": str(run)}))
    (run / "command.txt").write_text(f"# from step 0\nsinklens train --init-from {teacher_run} --out {run}\n")
    with pytest.raises(ValueError, match="name the shipped twin"):
        ship(run, "student", tmp_path / "assets")
    dest = ship(run, "student", tmp_path / "assets", teacher="story9-arm-4l")
    conf = json.loads((dest / "training" / "train_config.json").read_text())
    assert conf["init_from"] == "story9-arm-4l" and conf["out"] == "runs/student"
    command = (dest / "training" / "command.txt").read_text()
    assert "--init-from runs/teacher --out runs/student" in command
    assert not [m for p in dest.rglob("*") if p.is_file() for m in MACHINE_PATH.finditer(_text(p) or "")]


def test_ship_a_chain_of_stages_records_every_stage(tmp_path):
    """A twin trained in stages (each run started from the one before, the first from a shipped twin):
    the shipped command holds every stage's command in order, each stage's log and config are kept,
    the steps and tokens are summed over the chain, and no machine path is shipped."""
    from sinklens.train.ship import ship

    runs = tmp_path / "runs"
    names, start = ["a", "b", "c"], runs / "teacher"
    for i, n in enumerate(names):
        run = runs / n
        (run / "export").mkdir(parents=True)
        (run / "ckpt").mkdir()
        (run / "export" / "model.safetensors").write_bytes(b"weights")
        (run / "ckpt" / "state.json").write_text(json.dumps({"step": 10 * (i + 1), "tokens": 100 * (i + 1)}))
        (run / "log.jsonl").write_text(json.dumps({"step": i}) + "\n")
        (run / "curves.png").write_bytes(b"png")
        parent = start if i == 0 else runs / names[i - 1]
        (run / "config.json").write_text(json.dumps({"kind": "dual", "init_from": str(parent), "out": str(run)}))
        (run / "command.txt").write_text(f"sinklens train --init-from {parent} --out {run}")
    dest = ship(runs / "c", "student", tmp_path / "assets", teacher="tiny-dual", stages=[runs / "a", runs / "b"])
    prov = dest / "training"
    assert (prov / "command.txt").read_text() == (
        "# stage 1 of 3: runs/a\nsinklens train --init-from runs/teacher --out runs/a\n"
        "# stage 2 of 3: runs/b\nsinklens train --init-from runs/a --out runs/b\n"
        "# stage 3 of 3: runs/c\nsinklens train --init-from runs/b --out runs/c\n")
    assert json.loads((prov / "stages" / "a" / "train_config.json").read_text())["init_from"] == "tiny-dual"
    assert json.loads((prov / "stages" / "b" / "train_config.json").read_text())["init_from"] == "runs/a"
    assert json.loads((prov / "train_config.json").read_text())["init_from"] == "tiny-dual"   # loadable anywhere
    summary = json.loads((prov / "summary.json").read_text())
    assert (summary["chain_steps"], summary["chain_tokens"], summary["steps"]) == (60, 600, 30)
    assert [st["run"] for st in summary["stages"]] == ["runs/a", "runs/b", "runs/c"]
    assert not [m for p in dest.rglob("*") if p.is_file() for m in MACHINE_PATH.finditer(_text(p) or "")]


def test_nothing_a_user_reads_points_beside_the_repository():
    """The package, the README and the docs never send a reader to the development machine's folder
    beside the repository (its data and fixtures exist there only): the shipped lm-eval task read
    GSM8K from it."""
    beside = re.compile(r"\.\./shared\b|\bshared/(?:data|fixtures)\b")
    hits = [f"{p.relative_to(REPO)}" for p in shipped_files()
            if p.parts[len(REPO.parts)] != "tests" and beside.search(_text(p) or "")]
    assert hits == []


def test_shipped_models_generation_configs_name_their_own_end_and_pad_ids():
    """A shipped folder's generation_config.json names the end / pad ids its config.json and tokenizer
    do (transformers' own generate reads them from there: the ARM twins' said EOS 2, the mask token)."""
    assets = PKG / "assets"
    checked = 0
    for folder in sorted(p for p in assets.iterdir() if (p / "config.json").exists()):
        config = json.loads((folder / "config.json").read_text())
        path = folder / "generation_config.json"
        if not path.exists():
            continue
        gen = json.loads(path.read_text())
        added = {t["content"]: t["id"] for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
        assert gen.get("eos_token_id") == config["eos_token_id"] == added["<|eos|>"], folder.name
        assert gen.get("pad_token_id", config["pad_token_id"]) == config["pad_token_id"] == added["<|pad|>"], folder.name
        assert gen.get("bos_token_id") == config.get("bos_token_id"), folder.name
        checked += 1
    assert checked >= 3  # the ARM twins
