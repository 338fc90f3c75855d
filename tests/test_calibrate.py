"""Calibration: fitting recovers a known model; a tiny real run produces a fragment
that loads and reproduces what was measured; clear errors for bad back ends."""
from __future__ import annotations

import math
import os

import pytest

from cxlhm.cli import main
from cxlhm.config import ConfigError, load_config
from cxlhm.timing import TimingModel, calibration as cal
from cxlhm.timing.params import parse_timing

MiB = 1 << 20
SIZE = 16 * MiB


def base_params():
    return parse_timing(load_config("cmm-h").timing, "cmm-h")


def within(model: cal.Figures, measured: cal.Figures, qd_tol: float, seq_tol: float) -> None:
    for q in measured.iops:
        assert model.iops[q] == pytest.approx(measured.iops[q], rel=qd_tol), f"QD{q}"
    assert model.seq_read_bw == pytest.approx(measured.seq_read_bw, rel=seq_tol)


def test_fit_recovers_a_known_device():
    truth = base_params().replace(nand_channels=2, nand_dies_per_channel=2, nand_read_latency=40_000.0,
                                  ssd_command_latency=8_000.0, nand_channel_rate=600e6, nand_page_size=65536)
    target = cal.model_figures(truth, 256 * MiB, qds=(1, 8, 32))
    fitted = cal.fit(target, base_params(), 256 * MiB)
    within(cal.model_figures(fitted, 256 * MiB, qds=(1, 8, 32)), target, 0.05, 0.01)
    assert fitted.dies == pytest.approx(truth.dies, abs=1)


@pytest.fixture(scope="module")
def measured_and_fitted(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cal") / "ssd.img")
    measured = cal.measure(path, SIZE, 0.05, qds=(1, 8, 32))
    return path, measured, cal.fit(measured, base_params(), SIZE)


def test_measure_lays_out_the_region(measured_and_fitted):
    path, measured, _ = measured_and_fitted
    assert measured.layout_write_bw and measured.layout_write_bw > 0
    with open(path, "rb") as f:  # no holes left: reads reach the disk
        assert os.lseek(f.fileno(), 0, os.SEEK_HOLE) >= SIZE
    assert measured.iops[1] > 0 and measured.iops[32] >= measured.iops[1] * 0.5
    assert measured.qd1_latency_ns > 0 and measured.seq_read_bw > 0
    again = cal.measure(path, SIZE, 0.02, qds=(1,))
    assert again.layout_write_bw is None  # already laid out: not written again


def test_fitted_model_reproduces_what_it_was_fitted_to(measured_and_fitted):
    _, measured, fitted = measured_and_fitted
    model = cal.model_figures(fitted, SIZE, qds=tuple(measured.iops))
    # QD1 and sequential bandwidth are matched exactly by construction; the other points
    # depend on how far a real (often virtualised) device is from independent dies.
    assert model.iops[1] == pytest.approx(measured.iops[1], rel=0.03)
    assert model.seq_read_bw == pytest.approx(measured.seq_read_bw, rel=0.03)
    for q in (8, 32):
        assert abs(math.log(model.iops[q] / measured.iops[q])) < math.log(1.5), f"QD{q}"


def test_cli_writes_a_loadable_fragment(tmp_path, capsys):
    out = tmp_path / "fragment.yaml"
    rc = main(["calibrate", "--backend", str(tmp_path / "c.img"), "--size", "16MiB", "--runtime", "0.02s",
               "-o", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "model/measured" in printed and "QD32" in printed and "machine:" in printed
    text = out.read_text()
    assert "# Measured" in text and "cxlhm calibrate" in text
    cfg = load_config(str(out))
    m = TimingModel.from_device_config(cfg)  # validates
    assert cfg.source_of("timing") == str(out) and m.settings.nand_read_latency > 0


def test_cli_rejects_a_path_that_cannot_be_opened_o_direct(tmp_path, capsys):
    rc = main(["calibrate", "--backend", str(tmp_path), "--size", "16MiB", "--runtime", "0.01s"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--backend" in err and "O_DIRECT" in err


def test_refuses_to_overwrite_a_file_with_data(tmp_path):
    path = tmp_path / "existing.img"
    with open(path, "wb") as f:
        f.write(b"precious" * 512)
    with pytest.raises(ConfigError, match="--overwrite"):
        cal.measure(str(path), SIZE, 0.01, qds=(1,))
    assert path.read_bytes() == b"precious" * 512  # untouched, not even resized
