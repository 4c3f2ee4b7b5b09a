"""`berth pretrain`: pretrain a BERT from raw text (MLM + NSP, or MLM only), and evaluate it on held-out text."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

EXAMPLES = """examples:
  # the CPU recipe of docs/PRETRAINING.md: a 30k vocabulary trained on the corpus, the mini model
  # (L4/H256/A4), 128-token sequences, 40 minutes at most
  berth pretrain ../shared/data/pretraining --out runs/pretrain-mini --preset mini --vocab-size 30522 \\
      --batch-size 32 --lr 5e-4 --max-steps 2000 --max-minutes 40 --threads 2

  # the paper's ablation on the same corpus: masked LM only, single segments, no NSP head
  berth pretrain ../shared/data/pretraining --out runs/pretrain-mini-nonsp --no-nsp --max-minutes 40

  # reuse a vocabulary and give the size explicitly (L layers, H hidden, A heads)
  berth pretrain my_texts/ --out runs/mine --tokenizer runs/pretrain-mini --layers 6 --hidden 384 --heads 6

  # held-out MLM and NSP accuracy of a finished run (same masked positions every time)
  berth pretrain --eval-only --out runs/pretrain-mini

  # then fine-tune it like any BERT folder
  berth finetune --task classification --base runs/pretrain-mini --train ../shared/data/sst2/train.tsv --out runs/sst2

The output folder is a Hugging Face checkpoint (config.json, model.safetensors with the pretraining
heads, tokenizer.json, vocab.txt) plus pretrain_run.json (settings, seed, git revision, data sizes,
final held-out metrics), pretrain_eval.json and train_state/ (resumable checkpoints and metrics.jsonl;
run the same command again to resume, `berth plot` to draw the curves). Delete train_state/ when done
to keep only the model.
"""


def _paths(value: str) -> list[Path]:
    return [Path(p) for p in value.split(",") if p]


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "pretrain", help="pretrain a BERT from raw text (MLM + NSP), or evaluate one on held-out text",
        description="Pretrain a BERT from scratch on text files: train a WordPiece vocabulary (or reuse one),\n"
                    "build [CLS] A [SEP] B [SEP] instances with next-sentence labels, mask 15% of the tokens,\n"
                    "and train masked LM + next-sentence prediction (or masked LM only, --no-nsp). A few % of\n"
                    "the documents are held out: their MLM and NSP accuracy is reported at the end (and with\n"
                    "--eval-only), next to the unigram baseline on the same masked positions.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", nargs="*", type=Path,
                   help="text files or folders (every *.txt below them); not needed with --eval-only")
    p.add_argument("--out", type=Path, required=True, help="output folder (a Hugging Face BERT checkpoint)")

    d = p.add_argument_group("corpus")
    d.add_argument("--format", dest="corpus_format", choices=["text", "bert"], default="text",
                   help="text: plain prose, paragraphs split into sentences; bert: one sentence per line, "
                        "a blank line between documents (default: %(default)s)")
    d.add_argument("--max-document-chars", type=int, default=20_000,
                   help="text format: cut files into documents of about this many characters (default: %(default)s)")
    d.add_argument("--heldout-fraction", type=float, default=0.03,
                   help="fraction of documents held out for evaluation (default: %(default)s)")

    t = p.add_argument_group("tokenizer")
    t.add_argument("--tokenizer", type=Path, help="reuse this tokenizer (tokenizer.json, vocab.txt or a folder "
                                                  "with one); default: train a new WordPiece vocabulary on the corpus")
    t.add_argument("--vocab-size", type=int, default=30522, help="size of a new vocabulary (default: %(default)s)")
    t.add_argument("--cased", dest="lowercase", action="store_false", help="keep case and accents (default: uncased)")

    m = p.add_argument_group("model")
    m.add_argument("--preset", default="mini", choices=["tiny", "mini", "small", "medium", "base", "large"],
                   help="size as in the BERT miniatures: tiny L2/H128, mini L4/H256, small L4/H512, "
                        "medium L8/H512, base L12/H768, large L24/H1024 (default: %(default)s)")
    m.add_argument("--layers", dest="num_layers", type=int, help="L: Transformer layers (overrides the preset)")
    m.add_argument("--hidden", dest="hidden_size", type=int, help="H: hidden size (overrides the preset)")
    m.add_argument("--heads", dest="num_heads", type=int, help="A: attention heads (default H/64)")
    m.add_argument("--intermediate", dest="intermediate_size", type=int, help="feed-forward size (default 4H)")

    o = p.add_argument_group("objective")
    o.add_argument("--no-nsp", dest="nsp", action="store_false",
                   help="masked LM only: single packed segments, no next-sentence prediction; saves a "
                        "BertForMaskedLM checkpoint (the paper's ablation)")
    o.add_argument("--max-seq-length", type=int, default=128, help="tokens per instance (default: %(default)s)")
    o.add_argument("--masked-lm-prob", type=float, default=0.15, help="(default: %(default)s)")
    o.add_argument("--phase2-seq-length", type=int,
                   help="the paper's two-phase schedule: after the steps at --max-seq-length, --phase2-fraction of "
                        "--max-steps at this length (e.g. 512), so that later positions are trained too")
    o.add_argument("--phase2-fraction", type=float, default=0.1, help="share of --max-steps in phase 2 (default: %(default)s)")
    o.add_argument("--max-predictions-per-seq", type=int,
                   help="cap on masked positions per sequence (default: 20 per 128 tokens, as Google's 20 at 128 "
                        "and 80 at 512)")
    o.add_argument("--whole-word-mask", action="store_true", help="mask whole words, not single WordPiece tokens")
    o.add_argument("--dupe-factor", type=int, default=1, help="passes over the corpus when building instances")

    r = p.add_argument_group("training")
    r.add_argument("--batch-size", type=int, default=32, help="(default: %(default)s)")
    r.add_argument("--grad-accum", dest="grad_accum_steps", type=int, default=1,
                   help="micro-batches per optimizer step (default: %(default)s)")
    r.add_argument("--epochs", type=float, help="passes over the training instances (default 1 without --max-steps)")
    r.add_argument("--max-steps", type=int, help="optimizer steps (the learning-rate schedule decays to 0 there)")
    r.add_argument("--max-minutes", type=float, help="stop after this many minutes of training, whatever the steps")
    r.add_argument("--lr", dest="learning_rate", type=float, default=5e-4,
                   help="peak learning rate; small BERTs like 5e-4 to 1e-3 (default: %(default)s)")
    r.add_argument("--warmup-ratio", type=float, default=0.05, help="(default: %(default)s)")
    r.add_argument("--warmup-steps", type=int, help="overrides --warmup-ratio")
    r.add_argument("--weight-decay", type=float, default=0.01, help="(default: %(default)s)")
    r.add_argument("--seed", type=int, default=12345, help="(default: %(default)s)")
    r.add_argument("--threads", type=int, help="CPU threads for torch")
    r.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:1 …")
    r.add_argument("--log-every", dest="log_every_steps", type=int, default=10, help="(default: %(default)s)")
    r.add_argument("--eval-every", dest="eval_every_steps", type=int,
                   help="evaluate on the held-out documents every N steps (logged to metrics.jsonl)")
    r.add_argument("--save-every", dest="save_every_steps", type=int, help="resumable checkpoint every N steps")
    r.add_argument("--no-resume", dest="resume", action="store_false",
                   help="start over even if --out holds a checkpoint of an unfinished run")

    e = p.add_argument_group("evaluation")
    e.add_argument("--eval-only", action="store_true",
                   help="do not train: evaluate the checkpoint in --out on its held-out documents "
                        "(MLM accuracy, loss, perplexity; NSP accuracy; the unigram baseline)")
    e.add_argument("--eval-text", type=_paths,
                   help="with --eval-only: evaluate on every document of these comma-separated files/folders instead")
    e.add_argument("--eval-mask-seed", type=int, default=20181011,
                   help="seed of the held-out masks (fixed, so every evaluation scores the same positions)")
    e.add_argument("--eval-batch-size", type=int, default=64)
    p.set_defaults(func=run_command)
    return p


def _print_eval(metrics: dict) -> None:
    line = (f"held-out MLM accuracy {metrics['mlm_accuracy']:.4f} (unigram baseline "
            f"{metrics.get('unigram_accuracy', float('nan')):.4f}), MLM loss {metrics['mlm_loss']:.3f}, "
            f"perplexity {metrics['mlm_perplexity']:.1f} (unigram {metrics.get('unigram_perplexity', float('nan')):.0f})")
    if "nsp_accuracy" in metrics:
        line += f", NSP accuracy {metrics['nsp_accuracy']:.4f} on {metrics['nsp_pairs']} pairs"
    print(line)
    print(json.dumps(metrics, indent=2))


def run_command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.eval_only:
        import torch

        from training.pretrain import evaluate_folder

        if args.threads:
            torch.set_num_threads(args.threads)
        metrics = evaluate_folder(args.out, eval_text=args.eval_text, corpus=args.corpus or None,
                                  mask_seed=args.eval_mask_seed, batch_size=args.eval_batch_size, device=args.device)
        _print_eval(metrics)
        return 0
    if not args.corpus:
        raise SystemExit("berth pretrain: give the corpus (text files or folders), or --eval-only")
    from training.pretrain import PretrainSettings, run_pretrain

    fields = PretrainSettings.model_fields
    settings = PretrainSettings(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
    print("settings:", settings.model_dump_json(indent=2))
    record = run_pretrain(settings)
    if record["heldout_eval"]:
        _print_eval(record["heldout_eval"])
    print(f"saved {record['model_class']} to {settings.out}")
    return 0
