"""docker/Dockerfile and docker/Dockerfile.gpu, built and started for real (tests/deploy/images.py says
how without a Docker engine): the image holds what the Dockerfile promises, and `berth serve`, started
from the image's own entrypoint, environment and user with real bundles read-only at /models, answers
every route, passes the image's HEALTHCHECK and exits cleanly on SIGTERM.

The GPU image is built on the same local Debian base for both of its stages: ubuntu:24.04 and
nvidia/cuda:*-cudnn-runtime cannot be pulled here (neither Docker Hub nor NVIDIA's registry or apt
repository is reachable), and there is no GPU. So its Python is 3.11, not Ubuntu's 3.12; what is
checked is everything but CUDA itself: the onnxruntime-gpu install, its CUDA provider compiled in and
linking to nothing but the CUDA / cuDNN libraries the CUDA base image brings, and the service on the
image's defaults (BERTH_DEVICE=auto) falling back to the CPU where CUDA cannot start.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.deploy.conftest import DOCKER, free_port, tail, wait_for
from tests.deploy.images import (
    Build,
    Container,
    Image,
    base_image,
    healthcheck_command,
    require_image_tools,
    run_in,
)

SENTENCES = ["A charming and often affecting journey.", "Unflinchingly bleak and desperate.",
             "Ein Film über die Stadt, naïve und schön — 東京の夜."]
NER_TEXT = "We flew to Tokyo, then on to Sydney."
QA_CONTEXT = ("The river walked slowly along the old market road. The library was founded in 1911. "
              "Children played near the water in the evening.")
# What `docker run -e` would add: a loopback port (the process shares the host's network), small
# length buckets and one ONNX Runtime thread (two cores are shared with the test and the neighbours).
RUN_ENV = {"BERTH_HOST": "127.0.0.1", "BERTH_LENGTH_BUCKETS": "16,32,64,128", "BERTH_INTRA_OP_THREADS": "1"}
# The bundles the test serves (tests/service/models_for_tests.py) and the routes of their tasks.
BUNDLES = ("sentiment", "similarity", "entities", "reader")
GOLD_ROUTES = {"/v1/classify", "/v1/pair", "/v1/ner", "/v1/qa"}
COMPILERS = re.compile(r"(cc|c\+\+|gcc|g\+\+|clang|clang\+\+|tcc|x86_64-linux-gnu-(gcc|g\+\+))(-[\d.]+)?")
# The libraries the CUDA provider may miss on a base without CUDA: those the
# nvidia/cuda:12.x-cudnn-runtime image provides (docs/DEPLOY.md lists them), nothing else.
CUDA_RUNTIME_LIBRARIES = re.compile(r"lib(cudart|cublas|cublasLt|cufft|curand|nvrtc|cudnn)\.so\.\d+")


@dataclass
class ImageCase:
    name: str
    dockerfile: Path
    base_args: tuple[str, ...]  # the build arguments that name a base image
    max_megabytes: int
    extra_args: dict[str, str] = field(default_factory=dict)


CASES = {
    # Measured 439 MB: the 178 MB base and the 261 MB virtualenv.
    "cpu": ImageCase("cpu", DOCKER / "Dockerfile", ("PYTHON_IMAGE",), max_megabytes=550),
    # Measured 978 MB on the Debian stand-in for the CUDA base (its virtualenv with onnxruntime-gpu is 706 MB); the
    # real nvidia/cuda cudnn-runtime base adds its CUDA and cuDNN libraries (several GB) on top.
    "gpu": ImageCase("gpu", DOCKER / "Dockerfile.gpu", ("UBUNTU_IMAGE", "CUDA_IMAGE"), max_megabytes=1200),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="module")
def base(work) -> str:
    require_image_tools()
    return base_image(work)


@pytest.fixture(scope="module")
def models(work, bundle_repository, checkpoints) -> tuple[Path, dict[str, Path]]:
    """Four of the test repository's real bundles (classification, pair regression, NER, QA; made from the real
    checkpoint by tests/service/models_for_tests.py), copied read-only for everyone (the image's user is not the
    owner), and the fine-tuned folders they came from."""
    repository = work / "models"
    for name in BUNDLES:
        shutil.copytree(bundle_repository / name, repository / name)
    for path in [repository, *repository.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    return repository, {name: checkpoints[name] for name in BUNDLES}


# The GPU image costs ~5 min to build whenever the sources change (a 280 MB wheel, a 700 MB virtualenv
# to commit): `slow`, out of the default run (`make test-all` runs it).
IMAGE_PARAMS = ["cpu", pytest.param("gpu", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=IMAGE_PARAMS)
def image(request, base, work):
    case = CASES[request.param]
    args = {**{name: base for name in case.base_args}, **case.extra_args}
    tag = f"localhost/berth-test:{case.name}"
    build = Build(case.dockerfile, tag, args, work / f"build-{case.name}.log")
    try:
        request.getfixturevalue("models")  # built while podman builds: the two share two cores well
    finally:
        seconds = build.wait()
    built = Image.mount(tag)
    print(f"\n{case.dockerfile.name}: built in {seconds:.0f} s, {built.size / 1e6:.0f} MB")
    try:
        yield case, built
    finally:
        built.unmount()


def test_image_holds_what_the_dockerfile_promises(image, work):
    case, built = image
    uid, gid, _ = built.user()
    assert uid != 0 and gid != 0, f"USER {built.config.get('User')} is root"
    passwd = {line.split(":")[2]: line.split(":") for line in (built.root / "etc/passwd").read_text().splitlines()}
    assert passwd[str(uid)][0] == "berth" and passwd[str(uid)][6] == "/usr/sbin/nologin"
    berth = built.root / "opt/berth/bin/berth"
    assert berth.stat().st_uid == 0 and not berth.stat().st_mode & 0o022, "the service could rewrite its own code"

    site_packages = list(built.root.glob("opt/berth/lib/python3*/site-packages"))
    assert len(site_packages) == 1
    installed = {p.name.lower() for p in site_packages[0].iterdir()}
    assert not {n for n in installed if n.startswith(("torch", "nvidia", "triton"))}, "torch got into the image"
    compilers = [str(path) for name, path in built.executables().items() if COMPILERS.fullmatch(name)]
    assert not compilers and not list(built.root.glob("usr/lib/gcc/*/*/cc1")), f"a compiler in the image: {compilers}"
    assert built.size < case.max_megabytes * 1e6, f"{built.size / 1e6:.0f} MB > {case.max_megabytes} MB"

    code, out = run_in(built, [*built.config["Entrypoint"], "--help"], work / "help.log")
    assert code == 0 and "usage: berth serve" in out, out
    code, out = run_in(built, ["python", "-c", "import torch"], work / "torch.log")
    assert code == 1 and "No module named 'torch'" in out, out


@pytest.mark.parametrize("image", IMAGE_PARAMS[1:], indirect=True)
def test_gpu_image_has_the_cuda_provider_needing_only_the_cuda_base(image, work):
    _, built = image
    probe = ("import importlib.metadata as m, onnxruntime as o; "
             "print(m.version('onnxruntime-gpu'), o.get_available_providers(), o.__file__)")
    code, out = run_in(built, ["python", "-c", probe], work / "providers.log")
    assert code == 0 and "CUDAExecutionProvider" in out, out
    code, out = run_in(built, ["python", "-c", "import importlib.metadata as m; m.version('onnxruntime')"],
                       work / "cpu-ort.log")
    assert code == 1 and "PackageNotFoundError" in out, "the CPU onnxruntime is still installed beside the GPU one"
    providers = list(built.root.glob("opt/berth/lib/python3*/site-packages/onnxruntime/capi/"
                                     "libonnxruntime_providers_cuda.so"))
    assert len(providers) == 1
    code, out = run_in(built, ["ldd", "/" + str(providers[0].relative_to(built.root))], work / "ldd.log")
    missing = sorted({line.split()[0] for line in out.splitlines() if "not found" in line})
    assert missing, "CUDA libraries resolved on a base without CUDA?"
    assert all(CUDA_RUNTIME_LIBRARIES.fullmatch(name) for name in missing), missing
    print(f"\nCUDA provider needs from the CUDA base image: {missing}")


def post(client: httpx.Client, route: str, body: dict) -> dict:
    response = client.post(route, json=body)
    assert response.status_code == 200, f"{route}: {response.status_code} {response.text}"
    return response.json()


def example_body(schema: dict, operation: dict) -> dict:
    """The first example of a POST route's request body, as /docs shows it ({} when it has none)."""
    ref = (operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
           .get("$ref", ""))
    body = schema["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
    return (body.get("examples") or [{}])[0]


def check_routes(client: httpx.Client, checkpoints: dict[str, Path]) -> None:
    """A request on every route the server lists in its OpenAPI schema. The four task routes of the
    test's bundles: answers checked against the PyTorch model of the same fine-tuned folder (classify,
    pair) or against gold values (NER, QA). Any other POST route (a task with no bundle here): its own
    /docs example must get the service's answer, 200 or its 404 "no model of this task" (422 without an
    example), never a crash; the other servers' wire formats their own 4xx."""
    from tests.service import reference

    schema = client.get("/openapi.json").json()
    for path, operations in schema["paths"].items():
        if not path.startswith(("/v1/", "/v2/", "/healthz", "/readyz", "/metrics", "/docs", "/openapi")):
            # Other servers' wire formats (Hugging Face Inference, TEI): with no model of their task or no body,
            # their own 4xx answer with an "error", never a crash.
            for method in ("get", "post"):
                if method in operations:
                    response = client.request(method.upper(), path, json={} if method == "post" else None)
                    assert response.status_code < 500 and (response.status_code == 200 or "error" in response.json()), \
                        f"{path}: {response.status_code} {response.text}"
            continue
        if "get" in operations and "{" not in path:
            assert client.get(path).status_code == 200, path
        if "post" in operations and path not in GOLD_ROUTES:
            body = example_body(schema, operations["post"])
            response = client.post(path, json=body)
            assert response.status_code in ((200, 404) if body else (422,)), \
                f"{path}: {response.status_code} {response.text}"
            assert response.status_code == 200 or response.json()["error_type"] in ("not_found", "validation"), \
                response.text
    assert client.get("/docs").status_code == 200

    got = post(client, "/v1/classify", {"inputs": SENTENCES})["results"]
    want = reference.classify(checkpoints["sentiment"], SENTENCES)
    assert [r["label"] for r in got] == [r["label"] for r in want]
    assert [r["score"] for r in got] == pytest.approx([r["score"] for r in want], abs=1e-4)
    got = post(client, "/v1/pair", {"inputs": [{"text": SENTENCES[0], "text_pair": SENTENCES[1]}]})["results"]
    want = reference.classify(checkpoints["similarity"], SENTENCES[:1], SENTENCES[1:2])
    assert [r["score"] for r in got] == pytest.approx([r["score"] for r in want], abs=1e-4)
    got = post(client, "/v1/ner", {"inputs": NER_TEXT})["results"][0]
    assert [(e["entity"], e["text"], NER_TEXT[e["start"] : e["end"]]) for e in got] == [
        ("LOC", "Tokyo", "Tokyo"), ("LOC", "Sydney", "Sydney")]
    question = {"question": "When was the library founded?", "context": QA_CONTEXT}
    got = post(client, "/v1/qa", {"inputs": question})["results"][0]
    assert got["answer"] == "1911" and QA_CONTEXT[got["start"] : got["end"]] == "1911"
    served = {m["name"] for m in client.get("/v1/models").json()["models"]}
    assert served == set(BUNDLES)


def test_image_serves_every_route_passes_its_healthcheck_and_stops_on_sigterm(image, models, work):
    case, built = image
    repository, checkpoints = models
    port = free_port()
    log = work / f"serve-{case.name}.log"
    env = {**RUN_ENV, "BERTH_PORT": str(port)}
    server = Container(built, [*built.config["Entrypoint"], *(built.config.get("Cmd") or [])], log, env=env,
                       models=repository)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/readyz", server.process, log, timeout=300)
        with httpx.Client(base_url=url, timeout=60) as client:
            check_routes(client, checkpoints)
            providers = {m["execution_provider"] for m in client.get("/v1/models").json()["models"]}
        assert providers == {"CPUExecutionProvider"}, providers  # no GPU here, whatever the image's BERTH_DEVICE

        command, timeout = healthcheck_command(built)
        code, out = run_in(built, command, work / "healthcheck.log", timeout=timeout + 5, env=env)
        assert code == 0, f"HEALTHCHECK {command} exited {code}: {out}"

        # The image's environment is the one the server ran with: its log lines are JSON (BERTH_LOG_JSON).
        assert any(line.startswith("{") and json.loads(line) for line in log.read_text().splitlines())
        drain = float(built.env["BERTH_SHUTDOWN_TIMEOUT_S"])
        code, seconds = server.terminate(timeout=drain + 10)
        assert code == 0, f"exit {code} after SIGTERM:\n{tail(log)}"
        print(f"\n{case.name}: exited {code} {seconds:.1f} s after SIGTERM (drain timeout {drain:.0f} s)")
    finally:
        server.stop()
