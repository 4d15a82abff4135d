"""Records, configurations and targets for the evidence tests, built from the worked example."""

from __future__ import annotations

from typing import Any

import orjson

from router.config.vllm import VllmSettings
from router.evidence.build import serving_configuration
from router.evidence.example import POOL, example_profile, profile_a, record_a
from router.evidence.records import CapacityEvidenceRecord, ServingConfiguration, parse_record
from router.evidence.targets import Target

BASE_TARGET = Target(max_input_tokens=2048, max_output_tokens=512, concurrency=8)


def evolve(record: CapacityEvidenceRecord, changes: dict[str, Any]) -> CapacityEvidenceRecord:
    """A new, validated record: `record` with the dotted paths of `changes` set."""
    data = record.model_dump(mode="json", exclude={"record_id"})
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    return parse_record(orjson.dumps(data))


def base_record() -> CapacityEvidenceRecord:
    return record_a()


def current_a() -> ServingConfiguration:
    return serving_configuration(profile_a().pools[POOL])


def current_for(settings: VllmSettings) -> ServingConfiguration:
    cfg = example_profile(settings, max_in_flight=8, max_prompt=2048, max_output=512)
    return serving_configuration(cfg.pools[POOL])
