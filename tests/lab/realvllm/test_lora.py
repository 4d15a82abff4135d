"""The adapter builder's layout: what vLLM's PEFT loader looks for, shaped from the base config."""

from __future__ import annotations

from router.lab.realvllm.lora import RANK, TARGETS, adapter_config, projection_shapes, tensor_names


def test_shapes_follow_the_base_models_heads() -> None:
    tiny = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4}
    assert projection_shapes(tiny) == {"q_proj": (128, 128), "v_proj": (128, 128)}
    # Grouped-query attention: the value projection is narrower than the query's.
    grouped = {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2}
    assert projection_shapes(grouped) == {"q_proj": (256, 256), "v_proj": (256, 64)}


def test_every_layer_and_target_has_an_a_and_a_b() -> None:
    names = tensor_names(3)
    assert len(names) == 3 * len(TARGETS)
    proj, a, b = names[-1]
    assert (proj, a, b) == (
        "v_proj",
        "base_model.model.model.layers.2.self_attn.v_proj.lora_A.weight",
        "base_model.model.model.layers.2.self_attn.v_proj.lora_B.weight",
    )


def test_the_config_is_a_peft_lora_config() -> None:
    config = adapter_config("tiny")
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert config["r"] == RANK and config["target_modules"] == list(TARGETS)
    assert config["base_model_name_or_path"] == "tiny"
