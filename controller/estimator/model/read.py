"""Reading a config dict: typed fields with one-line errors (`Reader`), the language model's
fields with its config class's defaults filled in, what a config must state, and what the
estimate read that it does not.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Set
from functools import cache
from importlib import resources
from typing import Any, NamedTuple

from controller.estimator.errors import SpecError, shown
from controller.estimator.model.families import Family
from controller.estimator.model.shape import ArchDims, Quantization

EXPERT_COUNT_FIELDS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_num_experts",
    "ffn_config.moe_num_experts",  # DBRX
)
TOP_K_FIELDS = (
    "num_experts_per_tok",
    "num_experts_per_token",
    "experts_per_token",
    "top_k_experts",
    "moe_topk",
    "moe_k",  # ERNIE 4.5
    "ffn_config.moe_top_k",  # DBRX
)
SHARED_COUNT_FIELDS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")


# Upper bounds on config fields, each far above any released model (126 layers, 384 experts,
# widths of tens of thousands, vocabularies of 262,144): parsing and pricing walk the layers,
# and products of widths must stay within exact integers and finite floats.
MAX_LAYERS = 4096
MAX_EXPERTS = 4096
MAX_DIMENSION = 2**24


class Reader:
    """Typed access to config fields with one-line errors naming the field."""

    def __init__(self, config: Mapping[str, Any], prefix: str) -> None:
        self.config = config
        self.prefix = prefix

    def path(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def get(self, name: str) -> Any:
        """The field's value; a dotted name reads a nested object (DBRX's `ffn_config.x`)."""
        if "." not in name:
            return self.config.get(name)
        value: Any = self.config
        for part in name.split("."):
            if not isinstance(value, Mapping):
                return None
            value = value.get(part)
        return value

    def has(self, name: str) -> bool:
        return self.get(name) is not None

    def int(
        self,
        *names: str,
        default: int | None = None,
        minimum: int = 1,
        maximum: int | None = MAX_DIMENSION,
    ) -> int | None:
        get = self.get
        for name in names:
            value = get(name)
            if value is None:
                continue
            # The common case in one test (`type` is exact, so a bool never passes here).
            if type(value) is int and minimum <= value and (maximum is None or value <= maximum):
                return value
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(self.path(name), f"must be an integer, got {shown(value)}")
            if value < minimum:
                raise SpecError(
                    self.path(name), f"must be greater than or equal to {minimum}, got {value}"
                )
            if maximum is not None and value > maximum:
                raise SpecError(
                    self.path(name), f"must be less than or equal to {maximum}, got {value}"
                )
            return value
        return default

    def dim(self, name: str) -> builtins.int | None:
        """`int(name)` with its defaults, by a faster path for a width in range: most of a
        config's fields are read this way, on every raw-config estimate."""
        value = self.config.get(name)
        if value is None or (type(value) is builtins.int and 1 <= value <= MAX_DIMENSION):
            return value
        return self.int(name)

    # `builtins.int`: inside the class, `int` is the method above.
    def required_int(self, *names: str, maximum: builtins.int = MAX_DIMENSION) -> builtins.int:
        value = self.int(*names, maximum=maximum)
        if value is None:
            raise SpecError(self.path(names[0]), "is required in a model config")
        return value

    def bool(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SpecError(self.path(name), f"must be true or false, got {shown(value)}")
        return value


#: Fields read under several names: a class default under one name must not outrank the
#: config's value under another (Qwen3-MoE's class says num_experts; a config saying
#: num_local_experts means that).
_ALIASES = (
    ("hidden_size", "n_embd", "d_model"),
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    ("num_attention_heads", "n_head", "n_heads"),
    ("num_key_value_heads", "num_kv_heads"),
    ("intermediate_size", "ffn_hidden_size", "n_inner"),
    EXPERT_COUNT_FIELDS,
    TOP_K_FIELDS,
    SHARED_COUNT_FIELDS,
)


@cache
def model_defaults() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """By model_type, the constructor defaults of its transformers config class; and by
    wrapper model_type, the class transformers builds a `text_config` naming no model_type
    with (Mistral 3's: a MistralConfig), whose defaults then apply."""
    text = resources.files("controller.estimator").joinpath("model_defaults.json").read_text()
    data = json.loads(text)
    classes = {k: v for k, v in data.items() if not k.startswith("_")}
    return classes, data["_text_config_types"]


class Defaulted(NamedTuple):
    """The fields of a config that its class's defaults filled in, that class, and whether
    the fields are a nested `text_config`'s."""

    model_type: str
    fields: Set[str]
    nested: bool = False


def read_text_config(
    config: Mapping[str, Any], prefix: str
) -> tuple[Mapping[str, Any], str, Defaulted]:
    """The language model's fields, with the config class's defaults filled in, its path, and
    which fields a default filled in.

    Multimodal configs nest the language model under `text_config` (Gemma 3, Llava...);
    fields the nested config omits fall back to the outer one (e.g. tie_word_embeddings),
    then to the defaults of its `model_type`'s config class.
    """
    text = config.get("text_config")
    if text is None:
        merged, path = dict(config), prefix
    elif not isinstance(text, Mapping):
        raise SpecError(f"{prefix}.text_config" if prefix else "text_config", "must be an object")
    else:
        merged = {k: v for k, v in config.items() if k != "text_config"} | dict(text)
        path = f"{prefix}.text_config" if prefix else "text_config"
    classes, text_types = model_defaults()
    model_type = str(merged.get("model_type", ""))
    if text is not None and "model_type" not in text:
        model_type = text_types.get(model_type, model_type)
    defaults = classes.get(model_type, {})
    for names in _ALIASES if defaults else ():
        if any(name in merged for name in names):  # the config's own name wins, whichever
            defaults = {k: v for k, v in defaults.items() if k not in names}
    filled = defaults.keys() - merged.keys()
    return defaults | merged, path, Defaulted(model_type, filled, text is not None)


#: The dimensions every estimate is built on, each under the names configs write it: a config
#: must state them. transformers' `save_pretrained` always writes them at a config's top
#: level (it leaves out only what equals the base config class's defaults, which hold none
#: of them), so only a hand-written config lacks one, and its class's default would stand in
#: another model's size (`{"model_type": "llama"}` read as Llama-2-7B). A nested
#: `text_config` is the exception: transformers 4 wrote it without what equals its class's
#: defaults (llava-1.5-7b's holds none of these, Gemma 3 4B's no heads nor vocabulary), so
#: there the class's defaults are read, as transformers loads them, and said
#: (`defaults_read`).
REQUIRED_DIMENSIONS: tuple[tuple[str, ...], ...] = (
    ("hidden_size", "n_embd", "d_model"),
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    ("num_attention_heads", "n_head", "n_heads"),
    ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_config.ffn_hidden_size"),
    ("vocab_size",),
)
#: Class defaults read without a warning: transformers' own save leaves tie_word_embeddings
#: out wherever it equals the class's default, so real configs omit it; the context length
#: decides only a warning of its own; sliding_window shapes only Gemma 3n (no class here);
#: ERNIE's moe_layer_end_index -1 is no size but "to the last layer" (its published config
#: leaves it out).
_QUIET_DEFAULTS = frozenset(
    {"tie_word_embeddings", "max_position_embeddings", "sliding_window", "moe_layer_end_index"}
)
_KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads", "attn_config.kv_n_heads")


def missing_dimensions(r: Reader, defaulted: Defaulted, fam: Family) -> list[SpecError]:
    """One error for each of `REQUIRED_DIMENSIONS` the config does not state (in a nested
    text_config, its class's default stands in), naming the default it was not read as; and
    where one is missing, the errors of those it states, so that one answer lists them all.
    None missing, nothing: `read_dims` reads them, and says what is wrong in its order."""
    errors, missing = [], False
    for names in REQUIRED_DIMENSIONS:
        if fam.stack == "pattern" and names[0] == "num_hidden_layers":
            continue  # its layer pattern counts the layers (`stacks._nemotron_mixers`)
        stated = [n for n in names if r.get(n) is not None and n not in defaulted.fields]
        if stated:
            # intermediate_size may list [text, vision] widths: `read_dims` checks those
            if not isinstance(r.get(stated[0]), list):
                bound = MAX_LAYERS if names[0] == "num_hidden_layers" else MAX_DIMENSION
                try:
                    r.int(stated[0], maximum=bound)
                except SpecError as error:
                    errors.append(error)
            continue
        if defaulted.nested and names[0] in defaulted.fields:
            continue
        missing = True
        message = "is required in a model config: the estimate depends on it"
        if names[0] in defaulted.fields:
            default = json.dumps(r.get(names[0]))
            message += f" (transformers' {defaulted.model_type} default, {default}, may be "
            message += "another model's)"
        errors.append(SpecError(r.path(names[0]), message))
    return errors if missing else []


def defaults_read(r: Reader, defaulted: Defaulted, dims: ArchDims) -> tuple[tuple[str, str], ...]:
    """What the estimate read that the config does not state, where it changes the estimate:
    its class's defaults (in one line), and key/value heads taken to be the attention heads
    (so no grouped-query attention), as transformers reads a config without them."""
    notes = []
    order = model_defaults()[0].get(defaulted.model_type, {})
    used = [name for name in order if name in defaulted.fields and name not in _QUIET_DEFAULTS]
    if used:
        values = ", ".join(f"{name}={json.dumps(r.get(name))}" for name in used)
        notes.append(
            (
                r.prefix or "config",
                f"estimated with the defaults of transformers' {defaulted.model_type} config "
                f"class for what the config leaves out ({values}), as transformers loads it; "
                "set them in the config if the model's differ",
            )
        )
    stated_kv = any(r.get(name) is not None for name in _KV_HEAD_FIELDS)
    if not stated_kv and dims.kv_lora_rank is None and dims.num_heads > 1:
        notes.append(
            (
                r.path("num_key_value_heads"),
                f"not in the config, so estimated as num_attention_heads ({dims.num_heads}): "
                "keys and values for every head, as transformers reads it; set it if the "
                "model shares them among heads (grouped-query attention)",
            )
        )
    return tuple(notes)


def read_quantization(
    config: Mapping[str, Any], text: Mapping[str, Any], prefix: str
) -> Quantization | None:
    qc = config.get("quantization_config") or text.get("quantization_config")
    if qc is None:
        return None
    path = f"{prefix}.quantization_config" if prefix else "quantization_config"
    if not isinstance(qc, Mapping):
        raise SpecError(path, "must be an object")
    skip = qc.get("llm_int8_skip_modules") or ()
    if not isinstance(skip, list | tuple) or not all(isinstance(s, str) for s in skip):
        raise SpecError(f"{path}.llm_int8_skip_modules", "must be a list of module names")
    method = str(qc.get("quant_method", "bitsandbytes"))
    flags = Reader(qc, path)  # strict: bool("no") would read as a 4-bit checkpoint
    return Quantization(
        method=method,
        load_in_4bit=flags.bool("load_in_4bit", False),
        double_quant=flags.bool("bnb_4bit_use_double_quant", False),
        skip_modules=tuple(skip),
    )
