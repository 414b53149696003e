"""The base of every API model: camelCase field names, unknown fields refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

GROUP = "vramgate.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: The label vramgate puts on every object it creates for a job (the FineTuneJob's name):
#: how the operator finds a job's workload and pods, and how people select them.
JOB_LABEL = f"{GROUP}/finetunejob"
#: The label on every object created for a job (its pods too) with the FineTuneJob's uid: a
#: job deleted and applied again has the same name, and its predecessor's pods, still
#: terminating, are not the new job's; and it selects a job's Job whatever the name.
JOB_UID_LABEL = f"{GROUP}/finetunejob-uid"
#: The annotation the mutating webhook puts on a job whose GPU count it rewrote: the count the
#: manifest asked for, so that applying that manifest again keeps the count given at create.
REQUESTED_GPUS_ANNOTATION = f"{GROUP}/requested-gpus"
#: The extended resource of the NVIDIA device plugin: whole GPUs.
GPU_RESOURCE = "nvidia.com/gpu"
#: The GPU product label of GPU feature discovery (e.g. NVIDIA-H100-80GB-HBM3).
PRODUCT_LABEL = "nvidia.com/gpu.product"
#: GPU feature discovery's label of each GPU's memory, in MiB (e.g. 81559 on an H100 80GB).
MEMORY_LABEL = "nvidia.com/gpu.memory"
#: GPU feature discovery's label of the node's GPU count.
COUNT_LABEL = "nvidia.com/gpu.count"
#: The GPU operator's label of a node with NVIDIA GPUs ("true").
PRESENT_LABEL = "nvidia.com/gpu.present"


class ApiModel(BaseModel):
    """Python names in snake_case, wire names in camelCase (`micro_batch_size` is
    `microBatchSize`); extra keys are errors, as the API server prunes them."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    @classmethod
    def wire_names(cls) -> list[str]:
        """The camelCase field names, in declaration order."""
        return [field.alias or name for name, field in cls.model_fields.items()]
