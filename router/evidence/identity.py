"""From a pool of the profile to the identity and context of a record, and to new records.

The configuration hash is the one of `router.config.vllm`: the evidence is bound to exactly the
settings the pool's servers are started with. `knobs_hash` goes the other way, from what a record
states back to the hash, so a record whose knobs and hash disagree shows.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from router.config.models import PoolConfig
from router.config.vllm import VllmSettings, server_configuration_hash
from router.evidence.records import (
    CapacityEvidenceRecord,
    CapacityKnobs,
    Identity,
    MeasuredSlice,
    MeasurementContext,
    MeasurementProtocol,
    Measurements,
    ServingConfiguration,
    WarmupState,
)


def capacity_knobs(settings: VllmSettings) -> CapacityKnobs:
    values = settings.model_dump(mode="json", include=set(CapacityKnobs.model_fields))
    if not settings.has_partial_prefill_flags:
        # Removed from vLLM: the server never sees them, whatever the profile says.
        values["max_num_partial_prefills"] = None
        values["max_long_partial_prefills"] = None
    return CapacityKnobs.model_validate(values)


def pool_identity(pool: PoolConfig) -> Identity:
    settings = pool.vllm
    return Identity(
        model_revision=settings.model_revision,
        vllm_version=settings.version,
        server_configuration_hash=server_configuration_hash(settings, pool.model),
        hardware_profile=settings.hardware_profile,
        served_model_name=pool.model,
    )


def serving_configuration(pool: PoolConfig) -> ServingConfiguration:
    """The pool's current configuration identity, to hold records against."""
    return ServingConfiguration(identity=pool_identity(pool), knobs=capacity_knobs(pool.vllm))


def recorded_settings(configuration: ServingConfiguration) -> VllmSettings:
    """The vLLM settings an identity and its knobs describe (`ValidationError` if none could)."""
    identity = configuration.identity
    values = {
        **configuration.knobs.model_dump(),
        "version": identity.vllm_version,
        "model_revision": identity.model_revision,
    }
    return VllmSettings.model_validate(values)


def knobs_hash(configuration: ServingConfiguration) -> str:
    """The configuration hash of a configuration's knobs, vLLM version, revision and model."""
    settings = recorded_settings(configuration)
    return server_configuration_hash(settings, configuration.identity.served_model_name)


def workload_sha256(workload: bytes) -> str:
    return "sha256:" + hashlib.sha256(workload).hexdigest()


def new_record(
    pool: PoolConfig,
    *,
    warmup: WarmupState,
    protocol: MeasurementProtocol,
    measured_slice: MeasuredSlice,
    measurements: Measurements,
    measured_at: datetime,
    security_boundary_note: str | None,
    supersedes: str | None = None,
) -> CapacityEvidenceRecord:
    """A record of a measurement of `pool` as it is configured now."""
    return CapacityEvidenceRecord(
        identity=pool_identity(pool),
        context=MeasurementContext(knobs=capacity_knobs(pool.vllm), warmup=warmup, protocol=protocol),
        measured_slice=measured_slice,
        measurements=measurements,
        measured_at=measured_at,
        security_boundary_note=security_boundary_note,
        supersedes=supersedes,
    )
