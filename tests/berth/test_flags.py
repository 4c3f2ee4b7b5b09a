"""The `berth` flags come from the settings models: one declaration per setting, old flag names kept."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import Field

from berth.build_defaults import BuildDefaultsSettings
from berth.cli import build_parser, main
from berth.flags import add_settings_flags, given_settings
from export.settings import ExportSettings
from service.settings import ServiceSettings
from training.finetuning.settings import FinetuneSettings

# Written out here, not read from berth.cli: what `berth --help` must offer.
from training.loop.settings import TrainLoopSettings, TrainSettings
from training.pretraining.settings import PretrainSettings

# Written out here, not read from berth.cli: what `berth --help` must offer.
SUBCOMMANDS = ["tokenizer", "pretrain", "finetune", "evaluate", "sweep", "plot", "export", "sign-bundle",
               "build-defaults", "serve", "predict"]


def subparser(name: str) -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices[name]


def help_of(name: str) -> str:
    return " ".join(subparser(name).format_help().split())  # argparse's line wrapping undone


def test_berth_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("    ")
              and not line.startswith("     ")]
    assert listed == SUBCOMMANDS


def test_a_field_added_to_the_settings_becomes_a_flag_with_its_default_and_help():
    class Extended(FinetuneSettings):
        feature_layers: int = Field(4, ge=1, description="last hidden layers concatenated, in layers")
        frozen_encoder: bool = Field(False, description="train the head only")

    parser = argparse.ArgumentParser()
    add_settings_flags(parser, Extended)
    text = " ".join(parser.format_help().split())
    assert "--feature-layers FEATURE_LAYERS last hidden layers concatenated, in layers (default: 4)" in text
    assert "--frozen-encoder train the head only" in text
    args = parser.parse_args(["--task", "ner", "--train-file", "t.txt", "--out", "o", "--feature-layers", "2",
                              "--frozen-encoder"])
    settings = Extended(**given_settings(args, Extended))
    assert settings.feature_layers == 2 and settings.frozen_encoder and settings.epochs == 3.0
    with pytest.raises(ValueError):  # the field's bound still applies
        Extended(**given_settings(parser.parse_args(["--task", "ner", "--train-file", "t", "--out", "o",
                                                     "--feature-layers", "0"]), Extended))


@pytest.mark.parametrize("model, command, exclude", [
    (FinetuneSettings, "finetune", set()), (PretrainSettings, "pretrain", set()), (ExportSettings, "export", set()),
    (ServiceSettings, "serve", {"api_key"}), (BuildDefaultsSettings, "build-defaults", set()),
])
def test_every_setting_is_a_flag_with_help(model, command, exclude):
    actions = {a.dest: a for a in subparser(command)._actions}
    missing = [name for name in model.model_fields if name not in exclude and name not in actions]
    assert not missing, f"settings of `berth {command}` without a flag: {missing}"
    assert all(actions[name].help for name in model.model_fields if name not in exclude)


def test_the_help_shows_each_commands_own_defaults():
    finetune, pretrain = help_of("finetune"), help_of("pretrain")
    # The BERT paper's fine-tuning recipe, and docs/PRETRAINING.md's CPU recipe.
    assert "--epochs EPOCHS passes over the training data" in finetune and "(default: 3.0)" in finetune
    assert "--lr LEARNING_RATE peak AdamW learning rate" in finetune and "(default: 5e-05)" in finetune
    assert "learning rate up from 0 (default: 0.1)" in finetune
    assert "the learning rate defaults to 5e-05 (a new model: 0.0005)" in pretrain
    assert "learning rate up from 0 (default: 0.05)" in pretrain
    assert "--doc-stride DOC_STRIDE overlap in tokens of consecutive windows" in finetune
    assert "(default: 384 for qa, 128 otherwise)" in finetune
    serve = help_of("serve")
    assert "--max-batch-size MAX_BATCH_SIZE most items (sequences) in one forward pass (default: 32; " \
           "BERTH_MAX_BATCH_SIZE)" in serve
    assert "--api-key" not in serve  # BERTH_API_KEY only: a flag would show in the process listing


OLD_FINETUNE = ("--task qa --train t.json --dev d.json --format squad --text-column a --text-pair-column b "
                "--label-column c --labels x,y --regression --max-train-examples 10 --max-eval-examples 5 "
                "--base b --pooling mean --max-seq-length 192 --doc-stride 64 --max-query-length 32 --squad-v2 "
                "--epochs 2 --lr 1e-4 --batch-size 16 --grad-accum 2 --warmup-ratio 0.2 --max-minutes 3 "
                "--cut-at-budget --seed 7 --no-group-by-length --threads 2 --device cpu --out runs/x")


def test_old_finetune_flags_still_parse():
    args = build_parser().parse_args(["finetune", *OLD_FINETUNE.split()])
    s = FinetuneSettings(**given_settings(args, FinetuneSettings))
    assert (s.task, s.train_file, s.dev_file, s.data_format) == ("qa", Path("t.json"), Path("d.json"), "squad")
    assert (s.text_column, s.text_pair_column, s.label_column, s.labels) == ("a", "b", "c", ["x", "y"])
    assert s.regression and (s.max_train_examples, s.max_eval_examples) == (10, 5)
    assert (s.base, s.pooling, s.max_seq_length, s.doc_stride, s.max_query_length) == ("b", "mean", 192, 64, 32)
    assert s.version_2_with_negative is True
    assert (s.epochs, s.learning_rate, s.batch_size, s.grad_accum_steps, s.warmup_ratio) == (2, 1e-4, 16, 2, 0.2)
    assert s.max_minutes == 3 and s.fit_schedule_to_budget is False and s.seed == 7
    assert s.group_by_length is False and s.num_threads == 2 and s.device == "cpu" and s.out == Path("runs/x")


def test_finetune_flags_not_given_keep_the_settings_defaults():
    args = build_parser().parse_args(["finetune", "--task", "ner", "--train", "t", "--out", "o"])
    s = FinetuneSettings(**given_settings(args, FinetuneSettings))
    assert s.fit_schedule_to_budget is True and s.group_by_length is True and s.version_2_with_negative is None
    assert s.effective_max_seq_length() == 128 and s.effective_doc_stride() == 32  # 128 // 4
    qa = FinetuneSettings(task="qa", train_file="t", out="o")
    assert (qa.effective_max_seq_length(), qa.effective_doc_stride()) == (384, 128)


def test_old_pretrain_flags_still_parse():
    line = ("c1 c2 --out o --format bert --max-document-chars 100 --heldout-fraction 0.1 --tokenizer tk "
            "--vocab-size 1000 --cased --preset tiny --layers 2 --hidden 64 --heads 2 --intermediate 128 --no-nsp "
            "--max-seq-length 64 --masked-lm-prob 0.2 --phase2-seq-length 128 --phase2-fraction 0.2 "
            "--max-predictions-per-seq 10 --whole-word-mask --dupe-factor 2 --batch-size 8 --grad-accum 2 "
            "--epochs 1.5 --max-steps 10 --max-minutes 1 --lr 1e-3 --warmup-ratio 0.1 --warmup-steps 2 "
            "--weight-decay 0 --seed 3 --threads 1 --device cpu --log-every 5 --eval-every 7 --save-every 9 "
            "--no-resume --eval-mask-seed 11 --eval-batch-size 4")
    args = build_parser().parse_args(["pretrain", *line.split()])
    s = PretrainSettings(**given_settings(args, PretrainSettings))
    assert s.corpus == [Path("c1"), Path("c2")] and s.corpus_format == "bert" and s.max_document_chars == 100
    assert (s.heldout_fraction, s.tokenizer, s.vocab_size, s.lowercase) == (0.1, Path("tk"), 1000, False)
    assert (s.preset, s.num_layers, s.hidden_size, s.num_heads, s.intermediate_size) == ("tiny", 2, 64, 2, 128)
    assert s.nsp is False and (s.max_seq_length, s.masked_lm_prob) == (64, 0.2)
    assert (s.phase2_seq_length, s.phase2_fraction, s.max_predictions_per_seq) == (128, 0.2, 10)
    assert s.whole_word_mask and s.dupe_factor == 2 and (s.batch_size, s.grad_accum_steps) == (8, 2)
    assert (s.epochs, s.max_steps, s.max_minutes, s.learning_rate) == (1.5, 10, 1, 1e-3)
    assert (s.warmup_ratio, s.warmup_steps, s.weight_decay, s.seed, s.num_threads) == (0.1, 2, 0, 3, 1)
    assert (s.log_every_steps, s.eval_every_steps, s.save_every_steps) == (5, 7, 9)
    assert s.resume == "never" and (s.eval_mask_seed, s.eval_batch_size) == (11, 4)
    args = build_parser().parse_args(["pretrain", "--eval-only", "--out", "o", "--eval-text", "a,b"])
    assert args.eval_only and args.eval_text == [Path("a"), Path("b")] and "corpus" not in vars(args)
    assert PretrainSettings(**given_settings(args, PretrainSettings)).resume == "auto"


def test_old_export_and_build_defaults_flags_still_parse():
    line = ("runs/x --out models/x --precision int8 --device cpu --task ner --pooling cls --optimize never "
            "--data-dir d --parity-examples 8 --min-agreement 0.9 --int8-recipe dynamic --calibration-data c "
            "--dev-data v --metric-examples 9 --threads 1 --examples e.json --force --quiet")
    args = build_parser().parse_args(["export", *line.split()])
    s = ExportSettings(**given_settings(args, ExportSettings))
    assert (s.model_folder, s.out, s.precision, s.device, s.task) == (Path("runs/x"), Path("models/x"), "int8",
                                                                      "cpu", "ner")
    assert (s.pooling, s.optimize, s.data_dir, s.parity_examples, s.min_agreement) == ("cls", "never", Path("d"),
                                                                                     8, 0.9)
    assert (s.int8_recipe, s.calibration_data, s.dev_data, s.metric_examples) == ("dynamic", Path("c"), Path("v"), 9)
    assert s.threads == 1 and s.examples == Path("e.json") and s.force and args.quiet
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "x", "--out", "y", "--int8-recipe", "no-such-recipe"])
    args = build_parser().parse_args("build-defaults --out m --work w --data-dir d --only squad entities --force "
                                     "--precision fp32 --threads 2 --minutes-per-model 10".split())
    b = BuildDefaultsSettings(**given_settings(args, BuildDefaultsSettings))
    assert (b.out, b.work, b.data_dir, b.only) == (Path("m"), Path("w"), Path("d"), ["squad", "entities"])
    assert b.force and (b.precision, b.threads, b.minutes_per_model) == ("fp32", 2, 10)


def test_old_serve_flags_still_parse_and_override_the_environment():
    from berth.commands.serve import settings_from_args

    line = ("--models m --host 0.0.0.0 --port 9000 --max-batch-size 8 --max-batch-tokens 4096 --max-wait-ms 1 "
            "--max-queue-items 10 --max-inputs 3 --max-chars 50 --max-body-bytes 2048 --request-timeout 5 "
            "--threads 1 --device cpu --drain-delay 1 --shutdown-timeout 2 --log-level debug --model a --model b "
            "--no-warmup --log-json --ort-spinning")
    s = settings_from_args(build_parser().parse_args(["serve", *line.split()]))
    assert (s.models, s.host, s.port, s.max_batch_size, s.max_batch_tokens) == (Path("m"), "0.0.0.0", 9000, 8, 4096)
    assert (s.max_wait_ms, s.max_queue_items, s.max_inputs_per_request, s.max_chars_per_input) == (1, 10, 3, 50)
    assert (s.max_body_bytes, s.request_timeout_s, s.intra_op_threads, s.device) == (2048, 5, 1, "cpu")
    assert (s.drain_delay_s, s.shutdown_timeout_s, s.log_level, s.model_names) == (1, 2, "debug", ["a", "b"])
    assert s.warmup is False and s.log_json and s.ort_spinning


def test_serve_environment_applies_where_no_flag_is_given(monkeypatch):
    from berth.commands.serve import settings_from_args

    monkeypatch.setenv("BERTH_PORT", "9100")
    monkeypatch.setenv("BERTH_MAX_BATCH_SIZE", "4")
    s = settings_from_args(build_parser().parse_args(["serve", "--max-batch-size", "16"]))
    assert (s.port, s.max_batch_size, s.warmup) == (9100, 16, True)


def test_finetune_and_pretrain_settings_are_the_training_loops():
    loop = TrainLoopSettings.model_fields
    for model in (FinetuneSettings, PretrainSettings):
        assert issubclass(model, TrainLoopSettings)
        for name, field in loop.items():
            assert model.model_fields[name].description == field.description
            assert model.model_fields[name].metadata == field.metadata  # bounds, e.g. epochs > 0
    s = FinetuneSettings(task="ner", train_file="t", out="o", epochs=2, learning_rate=1e-4, num_threads=1)
    train = s.loop_settings(Path("o/train_state"))
    assert isinstance(train, TrainSettings) and train.output_dir == Path("o/train_state")
    assert (train.epochs, train.learning_rate, train.num_threads, train.warmup_ratio) == (2, 1e-4, 1, 0.1)
    assert train.group_by_length is True and train.fit_schedule_to_budget is True


def test_run_records_with_the_old_setting_names_still_load():
    # finetune_run.json / pretrain_run.json written before the settings were declared once
    old = FinetuneSettings(task="pair", train_file="t", out="o", threads=2, fit_to_budget=False)
    assert old.num_threads == 2 and old.fit_schedule_to_budget is False
    assert PretrainSettings.model_validate({"out": "o", "resume": False, "threads": 1}).resume == "never"
    assert TrainSettings(output_dir="x", keep_last_checkpoints=1).keep_last_states == 1
