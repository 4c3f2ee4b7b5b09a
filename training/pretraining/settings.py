"""The settings of `berth pretrain`: the training loop's (training/loop/settings.py) plus the corpus, its preparation,
the tokenizer, the model (new, or continued from a base) and the objective. Torch-free."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from training.bert.config import PRESETS, BertConfig
from training.loop.settings import TrainLoopSettings, loop_default
from training.pretraining.corpus import DEFAULT_MAX_DOCUMENT_CHARS, BadLinePolicy, Encoding

log = logging.getLogger("berth.settings")

DEFAULT_PRESET = "mini"
NEW_MODEL_LEARNING_RATE = 5e-4  # the CPU recipe of docs/PRETRAINING.md, a small model from scratch
CONTINUED_LEARNING_RATE = 5e-5  # a released checkpoint: small steps, as domain-adaptive pretraining uses
# What a base fixes: these settings choose a new vocabulary or a new shape, which a base already has.
NOT_WITH_BASE = {"tokenizer": "--tokenizer", "vocab_size": "--vocab-size", "lowercase": "--cased",
                 "preset": "--preset", "num_layers": "--layers", "hidden_size": "--hidden", "num_heads": "--heads",
                 "intermediate_size": "--intermediate"}


class PretrainSettings(TrainLoopSettings):
    """Defaults: the CPU recipe of docs/PRETRAINING.md (mini model, 128 tokens, high learning rate); with a base,
    continued masked-LM pretraining at a low learning rate."""

    corpus: list[Path] = Field(default_factory=list, description="text files or folders (every *.txt below them), "
                               "or a folder prepared by an earlier run (its manifest.json)")
    out: Path = Field(description="output folder: a Hugging Face BERT model folder, with data/ (the prepared "
                      "shards), metrics.jsonl and checkpoints/ (resumable training states)")
    # -- corpus
    corpus_format: Literal["text", "bert"] = Field(
        "text", description="text: plain prose, paragraphs split into sentences; bert: one sentence per line, a "
        "blank line between documents")
    max_document_chars: int | None = Field(DEFAULT_MAX_DOCUMENT_CHARS, description="text format: cut files into "
                                           "documents of about this many characters")
    heldout_fraction: float = Field(0.03, ge=0, lt=1, description="share of documents held out for evaluation")
    encoding: Encoding = Field("utf-8", description="utf-8: every line must decode (see bad_lines); "
                               "utf-8-or-latin-1: a file that is not UTF-8 is read as Latin-1, said in the log")
    bad_lines: BadLinePolicy = Field("stop", description="a corpus line that is not UTF-8: stop with its file and "
                                     "line, or skip it (counted, listed in data/bad_lines.jsonl)")
    # -- preparation: the corpus into memory-mapped shards, before training
    workers: int = Field(1, ge=1, description="processes preparing the shards")
    shard_mb: float = Field(8.0, gt=0, description="MB of text per shard (whole files, or parts of a larger one)")
    shuffle_window: int = Field(4, ge=1, description="shards whose instances an epoch shuffles together (memory: "
                                "one window's order)")
    prepare_only: bool = Field(False, description="prepare the shards into OUT/data and stop (before a torchrun "
                               "launch, which builds no data)")
    # -- the base to continue from, or a tokenizer for a new model
    base: str | None = Field(None, description="continue masked-LM pretraining from this Hugging Face BERT folder "
                             "('default': the embedded all-MiniLM-L6-v2), with its tokenizer and shape; heads it "
                             f"lacks start fresh; the learning rate defaults to {CONTINUED_LEARNING_RATE:g} (a new "
                             f"model: {NEW_MODEL_LEARNING_RATE:g}); unset: a new model")
    head_warmup_steps: int | None = Field(None, ge=0, description="with base: steps that train only the heads the "
                                          "base lacks, the encoder frozen, before everything trains (default: 10% "
                                          "of the steps, at most 500, when a head is new)")
    head_warmup_learning_rate: float = Field(1e-3, gt=0, description="with base: learning rate of the head warm-up")
    tokenizer: Path | None = Field(None, description="reuse this tokenizer (tokenizer.json, vocab.txt or a folder "
                                   "with one); default: train a new WordPiece vocabulary on the corpus")
    vocab_size: int | None = Field(None, gt=0, description="tokens in a new vocabulary (default 30522)")
    lowercase: bool | None = Field(None, description="uncased vocabulary (default, as bert-base-uncased)")
    min_frequency: int = Field(2, ge=1, description="a new vocabulary's least pair frequency")
    # -- a new model: a named size, optionally with explicit L / H / A / intermediate size
    preset: str | None = Field(None, description="size as in the BERT miniatures: tiny L2/H128, mini L4/H256 "
                               "(default), small L4/H512, medium L8/H512, base L12/H768, large L24/H1024")
    num_layers: int | None = Field(None, gt=0, description="L: Transformer layers (overrides the preset)")
    hidden_size: int | None = Field(None, gt=0, description="H: hidden size (overrides the preset)")
    num_heads: int | None = Field(None, gt=0, description="A: attention heads (default H/64)")
    intermediate_size: int | None = Field(None, gt=0, description="feed-forward size (default 4H)")
    # -- objective and data
    nsp: bool | None = Field(None, description="next-sentence prediction (default: on for a new model; with a base, "
                             "only when it has a trained NSP head); off: masked LM only on single packed segments, "
                             "a BertForMaskedLM (the paper's ablation)")
    max_seq_length: int = Field(128, gt=0, description="tokens per instance")
    short_seq_prob: float = Field(0.1, ge=0, le=1, description="share of instances made shorter than "
                                  "max_seq_length on purpose (as Google's BERT)")
    dupe_factor: int = Field(1, ge=1, description="passes over the corpus when building instances (each masked anew)")
    masked_lm_prob: float = Field(0.15, gt=0, lt=1, description="share of tokens masked")
    max_predictions_per_seq: int | None = Field(
        None, description="masked positions per sequence at most (default: 20 per 128 tokens, as Google's 20 at 128 "
        "and 80 at 512); a value below masked_lm_prob x max_seq_length is kept but warned about")
    # The paper's two-phase schedule: after the steps at max_seq_length, this share of extra steps at
    # phase2_seq_length, so that the position embeddings past max_seq_length get trained.
    phase2_seq_length: int | None = Field(None, description="the paper's two-phase schedule: after the steps at "
                                          "max_seq_length, phase2_fraction of max_steps at this length (e.g. 512)")
    phase2_fraction: float = Field(0.1, gt=0, lt=1, description="share of all steps in phase 2 (the paper: 10%)")
    whole_word_mask: bool = Field(False, description="mask whole words, not single WordPiece tokens")
    # -- held-out evaluation
    eval_mask_seed: int = Field(20181011, description="seed of the held-out masks (fixed: every evaluation scores "
                                "the same positions)")
    eval_batch_size: int = Field(64, gt=0, description="sequences per held-out evaluation batch")
    eval_max_instances: int | None = Field(None, gt=0, description="held-out instances scored by the evaluations "
                                           "during training, spread evenly over the split (the final one: see "
                                           "final_eval_max_instances)")
    final_eval_max_instances: int | None = Field(20_000, gt=0, description="held-out instances the final evaluation "
                                                 "scores, spread evenly over the split (a large corpus holds out "
                                                 "millions); unset: all")
    dist_timeout_minutes: float = Field(10.0, gt=0, description="torchrun: how long a process waits for the others "
                                        "(at start-up or any collective) before it fails")
    # -- the loop's defaults for pretraining
    seed: int = loop_default("seed", 12345)
    # unset: NEW_MODEL_LEARNING_RATE for a new model, CONTINUED_LEARNING_RATE from a base (`--base` says so)
    learning_rate: float | None = loop_default("learning_rate", None)
    warmup_ratio: float = loop_default("warmup_ratio", 0.05)
    keep_last_states: int | None = loop_default("keep_last_states", 1)

    @model_validator(mode="after")
    def _check(self) -> PretrainSettings:
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose from {', '.join(PRESETS)}")
        if self.base is not None:
            given = [flag for name, flag in NOT_WITH_BASE.items() if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} cannot be used with --base: a base keeps its own vocabulary "
                                 "and shape")
        if self.group_by_length:
            raise ValueError("--group-by-length does not apply to pretraining: its instances are packed to the "
                             "sequence length already")
        if self.phase2_seq_length is not None:
            if self.max_steps is None:
                raise ValueError("the two-phase schedule (phase2_seq_length) needs max_steps: the steps of both phases")
            if self.phase2_seq_length <= self.max_seq_length:
                raise ValueError("phase2_seq_length must be longer than max_seq_length")
        return self

    def effective_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return CONTINUED_LEARNING_RATE if self.base is not None else NEW_MODEL_LEARNING_RATE

    def loop_settings(self, output_dir: Path, **overrides: Any):
        return super().loop_settings(output_dir, **{"learning_rate": self.effective_learning_rate(), **overrides})

    def phase_steps(self) -> tuple[int, int]:
        """(steps at max_seq_length, steps at phase2_seq_length): the paper's 90% / 10% by default."""
        if self.phase2_seq_length is None or self.max_steps is None:
            return self.max_steps or 0, 0
        second = max(1, round(self.max_steps * self.phase2_fraction))
        return self.max_steps - second, second

    def data_settings(self, nsp: bool, seq_length: int | None = None) -> dict[str, Any]:
        """What fixes the prepared instances (besides the corpus and the tokenizer)."""
        return {"format": self.corpus_format, "max_document_chars": self.max_document_chars,
                "max_seq_length": seq_length or self.max_seq_length, "short_seq_prob": self.short_seq_prob,
                "nsp": nsp, "dupe_factor": self.dupe_factor, "heldout_fraction": self.heldout_fraction,
                "seed": self.seed, "encoding": self.encoding, "bad_lines": self.bad_lines}

    def bert_config(self, vocab_size: int) -> BertConfig:
        """The preset with any explicit L / H / A / intermediate size; A defaults to H / 64."""
        longest = max(512, self.max_seq_length, self.phase2_seq_length or 0)
        overrides: dict[str, Any] = {"vocab_size": vocab_size, "max_position_embeddings": longest}
        if self.num_layers:
            overrides["num_hidden_layers"] = self.num_layers
        if self.hidden_size:
            overrides["hidden_size"] = self.hidden_size
            overrides.setdefault("intermediate_size", 4 * self.hidden_size)
            overrides["num_attention_heads"] = max(1, self.hidden_size // 64)
        if self.num_heads:
            overrides["num_attention_heads"] = self.num_heads
        if self.intermediate_size:
            overrides["intermediate_size"] = self.intermediate_size
        return BertConfig.preset(self.preset or DEFAULT_PRESET, **overrides)

    def masking(self, seq_length: int | None = None):
        from training.pretraining.masking import MaskingSettings  # numpy + tokenizers: only when building data

        return MaskingSettings(masked_lm_prob=self.masked_lm_prob,
                               max_predictions_per_seq=self.predictions_per_seq(seq_length or self.max_seq_length),
                               whole_word=self.whole_word_mask)

    def predictions_per_seq(self, seq_length: int) -> int:
        """The cap on masked positions for `seq_length`-token sequences: explicit, or 20 per 128 tokens.

        An explicit cap below masked_lm_prob x seq_length masks fewer than the intended share of a full
        sequence (e.g. 20 at 512 tokens: 4% instead of 15%): kept, with a warning.
        """
        if self.max_predictions_per_seq is None:
            return max(1, math.ceil(20 * seq_length / 128))
        wanted = round(self.masked_lm_prob * seq_length)
        if self.max_predictions_per_seq < wanted:
            log.warning("max_predictions_per_seq=%d masks at most %.1f%% of a %d-token sequence (masked_lm_prob "
                        "%.2f wants %d); leave it unset to scale it with the length", self.max_predictions_per_seq,
                        100 * self.max_predictions_per_seq / seq_length, seq_length, self.masked_lm_prob, wanted)
        return self.max_predictions_per_seq
