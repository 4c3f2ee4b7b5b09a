"""`--config FILE` on every settings command: bad files are one line and exit code 2 before any work; old flag
spellings still work; pretrain's stdout is one JSON document."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from berth.cli import build_parser, main
from tests.conftest import REPO

TOPICS = REPO / "data" / "samples" / "topics"
REQUIRED = ["--task", "classification", "--train", str(TOPICS / "train.jsonl")]


def refused(capsys, argv: list[str]) -> str:
    """Run `berth ARGV`, expect exit code 2, return its one stderr line."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("text, says", [
    ("task: classification\nlerning_rate: 0.1\n", "unknown setting 'lerning_rate' in"),
    ("lerning_rate: 0.1\n", "(did you mean 'learning_rate'?)"),  # a spelling
    ("lr: 0.1\n", "unknown setting 'lr' in"),
    ("lr: 0.1\n", "(did you mean 'learning_rate'?)"),  # the flag's short name (--lr)
    ("threads: 2\nbatch: 8\n", "unknown setting 'batch' in"),
    ("batch_size: lots\n", "batch_size in"),
    ("epochs: [1, 2]\n", "epochs in"),
    ("- just\n- a list\n", "must be a mapping"),
    ("task: [unclosed\n", "not valid YAML/JSON"),
    ('{"batch_size": 8, "seed": "x"}', "seed in"),  # JSON too
])
def test_a_bad_config_file_is_one_line_naming_the_problem_and_exit_2(tmp_path, capsys, text, says):
    config = tmp_path / "recipe.yaml"
    config.write_text(text)
    out = tmp_path / "out"
    line = refused(capsys, ["finetune", "--config", str(config), "--out", str(out), *REQUIRED])
    assert line.startswith("berth finetune: ") and says in line
    assert not out.exists()  # nothing started


def test_an_unreadable_config_is_one_line_and_exit_2(tmp_path, capsys):
    line = refused(capsys, ["pretrain", "--config", str(tmp_path / "missing.yaml")])
    assert line.startswith("berth pretrain: cannot read config") and "missing.yaml" in line


@pytest.mark.parametrize("command", ["export", "build-defaults"])
def test_every_settings_command_reads_a_config_and_names_an_unknown_field(tmp_path, capsys, command):
    config = tmp_path / "c.json"
    config.write_text('{"no_such_setting": 1}')
    assert "unknown setting 'no_such_setting'" in refused(capsys, [command, "--config", str(config)])


def test_serve_names_an_unknown_config_field_in_one_line_and_exits_2(tmp_path, capsys):
    config = tmp_path / "serve.yaml"
    config.write_text("max_batch_size: 0\nno_such_setting: 1\n")
    assert main(["serve", "--config", str(config)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "unknown setting 'no_such_setting'" in lines[0] and "max_batch_size in" in lines[0]


def test_serve_precedence_is_defaults_then_file_then_environment_then_flags(tmp_path, monkeypatch):
    from berth.commands.serve import settings_from_args

    config = tmp_path / "serve.yaml"
    config.write_text("max_batch_size: 16\nport: 9001\nmax_wait_ms: 7\n")
    monkeypatch.setenv("BERTH_PORT", "9002")
    s = settings_from_args(build_parser().parse_args(["serve", "--config", str(config), "--max-wait-ms", "1"]))
    assert (s.max_batch_size, s.port, s.max_wait_ms) == (16, 9002, 1.0)


def test_a_recipe_file_with_an_unknown_option_is_refused_before_building(tmp_path, capsys):
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text("recipes:\n- {name: t, task: classification, train: a, dev: b, options: {epoch: 1}}\n")
    line = refused(capsys, ["build-defaults", "--recipes", str(recipes), "--out", str(tmp_path / "m")])
    assert "options names no setting epoch" in line and not (tmp_path / "m").exists()


def test_the_shipped_recipes_are_package_data_files():
    from berth.build_defaults import RECIPES, SAMPLE_RECIPES, load_recipes

    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == ["research.yaml", "samples.yaml"]
    assert [r.name for r in SAMPLE_RECIPES] == ["squad", "entities", "similarity", "topics", "rerank"]
    assert load_recipes(RECIPES / "samples.yaml")[0].options["learning_rate"] == 1e-4
    assert '"recipes/*.yaml"' in (REPO / "pyproject.toml").read_text()  # package data: in the wheel too


def test_pretrain_takes_finetunes_flag_names_and_keeps_the_old_ones_hidden():
    parser = build_parser()
    new = parser.parse_args(["pretrain", "--out", "o", "--log-every-steps", "5", "--eval-every-steps", "7",
                             "--save-every-steps", "9", "--resume", "never"])
    old = parser.parse_args(["pretrain", "--out", "o", "--log-every", "5", "--eval-every", "7", "--save-every", "9",
                             "--no-resume"])
    fields = ("log_every_steps", "eval_every_steps", "save_every_steps", "resume")
    assert [getattr(new, f) for f in fields] == [getattr(old, f) for f in fields] == [5, 7, 9, "never"]
    shown = parser._subparsers._group_actions[0].choices["pretrain"].format_help()
    assert "--log-every-steps" in shown and "--log-every " not in shown and "--no-resume" not in shown
    finetune = parser._subparsers._group_actions[0].choices["finetune"].format_help()
    assert "--log-every-steps" in finetune and "--resume" in finetune


def test_pretrain_stdout_is_one_json_document(shared_data, tmp_path):
    corpus = sorted((shared_data / "pretraining" / "inaugural").glob("*.txt"))[:6]
    args = [*map(str, corpus), "--out", str(tmp_path / "p"), "--preset", "tiny", "--vocab-size", "500",
            "--max-seq-length", "32", "--batch-size", "8", "--max-steps", "2", "--threads", "1",
            "--heldout-fraction", "0.2", "--eval-max-instances", "16", "--precision", "fp32"]
    done = subprocess.run([sys.executable, "-m", "berth.cli", "pretrain", *args], capture_output=True, text=True,
                          env={**os.environ, "BERTH_PROGRESS_SECONDS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["out"] == str(tmp_path / "p") and "mlm_accuracy" in result["heldout_eval"]
    assert "held-out MLM accuracy" in done.stderr and (tmp_path / "p" / "config.yaml").is_file()
