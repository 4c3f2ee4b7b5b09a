"""What a saved head is to transformers: the same model, or one it refuses rather than loads wrong.

transformers' BERT heads read the tanh pooler over [CLS]. A berth head that pools otherwise (mean pooling, the
default on the default base: measured in bench/pooling_finetune.py, CLS pooling costs accuracy there) or that has
no transformers class (the feature-based BiLSTM tagger) would load there without an error as a different model,
with a random pooler or tagger. So such a folder names a model type of its own in config.json, which transformers
refuses ("unrecognized model"). A mean-pooled head also carries its code (`berth_modeling.py`, a subclass of
transformers' BertForSequenceClassification that pools as berth does), named in config.json's `auto_map`: with
`trust_remote_code=True`, transformers' Auto classes and pipelines load it as the same model. Every other head
is plain `bert`: transformers' own classes give berth's answers.
"""

from __future__ import annotations

import json
from pathlib import Path

MEAN_POOLED_TYPE = "berth_mean_pooled_bert"
FEATURE_BASED_TYPE = "berth_feature_based_bert"
BERTH_MODEL_TYPES = (MEAN_POOLED_TYPE, FEATURE_BASED_TYPE)  # what training.bert.checkpoint reads besides "bert"
CODE_FILE = "berth_modeling.py"

# Copied into a mean-pooled head's folder; transformers imports it there, berth never does.
MEAN_POOLED_CODE = '''"""Mean-pooled BERT sequence classification, as berth trains and serves it.

transformers' BertForSequenceClassification reads the tanh pooler over [CLS]; this head reads the mean of the
last hidden states over the real tokens. Load with trust_remote_code=True.
"""

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification, BertModel
from transformers.modeling_outputs import SequenceClassifierOutput


class BerthMeanPooledBertConfig(BertConfig):
    model_type = "berth_mean_pooled_bert"


class BerthMeanPooledBertForSequenceClassification(BertForSequenceClassification):
    config_class = BerthMeanPooledBertConfig

    def __init__(self, config):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)  # no pooler: it is not used
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, H)
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            if self.config.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)
'''


def model_type_of(architecture: str, pooling: str | None) -> str:
    """The config.json model_type a head of this class and pooling is saved under."""
    if architecture == "BertFeatureBasedTokenClassification":
        return FEATURE_BASED_TYPE
    if architecture == "BertForSequenceClassification" and pooling == "mean":
        return MEAN_POOLED_TYPE
    return "bert"


def mark_for_transformers(folder: Path, architecture: str, pooling: str | None) -> None:
    """Rewrite a just-saved folder's config.json (and add the code file) for what the head is to transformers."""
    model_type = model_type_of(architecture, pooling)
    (folder / CODE_FILE).unlink(missing_ok=True)
    if model_type == "bert":
        return
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["model_type"] = model_type
    if model_type == MEAN_POOLED_TYPE:
        config["architectures"] = ["BerthMeanPooledBertForSequenceClassification"]
        module = CODE_FILE.removesuffix(".py")
        config["auto_map"] = {"AutoConfig": f"{module}.BerthMeanPooledBertConfig",
                              "AutoModelForSequenceClassification":
                                  f"{module}.BerthMeanPooledBertForSequenceClassification"}
        (folder / CODE_FILE).write_text(MEAN_POOLED_CODE, encoding="utf-8")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def loading_instructions(folder: Path, name: str | None = None) -> str:
    """The model card's sentence on loading the folder in transformers, from its config.json; `name`: the folder
    as the user knows it (default: its name)."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model_type, name = config.get("model_type", "bert"), name or folder.name
    if model_type == MEAN_POOLED_TYPE:
        return (f"In transformers it loads with its own code ({CODE_FILE}: mean pooling, as berth trained it): "
                f"`pipeline(\"text-classification\", model=\"{name}\", trust_remote_code=True)` or "
                f"`AutoModelForSequenceClassification.from_pretrained(\"{name}\", trust_remote_code=True)`. Without "
                "`trust_remote_code=True` transformers refuses it: its own BertForSequenceClassification reads a "
                "[CLS] pooler this head does not have, and would give other answers.")
    if model_type == FEATURE_BASED_TYPE:
        return ("transformers has no class for this head (a BiLSTM tagger over the frozen encoder's last four "
                "layers) and refuses the folder; load it with berth (`training.bert.checkpoint.load_pretrained`) or "
                "serve its bundle.")
    architecture = (config.get("architectures") or ["BertModel"])[0]
    return (f"In transformers it is the same model: `{architecture}.from_pretrained(\"{name}\")` (or the "
            "matching `AutoModelFor...` class and `pipeline`).")
