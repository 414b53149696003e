"""LoRA targets: the names a job may give, as PEFT matches them on a model, and the modules
PEFT refuses or fails on.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.estimator.errors import SpecError
from controller.estimator.model.shape import ModelShape

# PEFT's names of the seven projections of a Llama-style block, the `all-linear` default.
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
# Other names users write for the same modules, mapped to the canonical names above.
MODULE_ALIASES = {
    "w1": "gate_proj",
    "w3": "up_proj",
    "w2": "down_proj",
    "qkv_proj": "qkv_proj",
    "gate_up_proj": "gate_up_proj",
}
# PEFT (0.21, `_check_lora_target_modules_mamba`) raises on LoRA over these modules of these
# model types, "all-linear" included (it selects out_proj), whatever the target list says.
PEFT_MAMBA_TYPES = frozenset({"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"})
PEFT_MAMBA_REFUSED = ("out_proj", "conv1d")
# Routers that are an nn.Linear whose forward returns a tuple: Llama 4's (scores, logits),
# PhiMoE's PhimoeTopKRouter (logits, weights, experts). PEFT 0.21 wraps them (by name, or
# under "all-linear"), and its LoRA layer fails on the tuple in the first forward, so such
# a job fails in training.
PEFT_TUPLE_ROUTER_TYPES = frozenset({"llama4", "llama4_text", "phimoe"})
#: What LoRA may not target, by model type ("all-linear" selects these too, so it is refused
#: with them), and why, for the one-line refusal.
PEFT_REFUSED_MODULES: dict[str, tuple[tuple[str, ...], str]] = {
    **dict.fromkeys(
        PEFT_MAMBA_TYPES,
        (PEFT_MAMBA_REFUSED, "PEFT refuses LoRA on {modules} of {model_type}'s Mamba mixers"),
    ),
    **dict.fromkeys(
        PEFT_TUPLE_ROUTER_TYPES,
        (
            ("router",),
            "PEFT's LoRA layer fails on the tuple that {model_type}'s {modules} (an nn.Linear) "
            "returns",
        ),
    ),
}
#: The names transformers gives a family's linears where they are not the canonical ones
#: `module_names` holds (DBRX: its fused attention `Wqkv` and `out_proj`, and its router
#: module's linear, `layer`): PEFT matches those, so a job's targets may say them, and the
#: trace hands them to PEFT.
PEFT_NAMES: dict[str, dict[str, str]] = {
    "dbrx": {"qkv_proj": "Wqkv", "o_proj": "out_proj", "router": "layer"},
}


def peft_name(model_type: str, module: str) -> str:
    """What PEFT calls the canonical `module` of `model_type`'s models."""
    return PEFT_NAMES.get(model_type, {}).get(module, module)


def peft_adaptable_modules(shape: ModelShape) -> tuple[str, ...]:
    """The names LoRA can target on this model, as PEFT matches them: modules PEFT neither
    refuses nor fails on, that select some linear (not only expert stacks it does not
    adapt)."""
    refused = set(PEFT_REFUSED_MODULES.get(shape.model_type, ((), ""))[0])
    return tuple(
        sorted(
            peft_name(shape.model_type, name)
            for name in shape.module_names - refused
            if shape.lora_params_per_rank((name,)) > 0
        )
    )


def canonical_targets(targets: Sequence[str], shape: ModelShape, path: str) -> tuple[str, ...]:
    """Map user-written LoRA target names to the model's module names; reject unknown ones.

    Accepts `all-linear` (PEFT's spelling, also `all_linear`), PEFT module names, and the
    Mixtral aliases w1/w2/w3. On Phi-3's fused modules, q/k/v select `qkv_proj` and gate/up
    select `gate_up_proj`, which is where PEFT would put those adapters. Where transformers
    names a module otherwise (`PEFT_NAMES`: DBRX's `Wqkv`), that name, the one PEFT matches,
    is accepted too (the trace hands PEFT that one). Idempotent: its output is its input's
    canonical form, which it accepts again.
    """
    out: list[str] = []
    refused, why = PEFT_REFUSED_MODULES.get(shape.model_type, ((), ""))
    canonical = {real: name for name, real in PEFT_NAMES.get(shape.model_type, {}).items()}
    for raw in targets:
        name = raw.strip().lower().replace("_", "-") if "all" in raw.lower() else raw.strip()
        if refused and (name == "all-linear" or name in refused):
            many = len(refused) > 1
            if name == "all-linear":
                what = f"all-linear selects {'them' if many else 'it'}"
            else:
                what = f"{name!r} is one of them" if many else f"{name!r} names it"
            reason = why.format(modules=" and ".join(refused), model_type=shape.model_type)
            raise SpecError(
                path,
                f"{reason}, and {what}, so the job would fail; name the targets instead, e.g. "
                f"{', '.join(peft_adaptable_modules(shape))}",
            )
        if name == "all-linear":
            return ("all-linear",)
        name = canonical.get(name, name)  # the model's own name (DBRX's Wqkv) is accepted
        name = MODULE_ALIASES.get(name, name)
        if name not in shape.module_names:
            if name in ("q_proj", "k_proj", "v_proj") and "qkv_proj" in shape.module_names:
                name = "qkv_proj"
            elif name in ("gate_proj", "up_proj") and "gate_up_proj" in shape.module_names:
                name = "gate_up_proj"
            else:
                allowed = ", ".join(["all-linear", *sorted(shape.module_names)])
                raise SpecError(path, f"unknown module {raw!r} for this model; allowed: {allowed}")
        if name not in out:
            out.append(name)
    if not out:
        raise SpecError(path, "must name at least one module (or all-linear)")
    chosen = tuple(sorted(out))
    if shape.lora_params_per_rank(chosen) == 0:  # only expert stacks PEFT does not adapt
        raise SpecError(
            path,
            f"{', '.join(chosen)} {'selects' if len(chosen) == 1 else 'select'} no module PEFT "
            f"adapts on this model (its expert stacks are parameters, not linears); adaptable "
            f"by name: "
            f"{', '.join(peft_adaptable_modules(shape))}",
        )
    return chosen
