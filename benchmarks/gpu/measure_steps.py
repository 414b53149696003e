"""Real training steps on a CUDA GPU, measured, next to vramgate's prediction for each.

    python -m benchmarks.gpu.measure_steps --results benchmarks/gpu/results.jsonl

Needs a CUDA GPU, the `trace` extra and bitsandbytes (QLoRA); never run in CI. For each case
(bundled preset x full / LoRA / QLoRA x checkpointing on / off x batch and sequence length) a
fresh Python process builds the model from its config (random weights: no download, the same
memory), runs `--steps` AdamW steps and records torch.cuda.max_memory_allocated,
max_memory_reserved and NVML's figure for its own process. In this process, which never
touches CUDA, the same job is traced on fake tensors (controller.trace) and, where the trace
emits its allocation events, replayed through controller.allocator; the CUDA context from
controller.allocator.fixed_costs is added. One JSON line per case goes to --results, and a
table is printed at the end. benchmarks/gpu/README.md says what each column is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

GIB = 2**30
#: Bundled presets (controller/estimator/presets): configs only, weights built at random.
MODELS = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen3-0.6b")
METHODS = ("full", "lora", "qlora")
CHECKPOINTING = ("on", "off")
SHAPES = ((1, 1024), (2, 2048))
#: Attention both sides use: flash-attn may not be installed; the trace models flash as sdpa.
ATTENTION = "sdpa"
REPLAY_MISSING = (
    "the trace does not emit allocator events yet (TraceReport has no `events`): the replay "
    "columns stay empty and the NVML-level prediction uses the trace's peak and extras"
)


@dataclass(frozen=True)
class Case:
    model: str
    method: str
    checkpointing: str
    batch: int
    seq_len: int
    steps: int

    @property
    def name(self) -> str:
        return f"{self.model} {self.method} ckpt={self.checkpointing} {self.batch}x{self.seq_len}"


# -- the measurement, in a fresh process per case ------------------------------------------


def _nvml_process_bytes(device_index: int) -> int | None:
    """NVML's used memory for this process on the GPU, or None where NVML does not list
    this pid (a container's pid namespace): then the one compute process, if alone."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLError:
        return None
    for process in processes:
        if process.pid == os.getpid():
            return int(process.usedGpuMemory)
    if len(processes) == 1 and processes[0].usedGpuMemory is not None:
        return int(processes[0].usedGpuMemory)
    return None


def _build(case: Case, workdir: str) -> Any:
    """The model as controller.trace.build builds it, on the GPU with real bitsandbytes."""
    import torch
    from transformers import AutoModelForCausalLM

    from controller.estimator import load_preset
    from controller.estimator.settings import Attention
    from controller.trace.build import hf_config

    config = load_preset(case.model).config_dict()
    cfg = hf_config(config, Attention(ATTENTION))
    if case.method == "qlora":
        from transformers import BitsAndBytesConfig

        # Random weights saved once and loaded 4-bit: what a QLoRA job's load does.
        AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(workdir)
        quant = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=False,
        )
        model = AutoModelForCausalLM.from_pretrained(
            workdir, quantization_config=quant, dtype=torch.bfloat16, device_map={"": 0}
        )
    else:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.config.use_cache = False
    model.train()
    if case.method != "full":
        for param in model.parameters():
            param.requires_grad_(False)
    if case.checkpointing == "on":
        model.gradient_checkpointing_enable()
    if case.method != "full":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=16, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
            task_type="CAUSAL_LM",
        )  # fmt: skip
        model = get_peft_model(model, lora)
    return model


def measure(case: Case) -> dict[str, Any]:
    """Runs the case's steps on cuda:0 and returns what was measured."""
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context, before anything of the model
    torch.cuda.synchronize()
    context_nvml = _nvml_process_bytes(0)
    context_reserved = torch.cuda.memory_reserved()
    with tempfile.TemporaryDirectory() as workdir:
        model = _build(case, workdir)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    vocab = model.config.get_text_config().vocab_size
    # Building the model leaves initialisation temporaries cached: the step's figures start
    # from the weights alone, as the trace's do.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    weights_allocated = torch.cuda.memory_allocated()
    nvml_peak = 0
    started = time.perf_counter()
    for _ in range(case.steps):
        ids = torch.randint(0, vocab, (case.batch, case.seq_len), device="cuda")
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        nvml_peak = max(nvml_peak, _nvml_process_bytes(0) or 0)
    stats = torch.cuda.memory_stats()
    props = torch.cuda.get_device_properties(0)
    return {
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "nvml_process_bytes": nvml_peak or None,
        "context_nvml_bytes": (context_nvml - context_reserved) if context_nvml else None,
        "weights_allocated": weights_allocated,
        "segments_peak": stats.get("segment.all.peak"),
        "alloc_retries": stats.get("num_alloc_retries"),
        "step_seconds": (time.perf_counter() - started) / case.steps,
        "gpu": props.name,
        "gpu_total_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "LAZY (torch default)"),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


def _run_child(case: Case, timeout: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.gpu.measure_steps", "--child"]
    command.append(json.dumps(asdict(case)))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:300]}"}
    measured: dict[str, Any] = json.loads(lines[-1])
    return measured


# -- the prediction, here (fake tensors on the CPU; CUDA is never initialised) -------------


def predict(case: Case, alloc_conf: str) -> dict[str, Any]:
    from controller.allocator import (
        Event,
        fixed_bytes,
        parse_alloc_conf,
        replay,
        replay_live_intervals,
    )
    from controller.estimator import TrainingSettings, load_preset
    from controller.estimator.settings import Attention, Checkpointing, Method
    from controller.trace import trace

    settings = TrainingSettings(
        method=Method(case.method),
        batch=case.batch,
        seq_len=case.seq_len,
        gradient_checkpointing=Checkpointing(case.checkpointing),
        attention=Attention(ATTENTION),
    )
    started = time.perf_counter()
    report = trace(load_preset(case.model).config_dict(), settings, layers="full")
    context = fixed_bytes(1, 1)["cuda_context"]
    predicted: dict[str, Any] = {
        "trace_peak_bytes": report.peak_bytes,
        "trace_extras": dict(report.extras),
        "trace_seconds": round(time.perf_counter() - started, 1),
        "fixed_cuda_context": context,
        "replay_peak_allocated": None,
        "replay_peak_reserved": None,
    }
    events = getattr(report, "events", None) or getattr(report, "allocator_events", None)
    if events is None:
        predicted["replay_note"] = REPLAY_MISSING
        predicted["nvml_prediction"] = report.total_bytes
        return predicted
    config = parse_alloc_conf(alloc_conf)
    events = list(events)
    if events and not isinstance(events[0], Event):  # (size, born, died, stream) lifetimes
        result = replay_live_intervals(events, config)
    else:
        result = replay(events, config)
    predicted["replay_peak_allocated"] = result.peak_allocated
    predicted["replay_peak_reserved"] = result.peak_reserved
    predicted["nvml_prediction"] = result.peak_reserved + context
    return predicted


# -- the table -----------------------------------------------------------------------------


def _gib(value: Any) -> str:
    return f"{value / GIB:6.2f}" if isinstance(value, int) else "     -"


def _error(predicted: Any, measured: Any) -> str:
    if not isinstance(predicted, int) or not isinstance(measured, int) or not measured:
        return "     -"
    return f"{100 * (predicted - measured) / measured:+5.1f}%"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'case':<40} {'alloc':>6} {'resv':>6} {'nvml':>6} | {'trace':>6} {'err':>6} "
        f"{'replay':>6} {'err':>6} {'pred':>6} {'err':>6}"
    )
    for row in rows:
        m, p = row.get("measured", {}), row.get("predicted", {})
        if "error" in m:
            print(f"{row['case']:<40} measurement failed: {m['error']}")
            continue
        print(
            f"{row['case']:<40} {_gib(m.get('max_memory_allocated'))} "
            f"{_gib(m.get('max_memory_reserved'))} {_gib(m.get('nvml_process_bytes'))} | "
            f"{_gib(p.get('trace_peak_bytes'))} "
            f"{_error(p.get('trace_peak_bytes'), m.get('max_memory_allocated'))} "
            f"{_gib(p.get('replay_peak_reserved'))} "
            f"{_error(p.get('replay_peak_reserved'), m.get('max_memory_reserved'))} "
            f"{_gib(p.get('nvml_prediction'))} "
            f"{_error(p.get('nvml_prediction'), m.get('nvml_process_bytes'))}"
        )


def _cases(args: argparse.Namespace) -> list[Case]:
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    return [
        Case(model, method, ckpt, batch, seq_len, args.steps)
        for model in args.models.split(",")
        for method in args.methods.split(",")
        for ckpt in args.checkpointing.split(",")
        for batch, seq_len in shapes
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", help="JSON lines file the cases are appended to")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--checkpointing", default=",".join(CHECKPOINTING))
    parser.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in SHAPES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per measurement")
    parser.add_argument("--no-predict", action="store_true", help="measure only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Case(**json.loads(args.child)))), flush=True)
        return
    if not args.results:
        parser.error("--results is required")
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    rows = []
    for case in _cases(args):
        print(f"{case.name} ...", file=sys.stderr, flush=True)
        row: dict[str, Any] = {"case": case.name, **asdict(case)}
        row["measured"] = _run_child(case, args.timeout)
        if not args.no_predict:
            try:
                row["predicted"] = predict(case, alloc_conf)
            except Exception as error:  # a trace failure is a result too
                row["predicted"] = {"error": f"{type(error).__name__}: {error}"[:300]}
        with open(args.results, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")
        rows.append(row)
    if any("replay_note" in row.get("predicted", {}) for row in rows):
        print(f"note: {REPLAY_MISSING}", file=sys.stderr)
    print_table(rows)


if __name__ == "__main__":
    main()
