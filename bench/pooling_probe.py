"""Which pooling suits the base: a linear probe on frozen [CLS]-pooler vs mean-pooled features.

The measurement behind `berth finetune --pooling auto` for the default base. For each pooling, the
frozen all-MiniLM-L6-v2 encoder embeds SST-2 training sentences and every dev sentence; a logistic
regression (the same L2, the same optimizer) is fitted on the training features and scored on
dev. A representation that carries the task better gives the head a better start. Cheap (forward
passes only), so it runs where a fine-tuning sweep cannot. Also reported: the pooler's weight
statistics (a trained dense layer has clearly non-trivial weights; all-MiniLM-L6-v2's objective
never used it).

    python -m bench.pooling_probe [--train 1000]

Writes ``bench/results/pooling_probe.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "sst2"
RESULTS = REPO / "bench" / "results" / "pooling_probe.json"


@torch.no_grad()
def features(model, tokenizer, texts: list[str], batch_size: int = 64) -> dict[str, np.ndarray]:
    from tasks import common
    from tasks.runtime.batching import pad_batch
    from training.bert.model import mean_pool

    out: dict[str, list[np.ndarray]] = {"cls": [], "mean": []}
    for start in range(0, len(texts), batch_size):
        items = [common.encode_classification(tokenizer, t, None, max_length=64)
                 for t in texts[start : start + batch_size]]
        feeds = {k: torch.from_numpy(v) for k, v in pad_batch(items).items()}
        result = model(feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"])
        out["cls"].append(result["pooler_output"].numpy())
        out["mean"].append(mean_pool(result["last_hidden_state"], feeds["attention_mask"]).numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


def probe(train_x: np.ndarray, train_y: np.ndarray, dev_x: np.ndarray, dev_y: np.ndarray, l2: float = 1e-3) -> float:
    """Dev accuracy of an L2-regularized logistic regression on standardized features (LBFGS, 200 steps)."""
    mu, sigma = train_x.mean(0), train_x.std(0) + 1e-6
    x = torch.tensor((train_x - mu) / sigma, dtype=torch.float64)
    y = torch.tensor(train_y, dtype=torch.float64)
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + l2 * (w @ w)
        loss.backward()
        return loss

    optimizer.step(closure)
    dev = torch.tensor((dev_x - mu) / sigma, dtype=torch.float64)
    predicted = ((dev @ w + b) > 0).numpy().astype(int)
    return float((predicted == dev_y).mean())


def main(argv: list[str] | None = None) -> None:
    from tasks import readers
    from tasks.runtime.tokenizer import load_tokenizer
    from training.bert.checkpoint import default_base_path, load_pretrained
    from training.bert.model import BertModel
    from training.loop.threads import default_threads

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=1000, help="SST-2 training sentences (a seeded sample)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(default_threads())

    base = default_base_path()
    model, _ = load_pretrained(BertModel, base)
    tokenizer = load_tokenizer(base)
    train = readers.read_glue(DATA / "train.tsv", "sst2")
    train = [train[i] for i in np.random.default_rng(0).choice(len(train), args.train, replace=False)]
    dev = readers.read_glue(DATA / "dev.tsv", "sst2")
    train_f = features(model, tokenizer, [e.text for e in train])
    dev_f = features(model, tokenizer, [e.text for e in dev])
    train_y = np.array([int(e.label) for e in train])
    dev_y = np.array([int(e.label) for e in dev])
    accuracy = {k: probe(train_f[k], train_y, dev_f[k], dev_y) for k in ("cls", "mean")}

    weight = model.pooler.dense.weight.detach()
    pooler = {"weight_std": float(weight.std()), "diagonal_mean": float(weight.diagonal().mean()),
              "cls_feature_std": float(train_f["cls"].std()), "mean_feature_std": float(train_f["mean"].std())}
    print(f"SST-2 dev accuracy of a linear probe on {args.train} frozen training sentences, {len(dev)} dev:")
    for k, v in accuracy.items():
        print(f"  {k:<5} {100 * v:.1f}")
    print("pooler:", json.dumps(pooler))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": machine_facts(default_threads()), "train_sentences": args.train,
                                       "dev_sentences": len(dev), "dev_accuracy": accuracy, "pooler": pooler},
                                      indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
