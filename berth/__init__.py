"""berth: BERT heads trained, exported to ONNX bundles and served.

The Python API (berth/api.py), imported on first use so that `import berth` loads neither ONNX Runtime nor torch:

    berth.load(path_or_name)     a bundle as a callable Model: model(inputs, **options) answers as its HTTP route
    berth.finetune(**settings)   fine-tune a head (torch), as `berth finetune`
    berth.export(folder, out)    export a fine-tuned folder to a bundle (torch), as `berth export`
    berth.RequestError           what a Model raises for an input or option its route refuses
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tasks.runtime.version import berth_version

if TYPE_CHECKING:
    from berth.api import Model, RequestError, export, finetune, load

__all__ = ["Model", "RequestError", "__version__", "export", "finetune", "load"]
__version__ = berth_version()

_API = ("Model", "RequestError", "export", "finetune", "load")


def __getattr__(name: str) -> Any:
    if name in _API:
        from berth import api

        return getattr(api, name)
    raise AttributeError(f"module 'berth' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
