"""The wire formats of other servers, on the same server: each foreign request is translated into berth's own
request model and run through the one request path (`service.inference.infer`), so limits, batching, metrics,
the API key and errors are those of /v1; only the request and response shapes differ.

- `hf.py`: the Hugging Face Inference API (`POST /models/{name}`), what `huggingface_hub.InferenceClient` sends;
- `tei.py`: text-embeddings-inference's routes (`/embed`, `/embed_all`, `/predict`, `/rerank`, `/tokenize`,
  `/decode`, `/info`);
- `errors.py`: TEI's error shape, which the app also gives the request guard for its refusals on TEI's paths.

OpenAI's `/v1/embeddings` is a /v1 route (service/routes.py).
"""
