"""Where each linear of a parsed model sits, by the module names transformers 5 gives it.

`llm_int8_skip_modules` names modules by path (`model.layers.3.mlp`, `self_attn.q_proj`),
so whatever honours it must know each linear's path: the exact static bytes
(`storage.py`) and the `unsloth` profile (`unsloth.py`) both read it from here. Paths are
relative to the text model's root (`layers.3.self_attn.q_proj`, `altup_projections.0`),
the form `model.skip_module_matches_text` matches under every root of
`TEXT_ROOTS`.

A layer's linears sit in one of its parts (`PARTS`), each a module of the layer whose name
depends on the family (checked against the models transformers 5.24 builds):

* attention at `self_attn` (Nemotron-H: `mixer`, which holds whichever mixer the layer has,
  Nemotron 3's MoE with its `experts`, `gate` and `shared_experts`);
* the MLP at `mlp` (Jamba, Falcon-H1, Llama 4: `feed_forward`; Nemotron-H: `mixer`), an MoE
  layer's expert stacks at `<mlp>.experts`, its shared expert at `<mlp>.shared_expert` where
  it is gated or one expert (Qwen-MoE, Qwen3-Next, Llama 4) and `<mlp>.shared_experts`
  otherwise (DeepSeek, GLM, ERNIE);
* a Mamba or Gated DeltaNet mixer at `mamba` (Falcon-H1, Jamba), `linear_attn` (Qwen3-Next)
  or `mixer` (Nemotron-H);
* Gemma 3n's LAuReL at `laurel`, AltUp at `altup`, its per-layer input gate and projection
  directly in the layer.

Not covered: DBRX, whose modules transformers names its own way (`transformer.blocks.N.
norm_attn_norm.attn.Wqkv`); its linears get the Llama-style paths.
"""

from __future__ import annotations

from controller.estimator.model import ArchDims, Layer, Linear

PARTS = ("attention", "mlp", "experts", "shared", "mixer", "laurel", "altup", "layer")

ATTENTION_NAMES = frozenset(
    ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "q_a_proj", "q_b_proj")
) | {"kv_a_proj_with_mqa", "kv_b_proj"}
MLP_NAMES = frozenset(("gate_proj", "up_proj", "down_proj", "gate_up_proj"))
_PART_OF_NAME = {
    **dict.fromkeys(ATTENTION_NAMES, "attention"),
    **dict.fromkeys(MLP_NAMES, "mlp"),
    # the shared expert's gate and the router sit beside the experts, in the MLP's module
    **dict.fromkeys(("shared_expert_gate", "router"), "mlp"),
    **dict.fromkeys(
        ("in_proj", "out_proj", "x_proj", "dt_proj", "in_proj_qkvz", "in_proj_ba"), "mixer"
    ),
    **dict.fromkeys(("linear_left", "linear_right"), "laurel"),
    **dict.fromkeys(("correction_coefs", "prediction_coefs", "modality_router"), "altup"),
    **dict.fromkeys(("per_layer_input_gate", "per_layer_projection"), "layer"),
}
_FEED_FORWARD = frozenset(("jamba", "falcon_h1", "llama4", "llama4_text"))
_MIXER_MODULE = {"falcon_h1": "mamba", "jamba": "mamba", "qwen3_next": "linear_attn"}
_ONE_SHARED_EXPERT = frozenset(("llama4", "llama4_text"))  # ungated, named as Qwen's
# The router's module where it is an nn.Linear or a module of its own; elsewhere the MoE
# block's `gate` (a parameter in transformers 5). Never quantised either way.
_ROUTER = {"llama4": "router", "llama4_text": "router", "gpt_oss": "router"}


def part_path(model_type: str, dims: ArchDims, part: str) -> str:
    """The module of a layer holding its `part` (one of `PARTS`), from the layer; "" for
    the layer itself."""
    if part == "layer":
        return ""
    if part in ("laurel", "altup"):
        return part
    if model_type == "nemotron_h":
        # one mixer a layer: attention, the MLP, Mamba-2 or (Nemotron 3) the MoE, whose
        # expert stacks and one shared expert sit inside it
        return {"experts": "mixer.experts", "shared": "mixer.shared_experts"}.get(part, "mixer")
    if part == "attention":
        return "self_attn"
    if part == "mixer":
        return _MIXER_MODULE.get(model_type, "mixer")
    mlp = "feed_forward" if model_type in _FEED_FORWARD else "mlp"
    if part == "experts":
        return f"{mlp}.experts"
    if part == "shared":
        one = dims.shared_expert_gate or model_type in _ONE_SHARED_EXPERT
        return f"{mlp}.shared_expert" if one else f"{mlp}.shared_experts"
    return mlp


def name_part(name: str) -> str:
    """The part (`PARTS`) a linear named `name` belongs to, outside an MoE block's shared
    expert and expert stacks (which `layer_linear_paths` tells apart by place)."""
    return _PART_OF_NAME.get(name, "mlp")


def _joined(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def layer_linear_paths(model_type: str, dims: ArchDims, layer: Layer) -> tuple[str, ...]:
    """The path inside its layer (`self_attn.q_proj`) of each of `layer.linears`, in order.

    An expert linear's is its expert stacks' module (`mlp.experts`), the router's its
    module. In an MoE layer the MLP-named linears after the router are the shared expert's
    (as `model.tensors._moe_mlp` builds them), until a name repeats: a dense MLP beside the
    experts (`enable_moe_block`) follows them.
    """
    paths: list[str] = []
    after_router = False
    shared_names: set[str] = set()
    for lin in layer.linears:
        name = lin.name
        if lin.expert:
            paths.append(part_path(model_type, dims, "experts"))
            continue
        if name == "router":
            after_router = True
            mlp = part_path(model_type, dims, "mlp")
            paths.append(_joined(mlp, _ROUTER.get(model_type, "gate")))
            continue
        part = name_part(name)
        if (
            part == "mlp"
            and name in MLP_NAMES
            and after_router
            and dims.n_shared_experts
            and name not in shared_names
        ):
            shared_names.add(name)
            part = "shared"
        elif shared_names and name in shared_names:
            after_router = False  # the dense MLP: no more shared-expert linears
        paths.append(_joined(part_path(model_type, dims, part), name))
    return tuple(paths)


#: Gemma 3n's AltUp projections: module lists, one linear per extra stream.
_MODULE_LISTS = frozenset(("altup_projections", "altup_unembed_projections"))


def outer_linear_paths(outer: tuple[Linear, ...]) -> tuple[str, ...]:
    """The paths of the linears outside the layers (`ModelShape.outer_linears`, Gemma 3n's:
    `per_layer_model_projection`, `altup_projections.0`, `altup_unembed_projections.0`)."""
    seen: dict[str, int] = {}
    paths = []
    for lin in outer:
        if lin.name in _MODULE_LISTS:
            k = seen.get(lin.name, 0)
            seen[lin.name] = k + 1
            paths.append(f"{lin.name}.{k}")
        else:
            paths.append(lin.name)
    return tuple(paths)
