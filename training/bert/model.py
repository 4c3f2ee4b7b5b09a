"""The BERT encoder, the five fine-tuning shapes of the paper and its feature extractor, in PyTorch.

Parameter names follow Hugging Face's `modeling_bert` exactly, so checkpoints move between the two
with no renaming (see training/bert/checkpoint.py).

Shape letters: B batch, T sequence length, H hidden size, A attention heads, D = H / A head size,
V vocabulary size, C number of labels or choices.

Why one file of ~600 lines: as nanoGPT's model.py, the whole model reads in one sitting as small classes (none over
60 lines), each head a few lines on top of the encoder, in the order and with the names of `modeling_bert`.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tasks.embedding import check_layers
from training.bert.config import BertConfig

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # exact erf form, as BERT uses
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}

# "sdpa": torch's fused scaled_dot_product_attention (fast for training and eager inference).
# "eager": the explicit softmax(QK^T / sqrt(D) + mask) V graph, which ONNX Runtime's offline
# optimizer recognizes and fuses into its Attention operator; export switches to it.
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class BertEmbeddings(nn.Module):
    """token + position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        positions = torch.arange(config.max_position_embeddings).unsqueeze(0)
        self.register_buffer("position_ids", positions, persistent=False)  # (1, max_positions)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids)  # (B, T, H)
        x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(self.position_ids[:, :T])  # (1, T, H) broadcast
        return self.dropout(self.LayerNorm(x))


# On CUDA, torch may pick cuDNN's attention, which builds a new execution graph (hundreds of ms) for every new
# sequence length; with length-grouped batches nearly every step has a new one, and an H100 fine-tuning SQuAD
# spent most of each step there. Flash and memory-efficient attention have no per-shape set-up.
_CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _sdpa_backends(q: Tensor):
    return sdpa_kernel(_CUDA_SDPA_BACKENDS) if q.is_cuda else contextlib.nullcontext()


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob
        self.implementation = "sdpa"

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, A, T, D)

    def forward(self, hidden: Tensor, additive_mask: Tensor) -> Tensor:
        """hidden (B, T, H); additive_mask (B, 1, 1, T): 0 where attended, a large negative at padding."""
        B, T, H = hidden.shape
        q, k, v = self._heads(self.query(hidden)), self._heads(self.key(hidden)), self._heads(self.value(hidden))
        dropout = self.dropout_prob if self.training else 0.0
        if self.implementation == "sdpa":
            with _sdpa_backends(q):
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask, dropout_p=dropout)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)  # (B, A, T, T)
            probs = F.dropout(torch.softmax(scores + additive_mask, dim=-1), p=dropout, training=self.training)
            context = torch.matmul(probs, v)  # (B, A, T, D)
        return context.transpose(1, 2).reshape(B, T, H)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)  # post-LayerNorm


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden: Tensor, additive_mask: Tensor) -> Tensor:
        return self.output(self.self(hidden, additive_mask), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _activation(config.hidden_act)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.act(self.dense(hidden))  # (B, T, 4H)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden: Tensor, additive_mask: Tensor) -> Tensor:
        attended = self.attention(hidden, additive_mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden: Tensor, additive_mask: Tensor, all_layers: bool = False) -> Tensor | list[Tensor]:
        """The last layer's output, or with `all_layers` the input and every layer's output (L + 1)."""
        states = [hidden]
        for layer in self.layer:
            hidden = layer(hidden, additive_mask)
            states.append(hidden)
        return states if all_layers else hidden


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence representation the NSP and sentence-level heads read."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden: Tensor) -> Tensor:
        return self.activation(self.dense(hidden[:, 0]))  # (B, H)


class BertPreTrainedModel(nn.Module):
    """Shared initialization and the attention switch for every BERT model here."""

    config: BertConfig

    def init_weights(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for name, param in self.named_parameters():
            if name.endswith("predictions.bias"):
                nn.init.zeros_(param)

    def set_attention_implementation(self, name: str) -> None:
        if name not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention implementation must be one of {ATTENTION_IMPLEMENTATIONS}")
        for module in self.modules():
            if isinstance(module, BertSelfAttention):
                module.implementation = name

    def _encode(self, input_ids, attention_mask, token_type_ids) -> tuple[Tensor, Tensor | None]:
        bert: BertModel = self if isinstance(self, BertModel) else self.bert
        out = bert(input_ids, attention_mask, token_type_ids)
        return out["last_hidden_state"], out.get("pooler_output")


class BertModel(BertPreTrainedModel):
    """The encoder: embeddings, L Transformer blocks and (optionally) the pooler."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> dict[str, Tensor]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        # (B, 1, 1, T): 0 for real tokens, the dtype's most negative value for padding.
        additive_mask = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
        states = self.encoder(hidden, additive_mask, all_layers=True)
        hidden = states[-1]
        out = {"last_hidden_state": hidden}
        if output_hidden_states:
            out["hidden_states"] = torch.stack(states, dim=2)  # (B, T, L + 1, H)
        if self.pooler is not None:
            out["pooler_output"] = self.pooler(hidden)
        return out


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = _activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden)))


class BertLMPredictionHead(nn.Module):
    """Transform + LayerNorm, then a decoder tied to the word embeddings, with its own bias."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.transform(hidden)) + self.bias  # (..., V)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)


def _masked_lm(predictions: BertLMPredictionHead, hidden: Tensor, labels: Tensor | None) -> dict[str, Tensor]:
    """MLM logits; with labels, the loss and accuracy over the chosen positions only.

    With labels the decoder runs only on the chosen positions (about 15%): the (B, T, V) product is
    the largest matrix in pretraining, and skipping the unchosen rows saves most of it.
    """
    if labels is None:
        return {"prediction_logits": predictions(hidden)}
    chosen = labels != -100  # (B, T)
    logits = predictions(hidden[chosen])  # (N, V)
    targets = labels[chosen]
    if targets.numel() == 0:
        zero = hidden.sum() * 0.0
        return {"mlm_loss": zero, "mlm_accuracy": zero.detach()}
    loss = F.cross_entropy(logits.float(), targets)
    accuracy = (logits.argmax(-1) == targets).float().mean()
    return {"mlm_loss": loss, "mlm_accuracy": accuracy.detach()}


class BertForPreTraining(BertPreTrainedModel):
    """Masked LM + next-sentence prediction, the paper's pretraining objective."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, next_sentence_label=None):
        hidden, pooled = self._encode(input_ids, attention_mask, token_type_ids)
        out = _masked_lm(self.cls.predictions, hidden, labels)
        out["seq_relationship_logits"] = nsp_logits = self.cls.seq_relationship(pooled)  # (B, 2)
        if labels is not None:
            out["loss"] = out["mlm_loss"]
        if next_sentence_label is not None:
            scored = next_sentence_label != -100  # -100: no NSP target (the --no-nsp ablation)
            if scored.any():
                nsp_loss = F.cross_entropy(nsp_logits[scored].float(), next_sentence_label[scored])
                out["nsp_loss"] = nsp_loss
                out["nsp_accuracy"] = (nsp_logits[scored].argmax(-1) == next_sentence_label[scored]).float().mean()
                out["loss"] = out.get("loss", 0.0) + nsp_loss
        return out


class BertForMaskedLM(BertPreTrainedModel):
    """Masked LM only: the fill-mask model (and the --no-nsp pretraining ablation)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config, self.bert.embeddings.word_embeddings)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        hidden, _ = self._encode(input_ids, attention_mask, token_type_ids)
        out = _masked_lm(self.cls.predictions, hidden, labels)
        if labels is None:
            out["logits"] = out.pop("prediction_logits")
        else:
            out["loss"] = out["mlm_loss"]
        return out


def _dropout(config: BertConfig) -> nn.Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


def _problem_type(config: BertConfig, labels: Tensor) -> str:
    if config.problem_type:
        return config.problem_type
    if config.num_labels == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The average of the hidden states over real tokens, as sentence-transformers' mean pooling."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, H)


class BertForSequenceClassification(BertPreTrainedModel):
    """A label (or a score, with num_labels == 1) for a text or a sentence pair.

    It reads the tanh pooler over [CLS] (config.classifier_pooling "cls", BERT's recipe) or the mean of
    the last hidden states over real tokens ("mean"; the model then has no pooler weights).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.pooling = config.classifier_pooling or "cls"
        self.bert = BertModel(config, add_pooling_layer=self.pooling == "cls")
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if input_ids.dim() == 3:
            return self._forward_candidates(input_ids, attention_mask, token_type_ids, labels)
        hidden, pooled = self._encode(input_ids, attention_mask, token_type_ids)
        if self.pooling == "mean":
            pooled = mean_pool(hidden, attention_mask if attention_mask is not None else torch.ones_like(input_ids))
        logits = self.classifier(self.dropout(pooled))  # (B, C)
        out = {"logits": logits}
        if labels is not None:
            kind = _problem_type(self.config, labels)
            if kind == "regression":
                out["loss"] = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            elif kind == "single_label_classification":
                out["loss"] = F.cross_entropy(logits.float(), labels)
                out["accuracy"] = (logits.argmax(-1) == labels).float().mean()
            else:
                out["loss"] = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return out

    def _forward_candidates(self, input_ids, attention_mask, token_type_ids, labels):
        """(B, C, T): C candidates per example (reranking), each scored alone by the one-label head: logits (B, C).
        With labels (B,), the index of each example's relevant candidate: softmax cross-entropy over the
        candidates (listwise), or with problem_type multi_label_classification binary cross-entropy per
        candidate (pointwise)."""
        B, C, T = input_ids.shape
        flat = lambda x: None if x is None else x.reshape(B * C, T)  # noqa: E731
        logits = self.forward(flat(input_ids), flat(attention_mask), flat(token_type_ids))["logits"].view(B, C)
        out = {"logits": logits}
        if labels is not None:
            if self.config.problem_type == "multi_label_classification":
                target = F.one_hot(labels, C).float()
                out["loss"] = F.binary_cross_entropy_with_logits(logits.float(), target)
            else:
                out["loss"] = F.cross_entropy(logits.float(), labels)
            out["accuracy"] = (logits.argmax(-1) == labels).float().mean()
        return out


class BertForTokenClassification(BertPreTrainedModel):
    """A label per token (NER); positions labelled -100 are left out of the loss."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        hidden, _ = self._encode(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(hidden))  # (B, T, C)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
            scored = labels != -100
            out["accuracy"] = (logits.argmax(-1)[scored] == labels[scored]).float().mean()
        return out


# The paper's best feature-based configuration (Table 7): the last four hidden layers, concatenated.
DEFAULT_FEATURE_LAYERS = (-4, -3, -2, -1)


def reverse_within_length(x: Tensor, attention_mask: Tensor) -> Tensor:
    """Each row's real positions in reverse order, padding left where it is (right padding assumed).

    x (B, T, F), attention_mask (B, T). Applying it twice gives x back. Positions come from a cumsum,
    not arange(T), so the ONNX trace keeps the sequence axis dynamic.
    """
    positions = torch.ones_like(attention_mask).cumsum(1) - 1  # (B, T): 0 .. T-1
    lengths = attention_mask.sum(1, keepdim=True)  # (B, 1)
    source = torch.where(positions < lengths, lengths - 1 - positions, positions)  # (B, T)
    return torch.gather(x, 1, source.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


class PaddingFreeBiLSTM(nn.Module):
    """A stacked bidirectional LSTM whose outputs at real tokens do not depend on the padding.

    torch's bidirectional nn.LSTM reads a right-padded batch's padding before the real tokens in its
    backward direction (unless the batch is packed, which the ONNX exporter does not carry). Here each
    direction is its own one-layer LSTM and the backward one reads every row reversed within its own
    length, so the same sentence gets the same outputs alone or in any dynamic batch.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int):
        super().__init__()
        sizes = [input_size] + [2 * hidden_size] * (num_layers - 1)
        self.forward_layers = nn.ModuleList(nn.LSTM(n, hidden_size, batch_first=True) for n in sizes)
        self.backward_layers = nn.ModuleList(nn.LSTM(n, hidden_size, batch_first=True) for n in sizes)

    def forward(self, x: Tensor, attention_mask: Tensor) -> Tensor:
        """x (B, T, F) -> (B, T, 2 * hidden_size)."""
        for forward_lstm, backward_lstm in zip(self.forward_layers, self.backward_layers):
            ahead, _ = forward_lstm(x)  # (B, T, h)
            behind, _ = backward_lstm(reverse_within_length(x, attention_mask))
            x = torch.cat([ahead, reverse_within_length(behind, attention_mask)], dim=-1)  # (B, T, 2h)
        return x


class BertFeatureBasedTokenClassification(BertPreTrainedModel):
    """Feature-based NER (the paper's Table 7): a BiLSTM and a linear tag layer over the FROZEN encoder's
    hidden layers concatenated (config.extra: `feature_layers`, `lstm_hidden_size`, `lstm_layers`).

    `forward` runs the encoder (serving, evaluation, export) or takes precomputed `features` (B, T, K * H)
    (training over a cache: the encoder never runs there, so it stays exactly as loaded).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        layers = check_layers([int(i) for i in config.extra.get("feature_layers", DEFAULT_FEATURE_LAYERS)],
                              config.num_hidden_layers)
        self.feature_layers = [i % (config.num_hidden_layers + 1) for i in layers]  # indices into the L + 1 states
        hidden = int(config.extra.get("lstm_hidden_size", 256))
        self.lstm = PaddingFreeBiLSTM(len(self.feature_layers) * config.hidden_size, hidden,
                                      int(config.extra.get("lstm_layers", 1)))
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(2 * hidden, config.num_labels)
        self.init_weights()
        self.bert.requires_grad_(False)

    def token_features(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """The chosen hidden layers concatenated per token: (B, T, K * H)."""
        states = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states=True)["hidden_states"]
        return states[:, :, self.feature_layers].flatten(2)  # (B, T, L + 1, H) -> (B, T, K * H)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, features=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if features is None:
            features = self.token_features(input_ids, attention_mask, token_type_ids)
        hidden = self.lstm(self.dropout(features.float()), attention_mask)  # (B, T, 2h)
        logits = self.classifier(self.dropout(hidden))  # (B, T, C)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            scored = labels != -100
            out["accuracy"] = (logits.argmax(-1)[scored] == labels[scored]).float().mean()
        return out


class BertForQuestionAnswering(BertPreTrainedModel):
    """Start and end logits per token: the answer is the best span (SQuAD)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None, end_positions=None):
        hidden, _ = self._encode(input_ids, attention_mask, token_type_ids)
        start_logits, end_logits = self.qa_outputs(hidden).unbind(-1)  # (B, T) each
        out = {"start_logits": start_logits, "end_logits": end_logits}
        if start_positions is not None and end_positions is not None:
            T = start_logits.shape[1]
            # Positions outside the sequence are ignored, as in the reference implementation.
            start = start_positions.clamp(0, T)
            end = end_positions.clamp(0, T)
            loss_start = F.cross_entropy(start_logits.float(), start, ignore_index=T)
            loss_end = F.cross_entropy(end_logits.float(), end, ignore_index=T)
            out["loss"] = (loss_start + loss_end) / 2
        return out


class BertForSentenceEmbedding(BertPreTrainedModel):
    """The bare encoder as a feature extractor: a pooled sentence vector and every layer's token vectors.

    Pooling (`config.extra["pooling_mode"]`: mean, cls or max over the real tokens of the last layer)
    follows sentence-transformers' Pooling module, so an exported sentence-transformers model answers
    as that library does. L2 normalization is left to the caller (a per-request choice).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.pooling_mode = config.extra.get("pooling_mode", "mean")
        if self.pooling_mode not in ("mean", "cls", "max"):
            raise ValueError(f"unsupported pooling_mode {self.pooling_mode!r}; use mean, cls or max")
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        states = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states=True)["hidden_states"]
        last = states[:, :, -1]  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(last.dtype)  # (B, T, 1)
        if self.pooling_mode == "cls":
            pooled = last[:, 0]
        elif self.pooling_mode == "max":
            pooled = (last + (1.0 - mask) * torch.finfo(last.dtype).min).amax(dim=1)
        else:
            pooled = (last * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # (B, H)
        return {"sentence_embedding": pooled, "hidden_states": states}


class BertForMultipleChoice(BertPreTrainedModel):
    """One score per choice (SWAG): inputs are (B, C, T), logits (B, C).

    Inputs of (B, T) are B choices scored one by one, logits (B, 1): how the service runs it (every
    choice is its own sequence in the dynamic batch) and how evaluation runs it.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if input_ids.dim() == 2:
            _, pooled = self._encode(input_ids, attention_mask, token_type_ids)
            return {"logits": self.classifier(self.dropout(pooled))}  # (B, 1)
        B, C, T = input_ids.shape
        flat = lambda x: None if x is None else x.reshape(B * C, T)  # noqa: E731
        _, pooled = self._encode(flat(input_ids), flat(attention_mask), flat(token_type_ids))
        logits = self.classifier(self.dropout(pooled)).view(B, C)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.float(), labels)
            out["accuracy"] = (logits.argmax(-1) == labels).float().mean()
        return out


MODEL_CLASSES: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForMaskedLM,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertFeatureBasedTokenClassification,
        BertForQuestionAnswering,
        BertForMultipleChoice,
        BertForSentenceEmbedding,
    )
}
