"""Every `klear run NOTEBOOK ...` command the README and the docs show (results.md, a dated log, excepted) starts as
written: its notebook, preset and `-p` values resolve, and the notebook's config cells accept them (klear run's own
check before a kernel starts). Running them whole is for `make reproduce` and the GPU checks."""

import pathlib
import re
import shlex

import pytest

from klear_lib import cli, runner

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "results.md")]
COMMAND = re.compile(r"`((?:\.venv/bin/)?klear run [^`]+)`")


def _commands():
    out = []
    for doc in DOCS:
        for text in COMMAND.findall(doc.read_text(encoding="utf-8")):
            if "<" not in text and "--resume" not in text:  # placeholders name no run
                out.append(pytest.param(text, id=f"{doc.name}:{text.split(' run ', 1)[1]}"))
    return out


def test_the_docs_show_klear_run_commands():
    assert len(_commands()) >= 3


@pytest.mark.parametrize("text", _commands())
def test_a_documented_klear_run_command_resolves_as_written(text):
    args = cli.build_parser().parse_args(shlex.split(text)[1:])
    layout = cli.layout_from_args(args)
    notebook, name, params = runner.resolve(args.notebook, args.preset, args.param or [], layout, dry_run=True)
    assert notebook.is_file() and name == notebook.stem
    for item in args.param or []:
        key = item.split("=", 1)[0]
        assert key in params, (text, key)


@pytest.mark.parametrize("text, shows", [
    ("klear params 03", ["rl_lr", "tiny", "gpu"]),  # README: every parameter with its value in each preset
    ("klear list", ["03_rl_clip_variants", "07_evaluation"]),
    ("klear --version", ["klear "]),
    ("klear lab --help", ["-- --no-browser --port 8890"]),  # the pass-through of Jupyter's own flags
])
def test_the_readmes_inspection_commands_run_as_written(text, shows, capsys):
    assert text in (ROOT / "README.md").read_text(encoding="utf-8")
    try:
        rc = cli.main(shlex.split(text)[1:])
    except SystemExit as end:  # argparse's --version and --help exit
        rc = end.code
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog at the terminal's width
    assert rc == 0 and all(s in out for s in shows), out[:500]
