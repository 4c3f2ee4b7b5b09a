"""BertConfig: the hyper-parameters of a BERT model, read from and written to Hugging Face config.json."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The BERT miniatures (Turc et al., 2019) and the paper's BERT-base: (layers, hidden size).
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768  # H
    num_hidden_layers: int = 12  # L
    num_attention_heads: int = 12  # A; H must be a multiple of A
    intermediate_size: int = 3072  # 4H in the paper
    hidden_act: str = "gelu"  # exact erf GELU, as BERT and its checkpoints use
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Heads.
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    problem_type: str | None = None  # regression | single_label_classification | multi_label_classification
    classifier_dropout: float | None = None  # None: use hidden_dropout_prob
    # Sequence / pair heads: "cls" reads the tanh pooler over [CLS] (BERT's recipe), "mean" averages
    # the last hidden states over real tokens (how sentence-transformers bases were trained). None: cls.
    classifier_pooling: str | None = None
    # Any other config.json keys, kept so that a round trip loses nothing.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not a multiple of num_attention_heads={self.num_attention_heads}"
            )
        if self.classifier_pooling not in (None, "cls", "mean"):
            raise ValueError(f"classifier_pooling must be 'cls' or 'mean', not {self.classifier_pooling!r}")
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)

    @property
    def labels(self) -> list[str]:
        """Label names in id order (LABEL_i when the config names none)."""
        if self.id2label:
            return [self.id2label[i] for i in range(self.num_labels)]
        return [f"LABEL_{i}" for i in range(self.num_labels)]

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A named size: tiny (L2/H128), mini (L4/H256), small (L4/H512), medium (L8/H512), base, large."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
        layers, hidden = PRESETS[name]
        values = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
                      intermediate_size=4 * hidden)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k not in ("label2id", "model_type", "auto_map")}
        if "id2label" not in known and "num_labels" not in known and "label2id" in data:
            known["id2label"] = {int(i): name for name, i in data["label2id"].items()}
        return cls(**known, extra=extra)

    def to_dict(self, architecture: str | None = None) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        data = {**self.extra, **data}
        labels = self.labels
        # Written explicitly: transformers 5 omits the default two labels otherwise.
        data["id2label"] = {str(i): name for i, name in enumerate(labels)}
        data["label2id"] = {name: i for i, name in enumerate(labels)}
        for key in ("problem_type", "classifier_dropout", "classifier_pooling"):
            if data[key] is None:
                del data[key]
        data["model_type"] = "bert"
        if architecture:
            data["architectures"] = [architecture]
        return data

    @classmethod
    def from_json_file(cls, path: str | Path) -> BertConfig:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_json_file(self, path: str | Path, architecture: str | None = None) -> None:
        text = json.dumps(self.to_dict(architecture), indent=2, sort_keys=True)
        Path(path).write_text(text + "\n", encoding="utf-8")
