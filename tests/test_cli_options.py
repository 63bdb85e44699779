"""--presets and --model are declared once and work on either side of the command's name."""

from __future__ import annotations

import pytest

from ernie_tui.cli import build_parser, main


@pytest.mark.parametrize("argv, presets, model", [
    (["presets", "list", "--presets", "F"], ["F"], None),
    (["--presets", "F", "presets", "list"], ["F"], None),
    (["--presets", "F", "presets", "list", "--presets", "G"], ["F", "G"], None),
    (["presets", "show", "x", "--presets", "F", "--presets", "G", "--model", "D"], ["F", "G"], "D"),
    (["--model", "D", "presets", "show", "x"], [], "D"),
    (["--model", "A", "check", "x", "--model", "B"], [], "B"),  # the nearer one wins
    (["--presets", "F", "--model", "D", "sweep", "x", "--out", "o.md"], ["F"], "D"),
    (["sweep", "x", "--presets", "F", "--model", "D", "--out", "o.md"], ["F"], "D"),
    (["check", "x"], [], None),
    ([], [], None),
])
def test_one_dest_each_on_either_side(argv, presets, model):
    args = build_parser().parse_args(argv)
    assert args.presets == presets and args.model == model
    assert not {"presets_files", "preset_model", "check_presets", "check_model", "sweep_presets",
                "sweep_model"} & set(vars(args))


def test_presets_files_add_up_across_the_command_name(tmp_path, capsys):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text('[presets.only-in-a]\nblock_size = 16\n')
    b.write_text('[presets.only-in-b]\nblock_size = 32\n')
    assert main(["--presets", str(a), "presets", "list", "--presets", str(b)]) == 0
    out = capsys.readouterr().out
    assert "only-in-a" in out and "only-in-b" in out
