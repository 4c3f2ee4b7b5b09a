"""The naive peer: the FastAPI app a user would write first, one transformers pipeline call per request.

It serves the same fine-tuned checkpoint folder as berth's bundle (PyTorch, fp32), with berth's route
and request shape for one input (/v1/classify, /v1/pair, /v1/ner, /v1/qa; the pipeline's own result),
so the load benchmark drives both with the same request: `text-classification` (with `text_pair` for
pairs), `token-classification` with simple aggregation, `question-answering` with the checkpoint's
window settings; embeddings with sentence-transformers' `encode` (also on OpenAI's `/v1/embeddings`), and
rerank with sentence-transformers' `CrossEncoder.predict` of every (query, document) pair in one call
(`/v1/rerank`, Cohere's request: the documents most relevant first). The endpoint is a plain `def` (FastAPI runs
it in its thread pool); an `async def` calling the pipeline inline would block the event loop outright.

    .venv/bin/python -m bench.naive_peer --checkpoint <fine-tuned folder> --task ner --port 8001 [--threads 2]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

PIPELINES = {"classification": "text-classification", "pair": "text-classification",
             "ner": "token-classification", "qa": "question-answering", "fill-mask": "fill-mask",
             "embedding": "sentence-transformers", "multiple-choice": "multiple-choice (by hand)",
             "rerank": "sentence-transformers CrossEncoder"}


class Text(BaseModel):
    inputs: str


class Pair(BaseModel):
    inputs: dict[str, str]


class OpenAIEmbeddings(BaseModel):
    input: str | list[str]
    model: str | None = None


class Rerank(BaseModel):
    query: str
    documents: list[str]
    top_n: int | None = None
    model: str | None = None


def _plain(value: Any) -> Any:
    """numpy scalars in pipeline results -> JSON-able Python values."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if hasattr(value, "item") else value


def create_app(checkpoint: str, threads: int, task: str = "classification") -> FastAPI:
    import torch
    from transformers import pipeline

    torch.set_num_threads(threads)
    settings = json.loads((Path(checkpoint) / "berth_task.json").read_text()) if task == "qa" else {}
    if task == "qa":  # transformers 5 removed the question-answering pipeline: the few lines a user writes
        model = _qa_answerer(checkpoint, settings.get("max_seq_length", 384), settings.get("doc_stride", 128))
    elif task == "embedding":
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(checkpoint, device="cpu")
    elif task == "multiple-choice":
        model = _chooser(checkpoint)
    elif task == "rerank":
        from sentence_transformers import CrossEncoder

        # the checkpoint's own window (berth_task.json), as berth serves it
        task_file = Path(checkpoint) / "berth_task.json"
        max_length = json.loads(task_file.read_text()).get("max_seq_length") if task_file.is_file() else None
        model = CrossEncoder(checkpoint, device="cpu", max_length=max_length)
    else:
        kwargs = {"aggregation_strategy": "simple"} if task == "ner" else {}
        model = pipeline(PIPELINES[task], model=checkpoint, device=-1, **kwargs)
    app = FastAPI(title="naive peer")

    if task == "classification":
        @app.post("/v1/classify")
        def classify(body: Text) -> dict:
            return {"model": "naive", "results": _plain(model(body.inputs, truncation=True))}
    elif task == "pair":
        @app.post("/v1/pair")
        def pair(body: Pair) -> dict:
            result = model({"text": body.inputs["text"], "text_pair": body.inputs["text_pair"]}, truncation=True)
            return {"model": "naive", "results": _plain([result] if isinstance(result, dict) else result)}
    elif task == "ner":
        @app.post("/v1/ner")
        def entities(body: Text) -> dict:
            return {"model": "naive", "results": [_plain(model(body.inputs))]}
    elif task == "qa":
        @app.post("/v1/qa")
        def answer(body: Pair) -> dict:
            return {"model": "naive", "results": [model(body.inputs["question"], body.inputs["context"])]}
    elif task == "fill-mask":
        @app.post("/v1/fill-mask")
        def fill(body: Text) -> dict:
            return {"model": "naive", "results": [_plain(model(body.inputs, top_k=5))]}
    elif task == "embedding":
        @app.post("/v1/embed")
        def embed(body: Text) -> dict:
            return {"model": "naive", "results": [model.encode(body.inputs).tolist()]}

        @app.post("/v1/embeddings")
        def embeddings(body: OpenAIEmbeddings) -> dict:
            texts = [body.input] if isinstance(body.input, str) else body.input
            vectors = model.encode(texts).tolist()
            return {"object": "list", "model": body.model or "naive",
                    "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]}
    elif task == "rerank":
        @app.post("/v1/rerank")
        def rerank(body: Rerank) -> dict:
            scores = model.predict([(body.query, document) for document in body.documents]).tolist()
            ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:body.top_n]
            return {"model": "naive", "results": [{"index": i, "relevance_score": scores[i]} for i in ranked]}
    else:
        @app.post("/v1/choice")
        def choose(body: Choice) -> dict:
            return {"model": "naive", "results": [model(body.inputs["context"], body.inputs["choices"])]}

    @app.get("/readyz")
    def readyz() -> dict:
        return {"status": "ready"}

    return app


class Choice(BaseModel):
    inputs: dict[str, Any]


def _chooser(checkpoint: str):
    """Context + choices -> the best choice: one forward of all (context, choice) pairs per request."""
    import torch
    from transformers import AutoModelForMultipleChoice, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForMultipleChoice.from_pretrained(checkpoint).eval()

    def choose(context: str, choices: list[str]) -> dict:
        encoded = tokenizer([context] * len(choices), choices, truncation=True, padding=True, return_tensors="pt")
        with torch.inference_mode():
            logits = model(**{k: v[None] for k, v in encoded.items()}).logits[0]  # (C,)
        return {"choice": int(logits.argmax()), "scores": logits.softmax(-1).tolist()}

    return choose


def _qa_answerer(checkpoint: str, max_length: int, stride: int, max_answer_tokens: int = 30):
    """Question + context -> the best span over all windows, one forward of all windows per request."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForQuestionAnswering.from_pretrained(checkpoint).eval()

    def answer(question: str, context: str) -> dict:
        encoded = tokenizer(question, context, truncation="only_second", max_length=max_length,
                            stride=stride, return_overflowing_tokens=True,
                            return_offsets_mapping=True, padding=True, return_tensors="pt")
        offsets = encoded.pop("offset_mapping")
        encoded.pop("overflow_to_sample_mapping", None)
        with torch.inference_mode():
            out = model(**encoded)
        best = (float("-inf"), 0, 0)
        for w in range(offsets.shape[0]):
            in_context = torch.tensor([s == 1 for s in encoded.sequence_ids(w)])
            scores = out.start_logits[w][:, None] + out.end_logits[w][None, :]  # (T, T): start i, end j
            allowed = in_context[:, None] & in_context[None, :]
            allowed &= (torch.triu(torch.ones_like(allowed), 0)
                        & ~torch.triu(torch.ones_like(allowed), max_answer_tokens))
            scores = scores.masked_fill(~allowed, float("-inf"))
            flat = int(scores.argmax())
            i, j = divmod(flat, scores.shape[1])
            if float(scores[i, j]) > best[0]:
                best = (float(scores[i, j]), int(offsets[w, i, 0]), int(offsets[w, j, 1]))
        return {"answer": context[best[1]:best[2]], "start": best[1], "end": best[2], "score": best[0]}

    return answer


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="fine-tuned folder (Hugging Face format)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--task", choices=sorted(PIPELINES), default="classification")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    uvicorn.run(create_app(args.checkpoint, args.threads, args.task), host=args.host, port=args.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
