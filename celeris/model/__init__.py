"""Native diffusion LMs (full-attention and block-diffusion) and checkpoint loading.

Importing this package registers our configs and models with transformers' Auto classes, so
``AutoModel.from_pretrained(path)`` works for celeris, LLaDA (and LLaDA-MoE, iLLaDA), Dream,
Fast-dLLM v2, SDAR, SDAR-MoE and LLaDA2.x directories without ``trust_remote_code``, with the
upstream parameter names mapped onto ours (the same tables ``load_model`` uses), per-expert
tensors merged into our stacked experts, and a missing weight refused by name. DiffusionGemma
is transformers' own model (``diffusion_gemma.py`` wraps it for the engine).
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from .configuration import (CONFIG_CLASSES, CelerisConfig, DiffusionGemmaConfig, DreamConfig,
                            FastDLLMQwenConfig, LLaDA2MoeConfig, LLaDAConfig, SDARConfig,
                            SDARMoeConfig)
from .diffusion_gemma import DiffusionGemma, GemmaCache
from .modeling import (CelerisForMaskedDiffusion, DreamModel, FastDLLMQwenModel, KVView,
                       LLaDA2MoeModelLM, LLaDAModelLM, SDARModel, SDARMoeForCausalLM)
from .weights import RENAMES, canonical_name, load_model, resolve_device, resolve_dtype

_MODEL_FOR = {CelerisConfig: CelerisForMaskedDiffusion, LLaDAConfig: LLaDAModelLM,
              DreamConfig: DreamModel, FastDLLMQwenConfig: FastDLLMQwenModel,
              SDARConfig: SDARModel, SDARMoeConfig: SDARMoeForCausalLM,
              LLaDA2MoeConfig: LLaDA2MoeModelLM}
# Upstream block-diffusion checkpoints name themselves ...ForCausalLM (LLaDA2: ...ModelLM) and
# are loaded with AutoModelForCausalLM in their model cards; that works here too.
_CAUSAL_LM = (FastDLLMQwenConfig, SDARConfig, SDARMoeConfig, LLaDA2MoeConfig)


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
    _register_conversions()


def _register_conversions() -> None:
    """Per model_type: our renames, then the per-expert tensors merged into the stacked
    experts (transformers' own Qwen2-MoE recipe)."""
    from transformers.conversion_mapping import register_checkpoint_conversion_mapping
    from transformers.core_model_loading import (Concatenate, MergeModulelist, WeightConverter,
                                                 WeightRenaming)
    for model_type in ("llada", "llada2_moe", "sdar_moe"):
        mapping = [WeightRenaming(src, dst) for src, dst in RENAMES.get(model_type, ())]
        mapping += [
            WeightConverter(source_patterns=["mlp.experts.*.gate_proj.weight",
                                             "mlp.experts.*.up_proj.weight"],
                            target_patterns="mlp.experts.gate_up_proj",
                            operations=[MergeModulelist(dim=0), Concatenate(dim=1)]),
            WeightConverter(source_patterns="mlp.experts.*.down_proj.weight",
                            target_patterns="mlp.experts.down_proj",
                            operations=[MergeModulelist(dim=0)])]
        register_checkpoint_conversion_mapping(model_type, mapping, overwrite=True)


_register()

__all__ = ["CelerisConfig", "LLaDAConfig", "DreamConfig", "FastDLLMQwenConfig", "SDARConfig",
           "SDARMoeConfig", "LLaDA2MoeConfig", "CelerisForMaskedDiffusion", "LLaDAModelLM",
           "DreamModel", "FastDLLMQwenModel", "SDARModel", "SDARMoeForCausalLM",
           "LLaDA2MoeModelLM", "DiffusionGemmaConfig", "DiffusionGemma",
           "GemmaCache", "KVView", "load_model", "canonical_name",
           "resolve_device", "resolve_dtype", "CONFIG_CLASSES"]
