"""Every numeric parameter of every notebook is checked before work: `klear run`'s dry run (the notebook's
`config`-tagged cells on the parameters, klear_lib.presets.dry_run_config) refuses a value out of range and names the
parameter, so that `-p workers=0` fails in a second, not after minutes in the first unit. The same cells run first
under papermill and in JupyterLab, so the checks hold however the notebook is launched."""

from __future__ import annotations

import pathlib

import pytest

from klear_lib import cli, presets

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0[1-9]_*.ipynb"))
# Integer parameters for which 0 is a meaningful value (0: off / the benchmark's own default / no limit / seed 0).
ZERO_OK = {"07_evaluation": {"n", "limit", "top_k", "seed", }, "05_code_reward": set(),
           "08_real_model": {"seed", "format_sft_error_rate", "sft_alpha"}}


def _default(nb: pathlib.Path) -> dict:
    """The parameters the notebook's cell holds: its `tiny` preset (08's: `small-real`)."""
    return presets.load_params(nb.stem, presets.default_preset(nb.stem, ROOT / "params"), params_dir=ROOT / "params")


def _numeric(nb: pathlib.Path) -> dict:
    tiny = _default(nb)
    return {k: v for k, v in tiny.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


CASES = [(nb, key, bad) for nb in NOTEBOOKS for key, value in _numeric(nb).items()
         for bad in ([-1, 0] if isinstance(value, int) else [-1.0])
         if not (bad == 0 and key in ZERO_OK.get(nb.stem, set()))]


def test_every_training_notebook_has_numeric_parameters():
    assert len(NOTEBOOKS) == 8 and len(CASES) > 200


@pytest.mark.parametrize("nb,key,bad", CASES, ids=lambda x: getattr(x, "stem", str(x)))
def test_a_value_out_of_range_is_refused_by_the_dry_run_naming_its_parameter(nb, key, bad):
    tiny = _default(nb)
    with pytest.raises(presets.KlearError) as err:
        presets.dry_run_config(nb, {**tiny, key: bad})
    # 07 hands `temperature` to the config's eval_temperature: the message names that field
    assert key in str(err.value) or (key, nb.stem) == ("temperature", "07_evaluation"), str(err.value)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_tiny_and_smoke_presets_pass_the_dry_run(nb):
    for preset in (presets.default_preset(nb.stem, ROOT / "params"), "smoke"):
        presets.dry_run_config(nb, presets.load_params(nb.stem, preset, params_dir=ROOT / "params"))


def test_workers_zero_is_refused_by_klear_run_before_a_kernel_starts(tmp_path, capsys):
    assert cli.main(["run", "03", "--preset", "smoke", "-p", "workers=0", "--output-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "workers = 0: expected an integer >= 1" in err, err
    assert not list(tmp_path.rglob("*.ipynb"))  # no run directory, no kernel
