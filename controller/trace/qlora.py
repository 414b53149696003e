"""A storage model of bitsandbytes' 4-bit linear layer, for QLoRA traces.

bitsandbytes' `Linear4bit` cannot run on fake tensors (its kernels are CUDA-only and have no
fake implementation), so the trace replaces each quantised linear with `Linear4bitStorage`,
which allocates exactly what bitsandbytes 0.4x allocates for an NF4 layer of `out x in`
weights with blocksize 64 (transformers' default) and runs the same ops around them:

Resident (counted as weights):
  * packed weight: uint8, ceil(out·in / 2) bytes (two 4-bit codes per byte);
  * absmax: one per 64-weight block, n_blocks = ceil(out·in / 64) — fp32 (4 bytes each)
    without double quantisation; with `bnb_4bit_use_double_quant` uint8 (1 byte each) plus
    the second-level state: fp32 absmax per 256 first-level blocks (ceil(n_blocks / 256) x 4
    bytes), its 256-entry fp32 code book (1 KiB) and one fp32 offset;
  * the NF4 code book: 16 fp32 values, one copy per layer (bitsandbytes creates it per
    quantisation state);
  * the bias, if any, in the compute dtype.

Transient (counted as temporaries, as in `bnb.functional.dequantize_4bit`):
  * forward: with double quantisation, the first-level absmax dequantised to fp32
    (n_blocks x 4 bytes); then the dequantised weight, out x in in the compute dtype; the
    matmul output; both scratch tensors freed when the op returns;
  * backward (`MatMul4Bit.backward`): the weight dequantised again the same way, and the
    input gradient; nothing else is saved, since the base weight is frozen and bitsandbytes
    saves no activation for it.

`controller.estimator.storage.nf4_bytes` is the same arithmetic for the calibrated profile.

`prepare_for_kbit` casts the parameters that are not 4-bit as PEFT's
`prepare_model_for_kbit_training` (and TRL after it) does, and makes each layer's forward
return its input's dtype, as bitsandbytes' does (`bnb.matmul_4bit(...).to(inp_dtype)`): an
fp32 input (after an fp32 norm) gets an fp32 output, and the residual stream stays fp32.
Without that preparation the layer returns the compute dtype, as the traces the calibrated
profile was fitted to did (every input is in the compute dtype there but where a model's
own code upcasts one).

The LoRA wrapper around it is PEFT's `lora.bnb.Linear4bit`, whose forward differs from the
plain `lora.Linear` (a defensive `result.clone()`, adapter output cast back before the add):
`use_bnb_lora_forward` gives the traced LoRA layers that forward.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from controller.estimator import skip_module_matches, skip_module_matches_text

BLOCKSIZE = 64  # transformers' BitsAndBytesConfig default for 4-bit
NESTED_BLOCKSIZE = 256  # bitsandbytes' blocksize for the double-quantised absmax
NF4_CODE_ENTRIES = 16
DYNAMIC_CODE_ENTRIES = 256


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _MatMul4Bit(torch.autograd.Function):
    """bitsandbytes' `MatMul4Bit`: dequantise, matmul, save nothing but the layer."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Linear4bitStorage) -> torch.Tensor:  # type: ignore[override]
        ctx.layer = layer
        return nn.functional.linear(x, layer.dequantize(), layer.bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None
        return torch.matmul(grad, ctx.layer.dequantize()), None


class NF4State:
    """The quantisation state of one NF4 tensor of `numel` weights, as bitsandbytes' QuantState
    holds it (see the module docstring), and the dequantisation that reads it."""

    def __init__(self, numel: int, double_quant: bool) -> None:
        self.double_quant = double_quant
        self.blocks = _ceil_div(numel, BLOCKSIZE)
        self.code = torch.empty(NF4_CODE_ENTRIES, dtype=torch.float32)
        if double_quant:
            self.absmax = torch.empty(self.blocks, dtype=torch.uint8)
            self.nested_absmax = torch.empty(
                _ceil_div(self.blocks, NESTED_BLOCKSIZE), dtype=torch.float32
            )
            self.nested_code = torch.empty(DYNAMIC_CODE_ENTRIES, dtype=torch.float32)
            self.offset = torch.empty((), dtype=torch.float32)
        else:
            self.absmax = torch.empty(self.blocks, dtype=torch.float32)

    def tensors(self) -> Iterable[torch.Tensor]:
        yield self.code
        yield self.absmax
        if self.double_quant:
            yield from (self.nested_absmax, self.nested_code, self.offset)

    def dequantize(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """`dequantize_4bit`: the fp32 absmax (double quant) lives while the weight is written."""
        absmax = None
        if self.double_quant:
            absmax = torch.empty(self.blocks, dtype=torch.float32)  # dequantize_blockwise
            absmax.add_(self.offset)
        weight = torch.empty(shape, dtype=dtype)
        del absmax
        return weight


def _packed(numel: int) -> nn.Parameter:
    """Two 4-bit codes per byte, frozen."""
    return nn.Parameter(torch.empty((_ceil_div(numel, 2), 1), dtype=torch.uint8), False)


class Linear4bitStorage(nn.Linear):
    """An NF4 `Linear4bit` as far as memory goes (a `nn.Linear` so PEFT wraps it)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        compute_dtype: torch.dtype,
        double_quant: bool = True,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.weight = _packed(in_features * out_features)
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=compute_dtype), requires_grad=False)  # type: ignore[assignment]
            if bias
            else None
        )
        self.state = NF4State(in_features * out_features, double_quant)
        self.returns_input_dtype = False  # `prepare_for_kbit` sets it

    def quant_state(self) -> Iterable[torch.Tensor]:
        """The tensors of bitsandbytes' QuantState (held as attributes, as it holds them)."""
        return self.state.tensors()

    def dequantize(self) -> torch.Tensor:
        return self.state.dequantize((self.out_features, self.in_features), self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype != self.compute_dtype:
            x = x.to(self.compute_dtype)
        out: torch.Tensor = _MatMul4Bit.apply(x, self)  # type: ignore[assignment]
        if self.returns_input_dtype and out.dtype != dtype:
            return out.to(dtype)
        return out


class ExpertStack4bit:
    """One MoE expert stack (a 3-D parameter, E x out x in) held as packed NF4.

    The same storage as `Linear4bitStorage`, over the whole stack: bitsandbytes quantises a
    3-D parameter as one flat tensor (`replace_parameter_4bit`), blocks of 64 running across
    expert boundaries.
    """

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype, double_quant: bool):
        self.shape = shape
        self.compute_dtype = dtype
        self.numel = shape[0] * shape[1] * shape[2]
        self.packed = _packed(self.numel)
        self.state = NF4State(self.numel, double_quant)

    def quant_state(self) -> Iterable[torch.Tensor]:
        return self.state.tensors()

    def dequantize(self) -> nn.Parameter:
        """The whole stack, 16-bit, for as long as the experts run."""
        stack = self.state.dequantize(self.shape, self.compute_dtype)
        return nn.Parameter(stack, requires_grad=False)


_STACKS = "_vramgate_4bit_stacks"


def quantize_experts(
    model: nn.Module, dtype: torch.dtype, double: bool = True, skip: nn.Module | None = None
) -> None:
    """Hold every MoE expert stack (3-D parameter) as packed NF4, dequantised while it runs.

    transformers 5 stores an MoE layer's experts as fused 3-D parameters (`gate_up_proj`,
    `down_proj`), which its bitsandbytes loader, converting `nn.Linear` only, leaves in 16-bit
    (bitsandbytes issue 1849). QLoRA of an MoE model means 4-bit experts, the bulk of its
    weights, as Unsloth and bitsandbytes' parameter quantisation hold them, and the estimator
    charges them so. Call after PEFT: the experts module's stacks become packed parameters,
    and the forward of the outermost module wrapping it (PEFT's `lora.ParamWrapper`, which
    reads the stack to fold the LoRA update in) puts the dequantised stacks in their place
    while it runs (checkpointing's recomputation included) and the packed ones back after.
    The router and expert biases stay 16-bit.

    DBRX keeps its stacks 2-D (E·i x h: `w1`, `v1`, `w2` of its `DbrxExpertGLU`), and its
    experts module reads them (`w.view(E, i, h)[e]`) before it calls the GLU: they are
    quantised as E x i x h stacks, dequantised while the experts module runs.

    `skip`: a module left as it is (a vision tower: its 3-D parameters, a patch or position
    embedding, are no experts and stay 16-bit, as the generic reading counts them).
    """
    skipped = {id(m) for m in skip.modules()} if skip is not None else set()
    for parent in list(model.modules()):
        if id(parent) in skipped:
            continue
        for child in list(parent.children()):
            experts = child
            while hasattr(experts, "base_layer") and not _has_stacks(experts):
                experts = experts.base_layer  # type: ignore[assignment]
            if not _has_stacks(experts) or hasattr(experts, _STACKS):
                continue
            stacks = {}
            for name, param in list(experts._parameters.items()):
                shape = _stack_shape(experts, param)
                if shape is not None:
                    stacks[name] = ExpertStack4bit(shape, dtype, double)
                    experts._parameters[name] = stacks[name].packed
            setattr(experts, _STACKS, stacks)
            runner = parent if _flat_stacks(experts) else child
            runner.forward = _dequantizing(runner.forward, experts, stacks)  # type: ignore[method-assign]


def _has_stacks(module: nn.Module) -> bool:
    """Whether `module` holds expert stacks (`_stack_shape`), or held them before
    `quantize_experts` packed them."""
    return any(_stack_shape(module, p) for p in module._parameters.values()) or hasattr(
        module, _STACKS
    )


#: Experts modules whose stacks are 2-D (E·i x h) with the expert count in this attribute.
_FLAT_STACKS = {"DbrxExpertGLU": "moe_num_experts"}


def _flat_stacks(module: nn.Module) -> bool:
    return type(module).__name__ in _FLAT_STACKS


def _stack_shape(module: nn.Module, param: Any) -> tuple[int, int, int] | None:
    """E x out x in of `param` if it is an expert stack of `module`, else None: a 3-D
    parameter, but not a convolution's kernel (Mamba's depthwise conv1d, out x 1 x kernel),
    which bitsandbytes leaves 16-bit; or one of DBRX's 2-D stacks (`_FLAT_STACKS`)."""
    if param is None or isinstance(module, nn.modules.conv._ConvNd):
        return None
    if param.dim() == 3:
        return (param.shape[0], param.shape[1], param.shape[2])
    if _flat_stacks(module) and param.dim() == 2:
        experts = getattr(module, _FLAT_STACKS[type(module).__name__])
        return (experts, param.shape[0] // experts, param.shape[1])
    return None


def _dequantizing(forward: Any, experts: nn.Module, stacks: dict[str, ExpertStack4bit]) -> Any:
    """`forward` with the dequantised stacks in place; the packed ones return in a `finally`,
    since checkpointing's recomputation stops by raising once it has what backward needs."""

    def run(*args: Any, **kwargs: Any) -> Any:
        for name, stack in stacks.items():
            experts._parameters[name] = stack.dequantize()
        try:
            return forward(*args, **kwargs)
        finally:
            for name, stack in stacks.items():
                experts._parameters[name] = stack.packed

    return run


def expert_stacks(model: nn.Module) -> Iterable[ExpertStack4bit]:
    for module in model.modules():
        yield from getattr(module, _STACKS, {}).values()


def hidden_params(model: nn.Module) -> int:
    """Weights the 4-bit storage holds packed: their count beyond the stored elements."""
    total = sum(stack.numel - stack.packed.numel() for stack in expert_stacks(model))
    for module in model.modules():
        if isinstance(module, Linear4bitStorage):
            total += module.in_features * module.out_features - module.weight.numel()
    return total


def is_prequantized(config: Mapping[str, Any]) -> bool:
    qc = config.get("quantization_config")
    if qc is None and isinstance(config.get("text_config"), Mapping):
        qc = config["text_config"].get("quantization_config")
    return isinstance(qc, Mapping) and bool(qc.get("load_in_4bit"))


def skip_modules(config: Mapping[str, Any]) -> tuple[str, ...]:
    qc = config.get("quantization_config")
    if not isinstance(qc, Mapping):
        return ()
    return tuple(qc.get("llm_int8_skip_modules") or ())


def double_quant(config: Mapping[str, Any]) -> bool:
    """A pre-quantised checkpoint says; QLoRA recipes (and the QLoRA paper) use it."""
    qc = config.get("quantization_config")
    if isinstance(qc, Mapping) and qc.get("load_in_4bit"):
        return bool(qc.get("bnb_4bit_use_double_quant", False))
    return True


def quantize_linears(
    model: nn.Module, skip: Iterable[str], dtype: torch.dtype, double: bool = True
) -> None:
    """Replace the decoder's linears by their NF4 storage, as transformers' bnb loader does.

    The loader converts every module that is exactly an `nn.Linear` (a subclass, such as
    Falcon's `FalconLinear`, stays 16-bit: `replace_with_bnb_linear` tests the type, not
    the class tree) or a GPT-2 `Conv1D`, except the output embedding (`lm_head`) and the
    modules `llm_int8_skip_modules` names, matched by the loader's own rule
    (`model.skip_module_matches`), under any text-model root.
    """
    from transformers.pytorch_utils import Conv1D

    skipped = ("lm_head", *skip)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear and not isinstance(child, Conv1D):
                continue
            # The text model is traced as a causal LM (`model.layers...`); an entry written
            # for a multimodal checkpoint's root (`language_model.model.layers...`) still
            # names the same module.
            text = full.removeprefix("model.")
            if any(
                skip_module_matches(entry, full) or skip_module_matches_text(entry, text)
                for entry in skipped
            ):
                continue
            if isinstance(child, Conv1D):  # weight stored (in, out)
                in_features, out_features = child.weight.shape
            else:
                in_features, out_features = child.in_features, child.out_features
            setattr(
                module,
                child_name,
                Linear4bitStorage(in_features, out_features, child.bias is not None, dtype, double),
            )


def prepare_for_kbit(model: nn.Module, norms_only: bool) -> None:
    """The parameters that are not 4-bit in fp32, as PEFT's `prepare_model_for_kbit_training`
    leaves them (every fp16/bf16 parameter but bitsandbytes' `Params4bit`: here every
    floating parameter outside `Linear4bitStorage` and the expert stacks, which hold packed
    bytes). `norms_only`: then the embeddings and LM head back to 16 bits, as TRL 0.8 to
    0.25 did under bf16 (`peft_module_casting_to_bf16`: a module that is an `nn.LayerNorm` or
    has "norm" in its name goes to fp32, the rest stays). Each 4-bit layer then returns its
    input's dtype, as bitsandbytes' does. Call before PEFT wraps the model."""
    made: dict[int, nn.Parameter] = {}  # a tied weight stays one tensor
    for name, module in model.named_modules():
        if isinstance(module, Linear4bitStorage):
            module.returns_input_dtype = True
            continue
        if norms_only and not (isinstance(module, nn.LayerNorm) or "norm" in name):
            continue
        for key, param in list(module._parameters.items()):
            if param is None or param.dtype not in (torch.float16, torch.bfloat16):
                continue
            if _stack_shape(module, param) is not None:  # 4-bit once `quantize_experts` runs
                continue
            if id(param) not in made:
                cast = torch.empty(param.shape, dtype=torch.float32, device=param.device)
                made[id(param)] = nn.Parameter(cast, requires_grad=param.requires_grad)
            module._parameters[key] = made[id(param)]


def quantized_tensors(model: nn.Module) -> Iterable[torch.Tensor]:
    for module in model.modules():
        if isinstance(module, Linear4bitStorage):
            yield from module.quant_state()
    for stack in expert_stacks(model):
        yield from stack.quant_state()


def _bnb_lora_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """PEFT's `lora.bnb.Linear4bit.forward`, vanilla-LoRA path, without autocast."""
    result = self.base_layer(x, *args, **kwargs).clone()
    for active in self.active_adapters:
        if active not in self.lora_A:
            continue
        lora_a, lora_b = self.lora_A[active], self.lora_B[active]
        expected = result.dtype
        x = self._cast_input_dtype(x, lora_a.weight.dtype)
        output = lora_b(lora_a(self.lora_dropout[active](x))) * self.scaling[active]
        result = result + output.to(expected)
    return result


def use_bnb_lora_forward(model: nn.Module) -> None:
    from peft.tuners.lora import Linear as LoraLinear

    for module in model.modules():
        if isinstance(module, LoraLinear) and isinstance(module.base_layer, Linear4bitStorage):
            module.forward = _bnb_lora_forward.__get__(module)  # type: ignore[method-assign]
