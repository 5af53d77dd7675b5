"""Native diffusion LMs (full-attention and block-diffusion) and checkpoint loading.

Importing this package registers our configs and models with transformers' Auto classes, so
``AutoModel.from_pretrained(path)`` works for celeris, LLaDA, Dream, Fast-dLLM v2 and SDAR
directories without ``trust_remote_code``, with LLaDA's upstream parameter names mapped onto
ours (the same table ``load_model`` uses) and a missing weight refused by name.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from .configuration import (CONFIG_CLASSES, CelerisConfig, DreamConfig, FastDLLMQwenConfig,
                            LLaDAConfig, SDARConfig)
from .modeling import (CelerisForMaskedDiffusion, DreamModel, FastDLLMQwenModel, KVView,
                       LLaDAModelLM, SDARModel)
from .weights import LLADA_RENAMES, canonical_name, load_model, resolve_device, resolve_dtype

_MODEL_FOR = {CelerisConfig: CelerisForMaskedDiffusion, LLaDAConfig: LLaDAModelLM,
              DreamConfig: DreamModel, FastDLLMQwenConfig: FastDLLMQwenModel,
              SDARConfig: SDARModel}
# Upstream block-diffusion checkpoints name themselves ...ForCausalLM and are loaded with
# AutoModelForCausalLM in their model cards; that works here too.
_CAUSAL_LM = (FastDLLMQwenConfig, SDARConfig)


def _register() -> None:
    for config_cls, model_cls in _MODEL_FOR.items():
        try:
            AutoConfig.register(config_cls.model_type, config_cls)
        except ValueError:
            pass   # already registered (module reloaded)
        autos = (AutoModel, AutoModelForMaskedLM) + (
            (AutoModelForCausalLM,) if config_cls in _CAUSAL_LM else ())
        for auto in autos:
            try:
                auto.register(config_cls, model_cls)
            except ValueError:
                pass
    _register_llada_renames()


def _register_llada_renames() -> None:
    from transformers.conversion_mapping import register_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming
    renames = [WeightRenaming(src, dst) for src, dst in LLADA_RENAMES]
    register_checkpoint_conversion_mapping(LLaDAConfig.model_type, renames, overwrite=True)


_register()

__all__ = ["CelerisConfig", "LLaDAConfig", "DreamConfig", "FastDLLMQwenConfig", "SDARConfig",
           "CelerisForMaskedDiffusion", "LLaDAModelLM", "DreamModel", "FastDLLMQwenModel",
           "SDARModel", "KVView", "load_model", "canonical_name",
           "resolve_device", "resolve_dtype", "CONFIG_CLASSES"]
