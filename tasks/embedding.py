"""Sentence and token embeddings from the bare encoder (the paper's feature-based use). Torch-free.

The bundle's graph does the pooling (mean / cls / max over the real tokens of the last layer, as the
base's sentence-transformers `1_Pooling/config.json` says) and returns every layer's hidden states;
here: the settings read from a sentence-transformers folder, L2 normalization, the choice and
concatenation of layers for token vectors (the paper's best feature-based configuration
concatenates the last four), and cosine similarity.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from tasks import readers
from tasks.common import OFFSETS_NOTE, Refusal, TooLarge, encode_classification_many
from tasks.definition import (
    TRUNCATION,
    Endpoint,
    InputField,
    ListOf,
    Prepared,
    RowLayout,
    StructOf,
    TaskDefinition,
    columns,
    truncation_fields,
)
from tasks.runtime.inference import Keep
from tasks.runtime.tokenizer import EncodedInput, truncation

POOLING_MODES = ("mean", "cls", "max")
DEFAULT_MAX_SEQ_LENGTH = 512
ST_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                   "pooling_mode_max_tokens": "max"}


def sentence_transformers_settings(folder: str | Path) -> dict[str, Any]:
    """Pooling, normalization and max sequence length of a sentence-transformers model folder.

    Reads `modules.json` (is there a Normalize module?), `1_Pooling/config.json` (or the folder its
    Pooling module names) and `sentence_bert_config.json`. A plain BERT folder gets what
    sentence-transformers itself would use for it: mean pooling, no normalization module, and the
    model's position limit (capped at 512).
    """
    folder = Path(folder)
    pooling, normalize, pooling_dir = "mean", False, folder / "1_Pooling"
    modules_file = folder / "modules.json"
    if modules_file.is_file():
        for module in json.loads(modules_file.read_text(encoding="utf-8")):
            kind = str(module.get("type", ""))
            if kind.endswith(".Normalize"):
                normalize = True
            elif kind.endswith(".Pooling"):
                pooling_dir = folder / str(module.get("path", "1_Pooling"))
    if (pooling_dir / "config.json").is_file():
        config = json.loads((pooling_dir / "config.json").read_text(encoding="utf-8"))
        chosen = [mode for key, mode in ST_POOLING_KEYS.items() if config.get(key)]
        others = [k for k, v in config.items() if k.startswith("pooling_mode") and v and k not in ST_POOLING_KEYS]
        if len(chosen) != 1 or others:
            raise ValueError(f"{pooling_dir / 'config.json'}: pooling {chosen + others} is not supported; "
                             f"berth exports exactly one of {POOLING_MODES}")
        pooling = chosen[0]
    max_seq_length = DEFAULT_MAX_SEQ_LENGTH
    model_config = folder / "config.json"
    if model_config.is_file():
        positions = json.loads(model_config.read_text(encoding="utf-8")).get("max_position_embeddings")
        max_seq_length = min(max_seq_length, int(positions or max_seq_length))
    st_config = folder / "sentence_bert_config.json"
    if st_config.is_file():
        max_seq_length = int(json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length") or max_seq_length)
    return {"pooling": pooling, "normalize": normalize, "max_seq_length": max_seq_length}


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (a zero row stays zero), as sentence-transformers' Normalize."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def cosine(source: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Cosine similarity of one vector (H,) with each row of targets (N, H)."""
    return l2_normalize(np.atleast_2d(targets)) @ l2_normalize(source[None, :])[0]


def check_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    """Layer indices into the L + 1 hidden states (0 = the embedding layer's output, -1 = the last layer);
    ValueError names the first that does not exist or repeats."""
    count = num_layers + 1
    seen: set[int] = set()
    for layer in layers:
        if not -count <= layer < count:
            raise ValueError(f"layer {layer} does not exist; this model has hidden states 0..{count - 1} "
                             f"(or -{count}..-1, -1 is the last layer)")
        if layer % count in seen:
            raise ValueError(f"layer {layer} is asked for twice")
        seen.add(layer % count)
    return list(layers)


def select_layers(hidden_states: np.ndarray, length: int, layers: Sequence[int]) -> np.ndarray:
    """(T', L + 1, H) hidden states of one input -> (T, K * H) float32, the `layers` concatenated in the order
    given, padding cut: a copy of only what the token vectors need."""
    features = hidden_states[:length, list(layers), :]  # (T, K, H): fancy indexing copies
    return np.ascontiguousarray(features.reshape(features.shape[0], -1), dtype=np.float32)


def token_vectors(encoded: EncodedInput, tokens: Sequence[str], hidden_states: np.ndarray,
                  layers: Sequence[int]) -> list[dict[str, Any]]:
    """Per text token (special tokens left out): its vector, the chosen layers concatenated in the order
    given, and its character span in the text.

    `hidden_states` is (T', L + 1, H) for this input, T' >= its length (padding is cut here).
    """
    return token_features(encoded, tokens, select_layers(hidden_states, len(encoded), layers))


def token_features(encoded: EncodedInput, tokens: Sequence[str], features: np.ndarray) -> list[dict[str, Any]]:
    """`token_vectors` from the selected features (T, K * H) (`select_layers`)."""
    return [{"token": tokens[i], "start": start, "end": end, "embedding": features[i].tolist()}
            for i, ((start, end), sequence) in enumerate(zip(encoded.offsets, encoded.sequence_ids))
            if sequence is not None]


# Bytes of one float as JSON text ("-0.012345678901234567," is 22): the admission estimate of vectors.
JSON_FLOAT_BYTES = 24


TRUNCATE = ("cut texts (or text pairs, the longer first) longer than the model's max_seq_length, and say "
            "\"truncated\": true; false: refuse them with 413")
MAX_TOKEN_OUTPUT_INPUTS = 16  # inputs of a request with "output": "tokens" (up to ~4 MB of JSON per input)
MAX_TARGETS = 256  # texts compared with one source (similarity)


class EmbedOptions(BaseModel):
    truncate: bool = Field(True, strict=True, description=TRUNCATE)
    normalize: bool | None = Field(
        None, strict=True, description="L2-normalize sentence vectors; default: as the source model does "
                                       "(sentence-transformers' Normalize module; true for the default embeddings "
                                       "model)")
    output: Literal["sentence", "tokens"] = Field(
        "sentence", description="sentence: one pooled vector per input; tokens: a vector per token with its "
                                "character offsets (the feature-based use)")
    layers: list[int] = Field([-1], min_length=1, max_length=13,
                              description="tokens output: hidden layers to concatenate, e.g. [-1, -2, -3, -4] (the "
                                          "paper's best feature-based setting); 0 is the embedding layer")


class SimilarityOptions(BaseModel):
    truncate: bool = Field(True, strict=True, description=TRUNCATE)


EMBED = Endpoint(
    "/v1/embed", "embed", "Sentence embeddings, or token vectors with offsets",
    "`{embedding, truncated}` per input (pooled as the model was trained; L2-normalized by default); with "
    "`\"output\": \"tokens\"` `{tokens: [{token, start, end, embedding}], truncated}`, the `layers` "
    "concatenated. "
    + OFFSETS_NOTE,
    request="EmbedRequest", response="EmbedResponse",
    examples=({"inputs": ["A man is playing a guitar.", "Someone plays an instrument."]},
              {"inputs": "Tim Cook visited Berlin.", "output": "tokens", "layers": [-1, -2, -3, -4]}),
)
OPENAI_EMBEDDINGS = Endpoint(
    "/v1/embeddings", "openai_embeddings", "OpenAI-compatible embeddings",
    "OpenAI's shape: "
    "`{object: list, data: [{object: embedding, index, embedding, truncated, truncated_tokens}],\n"
    "model, usage}`; unit vectors; `encoding_format` float or base64 (little-endian float32). An input "
    "longer than\n"
    "the model takes is a 400 naming it (as OpenAI), unless `\"truncate\": true`. Errors keep berth's shape.",
    request="EmbeddingsRequest", response="EmbeddingsResponse", kind="openai",
)
SIMILARITY = Endpoint(
    "/v1/similarity", "similarity", "Cosine similarity of a source with targets",
    "Per input, the cosine of `source` with each of `targets`, from the same embeddings as /v1/embed; "
    "beside the\n"
    "results, `truncated_tokens` per input (the source's, then each target's).",
    request="SimilarityRequest", response="SimilarityResponse", kind="similarity",
    inputs_description="a {source, targets} object or a list", input_object="SimilarityInput",
    fields=(InputField("source"),
            InputField("targets", many=True, description=f"1 to {MAX_TARGETS} texts compared with source")),
    options=SimilarityOptions, max_texts=MAX_TARGETS,
    examples=({"inputs": {"source": "A man is playing a guitar.",
                          "targets": ["Someone plays an instrument.", "A chef is cooking pasta."]}},),
)

EMBEDDING_MIN_COSINE = 0.99  # fp16/int8 embeddings agree when their cosine with PyTorch's is at least this


class EmbeddingTask(TaskDefinition):
    """Text -> a pooled sentence vector (or per-token vectors of chosen layers). Served at /v1/embed,
    /v1/embeddings (OpenAI's shape) and /v1/similarity, whose request adapters live in the service."""

    name = "embedding"
    head_class = "BertForSentenceEmbedding"
    output_names = ("sentence_embedding", "hidden_states")  # (B, H) pooled; (B, T, L + 1, H) every layer
    token_outputs = ("hidden_states",)
    endpoints = (EMBED, OPENAI_EMBEDDINGS, SIMILARITY)
    options = EmbedOptions
    pipeline_tasks = ("feature-extraction", "sentence-similarity")
    agreement = f"sentence embedding cosine with PyTorch's >= {EMBEDDING_MIN_COSINE}"
    parity_files = ("sst2/dev.tsv", "topics/dev.jsonl")

    def spec_from_checkpoint(self, folder, config, pooling=None):
        """Pooling, normalization and length from the folder's sentence-transformers files (`pooling` overrides)."""
        spec = super().spec_from_checkpoint(folder, config)
        settings = sentence_transformers_settings(folder)
        spec.max_seq_length = settings["max_seq_length"]
        spec.extra = {"pooling": pooling or settings["pooling"], "normalize": settings["normalize"]}
        return spec

    def head_overrides(self, spec):
        return {**super().head_overrides(spec), "pooling_mode": spec.extra.get("pooling", "mean")}

    def check_input(self, bundle, raw, options, index) -> None:
        if options.output == "tokens":
            if index >= MAX_TOKEN_OUTPUT_INPUTS:
                raise TooLarge(f"\"output\": \"tokens\" takes at most {MAX_TOKEN_OUTPUT_INPUTS} inputs per "
                               "request", "inputs")
            try:
                check_layers(options.layers, int(bundle.encoder_config.get("num_hidden_layers", 0)))
            except ValueError as error:
                raise Refusal(str(error), "layers") from None
        elif options.layers != [-1]:
            raise Refusal("only with \"output\": \"tokens\" (sentence vectors pool the last layer)", "layers")

    def prepare_many(self, tokenizer, spec, inputs: Sequence[str], options) -> list[Prepared]:
        encoded = encode_classification_many(tokenizer, inputs, None, max_length=spec.max_seq_length,
                                             truncate=options.truncate,
                                             spans=getattr(options, "output", "sentence") == "tokens")
        return [Prepared([item], item, item.truncated) for item in encoded]

    def keep(self, tokenizer, spec, options) -> Keep:
        """Sentence vectors keep only the pooled output; token vectors only the asked layers of their own tokens
        (never every layer of every token of the pass)."""
        if getattr(options, "output", "sentence") != "tokens":
            return Keep(("sentence_embedding",))
        layers = list(options.layers)
        return Keep(("hidden_states",), lambda item, rows: {"features": select_layers(rows["hidden_states"],
                                                                                        len(item), layers)})

    def response_bytes(self, spec, prepared, options) -> int:
        hidden = int(spec.extra.get("hidden_size") or 1024)
        if getattr(options, "output", "sentence") != "tokens":
            return hidden * JSON_FLOAT_BYTES + 64
        tokens = len(prepared.items[0]) if prepared.items else 0
        return tokens * (len(options.layers) * hidden * JSON_FLOAT_BYTES + 96) + 64

    def sentence_vectors(self, spec, outputs: Sequence[dict[str, np.ndarray]], normalize: bool | None) -> np.ndarray:
        vectors = np.stack([out["sentence_embedding"] for out in outputs]).astype(np.float32)  # (N, H)
        if spec.extra.get("normalize", True) if normalize is None else normalize:
            vectors = l2_normalize(vectors)
        return vectors

    def decode(self, tokenizer, spec, prepared, outputs, options) -> list[Any]:
        if options.output == "tokens":
            return [{"tokens": token_features(p.state, [tokenizer.id_to_token(i) for i in p.state.input_ids],
                                              out[0]["features"]), **truncation(p.state)}
                    for p, out in zip(prepared, outputs)]
        vectors = self.sentence_vectors(spec, [out[0] for out in outputs], options.normalize)
        return [{"embedding": vector.tolist(), **truncation(p.state)} for vector, p in zip(vectors, prepared)]

    def row_layout(self, spec, options) -> RowLayout:
        """`embedding` (float32, the model's own precision), or with "output": "tokens" `tokens`: each token's
        text, offsets and vector; the truncation beside them."""
        vector = ListOf("float32")
        if options.output == "tokens":
            token = StructOf(columns(("token", "string"), ("start", "int64"), ("end", "int64"), ("embedding", vector)))
            return RowLayout(columns(("tokens", ListOf(token))) + TRUNCATION,
                             lambda r: {"tokens": r["tokens"], **truncation_fields(r)})
        return RowLayout(columns(("embedding", vector)) + TRUNCATION,
                         lambda r: {"embedding": r["embedding"], **truncation_fields(r)})

    def parity_answer(self, tokenizer, spec, prepared, outputs) -> Hashable:
        return tuple(float(x) for x in outputs[0]["sentence_embedding"])

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        return readers.read_sentences(path, size)


DEFINITIONS = (EmbeddingTask(),)
