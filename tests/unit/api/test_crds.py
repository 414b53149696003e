"""The CRDs are generated from the models, structural, self-describing, and committed as is."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from controller.api import crds
from controller.api.schema import SchemaError, structural_schema
from controller.cli import main
from controller.estimator import Profile, TrainingSettings, build_settings
from controller.jobs.spec import translate

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "charts" / "vramgate" / "crds"
# Structural schemas forbid these (or they have no meaning for the API server).
FORBIDDEN = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "uniqueItems"}


def _schema(info: crds.CrdInfo) -> dict[str, Any]:
    manifest = crds.crd_manifest(info)
    return manifest["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("info", crds.CRDS, ids=lambda i: i.kind)
def test_the_schema_is_structural(info: crds.CrdInfo) -> None:
    for path, node in _nodes(_schema(info)):
        assert not FORBIDDEN & node.keys(), path
        assert "type" in node, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node["type"] != "number", f"{path}: no floats in the API"
        if node["type"] == "integer":
            assert node["format"] == "int64", path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert node["type"] == "object" and "properties" not in node, path


@pytest.mark.parametrize("info", crds.CRDS, ids=lambda i: i.kind)
def test_every_field_is_described_starting_with_its_name(info: crds.CrdInfo) -> None:
    for path, node in _nodes(_schema(info)):
        name = path.rsplit(".", 1)[-1]
        if not path or name == "metadata" or name.endswith(("[]", "}")):
            continue
        assert node.get("description", "").startswith(name + " "), path


def test_the_committed_manifests_are_the_generated_ones() -> None:
    assert crds.drift(COMMITTED) == [], "run `vramgate crds` and commit the result"


def test_printer_columns_point_at_fields_that_exist() -> None:
    for info in crds.CRDS:
        schema = _schema(info)
        paths = {path for path, _ in _nodes(schema)}
        for column in info.printer_columns:
            json_path = re.sub(r"\[(\d+|\*)\]", "[]", column["jsonPath"].split("[?", 1)[0])
            if json_path == ".metadata.creationTimestamp":
                continue
            assert json_path in paths, (info.kind, column)


def test_finetunejob_printer_columns_are_the_documented_ones() -> None:
    shown = [c["name"] for c in crds.FINETUNEJOB.printer_columns if "priority" not in c]
    assert shown == [
        "Method", "Model", "GPUs", "VRAM/GPU", "Admitted", "Reason", "Workload", "Age"
    ]  # fmt: skip


def test_finetunejob_wide_columns_add_the_estimate_on_one_gpu_and_the_node() -> None:
    """`kubectl get ftj -o wide` shows where an admitted job runs. The API server prints a
    column's first match only (`[*]` too), so the path says it: the first node."""
    wide = [c for c in crds.FINETUNEJOB.printer_columns if c.get("priority") == 1]
    assert [c["name"] for c in wide] == ["Estimated", "VRAM@1GPU", "Node"]
    assert wide[-1]["jsonPath"] == ".status.placement.nodes[0].node"
    assert wide[-1]["type"] == "string"


def test_gpunode_printer_columns_show_the_heartbeats_age() -> None:
    """A silent agent leaves Free and Ready as last written: the heartbeat's age shows it."""
    shown = [c["name"] for c in crds.GPUNODE.printer_columns if "priority" not in c]
    assert shown == ["GPUs", "Product", "Free", "Heartbeat", "Age"]
    (heartbeat,) = [c for c in crds.GPUNODE.printer_columns if c["name"] == "Heartbeat"]
    assert heartbeat["type"] == "date"
    assert heartbeat["jsonPath"] == ".status.heartbeatTime"


def test_finetunejob_names_and_scope() -> None:
    spec = crds.crd_manifest(crds.FINETUNEJOB)["spec"]
    assert spec["group"] == "vramgate.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["ftj"]
    assert spec["versions"][0]["name"] == "v1alpha1"
    assert spec["versions"][0]["subresources"] == {"status": {}}
    assert crds.crd_manifest(crds.GPUNODE)["spec"]["scope"] == "Cluster"


def test_schema_defaults_are_the_estimators_defaults() -> None:
    """A spec defaulted by the API server estimates like a bare TrainingSettings()."""
    spec = _schema(crds.FINETUNEJOB)["properties"]["spec"]["properties"]
    training = {k: v.get("default") for k, v in spec["training"]["properties"].items()}
    lora = {k: v.get("default") for k, v in spec["lora"]["properties"].items()}
    assert lora["rank"] is None
    values = {
        "method": "QLoRA",
        "rank": 16,  # no API default: a LoRA or QLoRA job must choose its rank
        "targets": lora["targetModules"],
        "batch": training["microBatchSize"],
        "seq_len": training["sequenceLength"],
        "image_tokens": training["imageTokens"],
        "gradient_checkpointing": training["gradientCheckpointing"],
        "optimizer": training["optimizer"],
        "attention": training["attention"],
        "precision": training["precision"],
        "fused_loss": training["fusedLoss"],
        "gradient_accumulation": training["gradientAccumulationSteps"],
        "profile": spec["estimator"]["properties"]["profile"]["default"],
    }
    settings, errors = build_settings(values)
    assert errors == []
    # The one intended difference: the operator estimates with the calibrated profile, the
    # CLI (which reproduces the seeds' figures) with the analytic one.
    assert settings == replace(TrainingSettings(), profile=Profile.CALIBRATED)


def test_adapters_need_a_rank() -> None:
    spec = _schema(crds.FINETUNEJOB)["properties"]["spec"]
    (rule,) = spec["x-kubernetes-validations"]
    assert rule["message"] == "lora.rank is required when method is LoRA or QLoRA"


def _cel(expression: str, obj: dict[str, Any]) -> Any:
    """`expression` evaluated on `obj`, for the few CEL forms the GPU-bound rules use: has(),
    field access, comparisons, || and &&."""
    python = re.sub(r"!has\(self\.(\w+)\)", r"(not has('\1'))", expression)
    python = re.sub(r"self\.(\w+)", r"obj['\1']", python)
    python = python.replace("||", " or ").replace("&&", " and ")
    assert "!" not in python and "?" not in python, expression
    return eval(python, {"has": obj.__contains__, "obj": obj})


def _bounds_errors(resources: dict[str, Any]) -> list[str]:
    """What the GPU-bound rules of spec.resources say about `resources`, defaulted first as
    the API server does (minGPUs 1, gpus 1), as `field: message`."""
    schema = _schema(crds.FINETUNEJOB)["properties"]["spec"]["properties"]["resources"]
    defaults = {k: v["default"] for k, v in schema["properties"].items() if "default" in v}
    obj = {**defaults, **resources}
    return [
        f"spec.resources{rule.get('fieldPath', '')}: {rule['message']}"
        for rule in schema["x-kubernetes-validations"]
        if not _cel(rule["rule"], obj)
    ]


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        # Only the field's own minimum applies: no bound was written, none is named.
        ({"gpus": 0}, []),
        ({"gpus": -1}, []),
        ({"gpus": 0, "maxGPUs": 4}, []),
        ({"gpus": 1, "minGPUs": 2}, ["spec.resources.gpus: must be greater than or equal to "
                                     "minGPUs"]),
        ({"gpus": 8, "maxGPUs": 4}, ["spec.resources.gpus: must be less than or equal to "
                                     "maxGPUs"]),
        ({"minGPUs": 4, "maxGPUs": 2, "gpus": 3}, [
            "spec.resources.maxGPUs: must be greater than or equal to minGPUs",
            "spec.resources.gpus: must be greater than or equal to minGPUs",
            "spec.resources.gpus: must be less than or equal to maxGPUs",
        ]),
        ({"gpus": 3, "minGPUs": 2, "maxGPUs": 4}, []),
        ({"maxGPUs": 1}, []),
    ],
)  # fmt: skip
def test_the_gpu_bound_rules_name_only_the_bounds_that_refuse_the_count(
    resources: dict[str, Any], expected: list[str]
) -> None:
    """The API server defaults minGPUs to 1 before it validates: gpus 0 without bounds must
    not be told it lies outside minGPUs and maxGPUs (the field's minimum says it all)."""
    assert _bounds_errors(resources) == expected


def test_the_gpu_bound_rules_word_their_errors_as_the_spec_validator_does() -> None:
    """Where the webhook is down, the API server says what the operator would, in its words
    less the values (the validator stops at an inverted range; the rules also name the count
    outside it)."""
    for resources in ({"gpus": 1, "minGPUs": 2}, {"gpus": 3, "minGPUs": 4, "maxGPUs": 2}):
        _, errors = translate({"model": {"preset": "llama-3.2-1b"}, "method": "Full",
                               "resources": resources})  # fmt: skip
        said = _bounds_errors(resources)
        assert errors
        for error in errors:
            assert any(str(error).startswith(f"{rule} (") for rule in said), (error, said)


def test_the_model_source_is_exactly_one_of_three() -> None:
    model = _schema(crds.FINETUNEJOB)["properties"]["spec"]["properties"]["model"]
    (rule,) = model["x-kubernetes-validations"]
    assert rule["message"] == "must set exactly one of preset, config, configMapRef"
    assert model["properties"]["config"]["x-kubernetes-preserve-unknown-fields"] is True


def test_conditions_are_a_map_keyed_by_type() -> None:
    status = _schema(crds.FINETUNEJOB)["properties"]["status"]["properties"]
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["items"]["required"] == [
        "type",
        "status",
        "lastTransitionTime",
        "reason",
        "message",
    ]
    assert status["estimate"]["properties"]["components"]["additionalProperties"] == {
        "type": "integer",
        "format": "int64",
    }


def test_gpunode_gpus_are_keyed_by_uuid_and_pods_by_uid() -> None:
    """MIG devices share their parent's index: only the UUID tells devices apart."""
    gpus = _schema(crds.GPUNODE)["properties"]["status"]["properties"]["gpus"]
    assert gpus["x-kubernetes-list-type"] == "map"
    assert gpus["x-kubernetes-list-map-keys"] == ["uuid"]
    item = gpus["items"]
    assert item["required"] == ["uuid", "index", "product"]  # a map key must be required
    fields = item["properties"]
    pods = fields["pods"]
    assert pods["x-kubernetes-list-type"] == "map"
    assert pods["x-kubernetes-list-map-keys"] == ["uid"]
    assert pods["items"]["required"] == ["uid"]
    assert pods["items"]["properties"]["usedBytes"]["minimum"] == 0
    assert fields["mig"]["required"] == ["parentUUID", "gpuInstanceId"]
    assert set(fields["mig"]["properties"]) == {"parentUUID", "gpuInstanceId", "computeInstanceId"}


def test_gpunode_memory_figures_are_optional_and_the_two_reservations_distinct() -> None:
    fields = _schema(crds.GPUNODE)["properties"]["status"]["properties"]["gpus"]["items"][
        "properties"
    ]
    assert fields["memoryInfoSupported"] == {
        "description": fields["memoryInfoSupported"]["description"],
        "type": "boolean",
        "default": True,
    }
    for name in ("totalBytes", "freeBytes", "usedBytes", "driverReservedBytes", "reservedBytes"):
        assert fields[name]["type"] == "integer" and fields[name]["minimum"] == 0, name
        assert "in bytes" in fields[name]["description"], name
    assert "operator" in fields["reservedBytes"]["description"]
    assert "driver" in fields["driverReservedBytes"]["description"]


def test_a_union_of_types_is_refused() -> None:
    class Loose(BaseModel):
        value: int | str = Field(description="value is anything")

    with pytest.raises(SchemaError, match="anyOf of several types"):
        structural_schema(Loose)


def test_a_free_form_object_needs_preserve_unknown_fields() -> None:
    class Free(BaseModel):
        value: dict[str, Any] = Field(description="value is anything")

    with pytest.raises(SchemaError, match="x-kubernetes-preserve-unknown-fields"):
        structural_schema(Free)


# -- the CLI -----------------------------------------------------------------------------


def test_crds_writes_then_check_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "finetunejobs.vramgate.dev.yaml",
        "gpunodes.vramgate.dev.yaml",
        "learnedcorrections.vramgate.dev.yaml",
    ]
    assert main(["crds", "--dir", str(tmp_path), "--check"]) == 0
    capsys.readouterr()
    assert main(["crds", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "", "an unchanged file is not rewritten"


def test_crds_check_fails_on_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["crds", "--dir", str(tmp_path)])
    edited = tmp_path / "finetunejobs.vramgate.dev.yaml"
    edited.write_text(edited.read_text().replace("rank is the LoRA rank", "rank is a rank"))
    (tmp_path / "gpunodes.vramgate.dev.yaml").unlink()
    capsys.readouterr()
    assert main(["crds", "--dir", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "finetunejobs.vramgate.dev.yaml: differs from the models" in err[0]
    assert "gpunodes.vramgate.dev.yaml: missing" in err[1]


def test_crds_stdout_prints_every_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--stdout"]) == 0
    documents = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["metadata"]["name"] for d in documents] == [
        "finetunejobs.vramgate.dev",
        "gpunodes.vramgate.dev",
        "learnedcorrections.vramgate.dev",
    ]


# -- the chart's template copies -----------------------------------------------------------


def _fake_chart(tmp_path: Path) -> Path:
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: fake\nversion: 0.1.0\n")
    return tmp_path / "crds"


def test_the_chart_templates_are_written_and_checked_beside_its_crds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _fake_chart(tmp_path)
    assert main(["crds", "--dir", str(directory)]) == 0
    templates = tmp_path / "templates" / "crds"
    assert sorted(p.name for p in templates.iterdir()) == [
        "finetunejobs.vramgate.dev.yaml",
        "gpunodes.vramgate.dev.yaml",
        "learnedcorrections.vramgate.dev.yaml",
    ]
    assert main(["crds", "--dir", str(directory), "--check"]) == 0
    edited = templates / "gpunodes.vramgate.dev.yaml"
    edited.write_text(edited.read_text().replace("resource-policy: keep", "resource-policy: x"))
    capsys.readouterr()
    assert main(["crds", "--dir", str(directory), "--check"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "templates/crds/gpunodes.vramgate.dev.yaml: differs from the models" in line


def test_the_committed_chart_templates_are_covered_by_the_check() -> None:
    templates = REPO / "charts" / "vramgate" / crds.TEMPLATE_DIR
    assert sorted(p.name for p in templates.glob("*.yaml")) == sorted(crds.rendered())
    assert crds.drift(COMMITTED) == []


@pytest.mark.parametrize("info", crds.CRDS, ids=lambda i: i.kind)
def test_a_template_is_the_plain_manifest_behind_the_toggle_and_kept_on_uninstall(
    info: crds.CrdInfo,
) -> None:
    text = crds.render_template(info)
    lines = text.splitlines()
    assert lines[1] == "{{- if .Values.crds.install }}" and lines[-1] == "{{- end }}"
    # Helm's own syntax filled in, it is the plain manifest plus labels and the annotation.
    body = "\n".join(lines[2:-1]).replace(
        '{{- include "vramgate.labels" . | nindent 4 }}', "app.kubernetes.io/part-of: vramgate"
    )
    manifest = yaml.safe_load(body)
    assert manifest["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert manifest["metadata"]["labels"] == {"app.kubernetes.io/part-of": "vramgate"}
    assert manifest["spec"] == crds.crd_manifest(info)["spec"]
