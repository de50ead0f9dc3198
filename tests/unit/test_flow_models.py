"""Flux.1 and SD 3.5: full-size geometries (on the meta device: no memory, no time) and the
technique rules for them, on data only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from collectors import techniques as tq  # noqa: E402
from collectors.cli import PIPELINE_NAMES  # noqa: E402
from collectors.flow_pipelines import flow_denoiser_factory  # noqa: E402
from collectors.pipelines import PIPELINES  # noqa: E402


def _sizes(pipeline: str) -> tuple[int, int]:
    with torch.device("meta"):
        model = flow_denoiser_factory(pipeline, "full")()
    return (sum(p.numel() for p in model.parameters()), sum(b.numel() for b in model.buffers()))


def test_flux_transformer_is_the_published_11_9b() -> None:
    params, _ = _sizes("flux-dev")
    assert round(params / 1e6, 2) == 11901.41  # FLUX.1-dev's transformer, as published
    schnell, _ = _sizes("flux-schnell")
    # schnell is dev without the guidance embedder: two Linear layers, 256 -> 3072 -> 3072
    assert params - schnell == (256 * 3072 + 3072) + (3072 * 3072 + 3072)


@pytest.mark.parametrize("pipeline,published", [("sd35-large", 8.1e9), ("sd35-medium", 2.5e9)])
def test_sd35_transformers_match_their_published_sizes(pipeline: str, published: float) -> None:
    params, buffers = _sizes(pipeline)
    # the published figure counts the checkpoint's tensors, pos_embed (a buffer here) included
    assert abs(params + buffers - published) / published < 0.02


def test_cli_pipeline_choices_are_the_builders() -> None:
    assert PIPELINE_NAMES == PIPELINES


@pytest.mark.parametrize(
    "pipeline,techniques,device,needle",
    [
        ("flux-dev", ["no-t5"], "cpu", "cannot run without its T5"),
        ("flux-dev", ["classic"], "cpu", "classic does not apply"),
        ("sd35-large", ["tiny-vae"], "cpu", "tiny-vae does not apply"),
        ("flux-dev", ["nf4-transformer"], "cpu", "needs a CUDA device"),
        ("flux-dev", ["fp8"], "cpu", "fp8"),
        ("flux-dev", ["layerwise-fp8", "qint8"], "cpu", "pick one weight format"),
        ("flux-dev", ["offload-stream"], "cpu", "add group-offload"),
        ("flux-dev", ["group-offload-leaf"], "cpu", "needs a CUDA device"),
    ],
)
def test_impossible_flow_techniques_say_why(pipeline: str, techniques: list[str], device: str, needle: str) -> None:
    with pytest.raises(tq.TechniqueError, match=needle):
        tq.plan(techniques, device=device, pipeline=pipeline, num_gpus=0)


@pytest.mark.parametrize("name,package", [("qint8", "optimum"), ("int8", "torchao"), ("fp8", "torchao")])
def test_missing_quantization_package_is_named(name: str, package: str) -> None:
    if tq._available(package):
        pytest.skip(f"{package} is installed here")
    with pytest.raises(tq.TechniqueError, match=package.replace("optimum", "optimum-quanto")):
        tq.plan([name], device="cpu", pipeline="pixart-sigma", num_gpus=0)


@pytest.mark.parametrize(
    "techniques,on_device",
    [
        (["bf16"], True),
        (["bf16", "no-t5", "vae-tiling"], True),
        (["bf16", "layerwise-fp8"], False),  # fp8 storage is cast on the CPU, then moved
    ],
)
def test_flow_pipelines_build_on_the_gpu_unless_weights_start_on_the_cpu(
    techniques: list[str], on_device: bool
) -> None:
    p = tq.plan(techniques, device="cpu", pipeline="sd35-large", num_gpus=0)
    assert p.build_on_device("sd35-large") is on_device
    assert not p.build_on_device("sdxl")  # the UNet pipelines always copy from the CPU


def test_offload_and_quantization_keep_weights_on_the_cpu_first() -> None:
    p = tq.Plan(dtype_name="bf16", attention="sdpa", offload="group-offload", flags={"offload-stream"})
    assert not p.build_on_device("flux-dev")
    assert p.names() == ["bf16", "sdpa", "group-offload", "offload-stream"]
    p = tq.Plan(dtype_name="bf16", attention="sdpa", offload=None, flags={"nf4-transformer"})
    assert not p.build_on_device("flux-dev")
