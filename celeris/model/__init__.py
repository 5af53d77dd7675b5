"""Native masked-diffusion models and checkpoint loading.

Importing this package registers our configs and models with transformers' Auto classes, so
``AutoModel.from_pretrained(path)`` works for celeris, LLaDA- and Dream-format directories
without ``trust_remote_code``.
"""

from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

from .configuration import CONFIG_CLASSES, CelerisConfig, DreamConfig, LLaDAConfig
from .modeling import CelerisForMaskedDiffusion, DreamModel, KVView, LLaDAModelLM
from .weights import canonical_name, load_model, resolve_device, resolve_dtype

_MODEL_FOR = {CelerisConfig: CelerisForMaskedDiffusion, LLaDAConfig: LLaDAModelLM,
              DreamConfig: DreamModel}


def _register() -> None:
    for config_cls, model_cls in _MODEL_FOR.items():
        try:
            AutoConfig.register(config_cls.model_type, config_cls)
        except ValueError:
            pass   # already registered (module reloaded)
        for auto in (AutoModel, AutoModelForMaskedLM):
            try:
                auto.register(config_cls, model_cls)
            except ValueError:
                pass


_register()

__all__ = ["CelerisConfig", "LLaDAConfig", "DreamConfig", "CelerisForMaskedDiffusion",
           "LLaDAModelLM", "DreamModel", "KVView", "load_model", "canonical_name",
           "resolve_device", "resolve_dtype", "CONFIG_CLASSES"]
