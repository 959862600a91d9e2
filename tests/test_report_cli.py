"""`sinklens report` on the command line: a step that does not exist is refused before any work,
and -v says what was read and how long each part took."""
import numpy as np

from sinklens.cli import main
from sinklens.trace import TraceWriter


def _trace(path, steps=3, S=10):
    rng = np.random.default_rng(0)
    with TraceWriter(path, {"family": "llada"}) as w:
        for t in range(steps):
            w.write_step(t, tokens=rng.integers(0, 50, (1, S)), is_masked=np.zeros((1, S), bool),
                         received=(rng.random((1, 2, 2, S)) + 6 * np.eye(S)[0]).astype(np.float32))
    return path


def test_map_steps_out_of_range_is_refused_before_any_work(tmp_path, capsys):
    trace = _trace(tmp_path / "t.arrow")
    assert main(["report", str(trace), "--out", str(tmp_path / "r"), "--map-steps", "9999", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--map-steps" in err[0] and "9999" in err[0] and "3 steps" in err[0]
    assert not (tmp_path / "r").exists()                     # nothing written


def test_verbose_says_what_was_read_and_the_timings(tmp_path, capsys):
    trace = _trace(tmp_path / "t.arrow")
    assert main(["report", str(trace), "--out", str(tmp_path / "r"), "--verbose", "--no-figures"]) == 0
    err = capsys.readouterr().err
    assert "t: 3 steps × 2 layers × 2 heads, up to 10 tokens, bidirectional" in err
    assert "index.html:" in err and " MB in " in err
    assert main(["report", str(trace), "--out", str(tmp_path / "q"), "--no-figures"]) == 0
    assert "3 steps × 2 layers" not in capsys.readouterr().err   # not without -v


def test_an_out_no_folder_can_be_made_at_is_refused_before_the_analysis(tmp_path, capsys, monkeypatch):
    """/proc takes no new folder, even from root: refused in one line naming --out, and no trace is read."""
    import sinklens.report.report as report

    trace = _trace(tmp_path / "t.arrow")
    monkeypatch.setattr(report, "build_report", lambda *a, **k: (_ for _ in ()).throw(AssertionError("analysed")))
    assert main(["report", str(trace), "--out", "/proc/sinklens-no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sinklens report: error: --out /proc/sinklens-no-report: No such file or directory: "
                   "/proc/sinklens-no-report"]
