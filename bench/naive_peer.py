"""The naive peer: the FastAPI app a user would write first, one transformers pipeline call per request.

It serves the same fine-tuned checkpoint folder as berth's bundle (PyTorch, fp32), with the same
request and response shape as berth's /v1/classify for one text, so the load benchmark can drive
both with the same client. The endpoint is a plain `def` (FastAPI runs it in its thread pool); an
`async def` calling the pipeline inline would block the event loop outright (GUIDE.md §5).

    .venv/bin/python -m bench.naive_peer --checkpoint <fine-tuned folder> --port 8001 [--threads 2]
"""

from __future__ import annotations

import argparse

from fastapi import FastAPI
from pydantic import BaseModel


class Body(BaseModel):
    inputs: str


def create_app(checkpoint: str, threads: int) -> FastAPI:
    import torch
    from transformers import pipeline

    torch.set_num_threads(threads)
    classifier = pipeline("text-classification", model=checkpoint, device=-1)
    app = FastAPI(title="naive peer")

    @app.post("/v1/classify")
    def classify(body: Body) -> dict:
        result = classifier(body.inputs, truncation=True)[0]
        return {"model": "naive", "results": [{"label": result["label"], "score": float(result["score"])}]}

    @app.get("/readyz")
    def readyz() -> dict:
        return {"status": "ready"}

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="fine-tuned folder (Hugging Face format)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    uvicorn.run(create_app(args.checkpoint, args.threads), host=args.host, port=args.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
