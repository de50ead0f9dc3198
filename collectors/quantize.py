"""Weight-storage techniques applied to in-code (random-init) modules, without from_pretrained.

diffusers' and transformers' quantization configs only act inside ``from_pretrained``; these
helpers do the same module surgery on an instantiated model, which is what the configs do
under the hood. nf4 and layerwise fp8 are applied to CPU-resident weights before the load
stage, so only 4-bit (or fp8-stored) weights arrive on the GPU, as from a quantized checkpoint;
torchao (as it always did here) and quanto quantize where the weights are, after the load
(quanto's frozen weights cannot be moved: see techniques.quantize_after_load).
"""

from __future__ import annotations

import torch

# the one quantization backend a denoiser may use at a time, and the package each needs
DENOISER_QUANT = {
    "nf4-transformer": "bitsandbytes",
    "int8": "torchao",
    "fp8": "torchao",
    "qint8": "optimum.quanto",
    "qfloat8": "optimum.quanto",
    "layerwise-fp8": "diffusers",
}


def to_nf4(module: torch.nn.Module, compute_dtype: torch.dtype) -> int:
    """Swap every nn.Linear for bitsandbytes Linear4bit (NF4); weights quantize on .to(cuda).

    This is what transformers' ``replace_with_bnb_linear`` does under
    ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")``.
    """
    import bitsandbytes as bnb

    from .components import skip_random_init

    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            with skip_random_init():  # its placeholder weight is replaced at once: skip the init
                q = bnb.nn.Linear4bit(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    compute_dtype=compute_dtype,
                    quant_type="nf4",
                    device="cpu",
                )
            q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4")
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(module, name, q)
            count += 1
        else:
            count += to_nf4(child, compute_dtype)
    return count


def quantize_torchao(module: torch.nn.Module, kind: str) -> None:
    """torchao weight-only quantization of every Linear in ``module`` (in place).

    ``int8``: Int8WeightOnlyConfig; ``fp8``: Float8WeightOnlyConfig (e4m3 weights, needs a GPU
    with fp8 support). This is ``TorchAoConfig(<config>)`` without from_pretrained.
    """
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    quantize_(module, Int8WeightOnlyConfig() if kind == "int8" else Float8WeightOnlyConfig())


def quantize_quanto(module: torch.nn.Module, kind: str) -> None:
    """optimum-quanto weight quantization (qint8 or qfloat8), then freeze: the float weights
    are replaced by their quantized form, as in the PixArt-Σ walkthrough."""
    from optimum.quanto import freeze, qfloat8, qint8, quantize

    quantize(module, weights=qint8 if kind == "qint8" else qfloat8)
    freeze(module)


def layerwise_fp8(module: torch.nn.Module, compute_dtype: torch.dtype) -> None:
    """Store weights in float8_e4m3fn and upcast each layer to ``compute_dtype`` as it runs
    (diffusers' default skip patterns keep norms and embeddings in the compute dtype)."""
    if hasattr(module, "enable_layerwise_casting"):
        module.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=compute_dtype)
    else:  # a transformers model (T5): diffusers' hook works on any nn.Module
        from diffusers.hooks import apply_layerwise_casting

        apply_layerwise_casting(module, storage_dtype=torch.float8_e4m3fn, compute_dtype=compute_dtype)
