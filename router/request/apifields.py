"""The body fields of the routes beyond chat, completions and embeddings, as vLLM 0.32 defines
their requests (router.request.fields applies them; engine fields stay in its ENGINE_FIELDS).

Responses: OpenAI's fields that vLLM reads, and vLLM's sampling extras. `background` is open but
only `false` passes (router.request.apifacts): a background response would run on after its HTTP
exchange ends, outside every limit the router keeps. Rerank and score: the pooling fields. Audio:
the form fields of transcriptions and translations (`file` is the upload itself)."""

from __future__ import annotations

RESPONSES_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "background",
        "include",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "logit_bias",
        "parallel_tool_calls",
        "previous_response_id",
        "previous_input_messages",
        "reasoning",
        "include_reasoning",
        "service_tier",
        "store",
        "stream",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "top_k",
        "min_p",
        "truncation",
        "user",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "prompt_cache_key",
        "watermarking",
        "enable_response_messages",
        "structured_outputs",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "chat_template_kwargs",
    }
)

_POOLING = frozenset(
    {
        "model",
        "user",
        "truncate_prompt_tokens",
        "padding",
        "truncation_side",
        "use_activation",
        "max_tokens_per_query",
        "max_tokens_per_doc",
        "instruction",
        "chat_template_kwargs",
    }
)
RERANK_FIELDS = _POOLING | {"query", "documents", "top_n"}
SCORE_FIELDS = _POOLING | {"queries", "documents", "items", "data_1", "data_2", "text_1", "text_2"}

TOKENIZE_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "tools",
        "add_special_tokens",
        "return_token_strs",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
    }
)
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})

AUDIO_FIELDS = frozenset(
    {
        "file",
        "model",
        "language",
        "to_language",
        "hotwords",
        "prompt",
        "response_format",
        "timestamp_granularities[]",
        "timestamp_granularities",
        "stream",
        "stream_include_usage",
        "stream_continuous_usage_stats",
        "use_beam_search",
        "n",
        "length_penalty",
        "include_stop_str_in_output",
        "temperature",
        "watermarking",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "frequency_penalty",
        "repetition_penalty",
        "presence_penalty",
        "max_completion_tokens",
    }
)

# Anthropic Messages (`/v1/messages`): the fields vLLM's request reads. Its engine fields
# (cache_salt, kv/ec transfer, vllm_xargs, mm_payload) stay in ENGINE_FIELDS. count_tokens reads
# the prompt's fields alone.
MESSAGES_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "metadata",
        "output_config",
        "thinking",
        "stop_sequences",
        "stream",
        "system",
        "temperature",
        "tool_choice",
        "tools",
        "top_k",
        "top_p",
        "watermarking",
        "chat_template_kwargs",
    }
)
MESSAGES_ENGINE_FIELDS = frozenset(
    {"cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "mm_payload", "return_mm_kwargs"}
)
COUNT_TOKENS_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "output_config",
        "thinking",
        "chat_template_kwargs",
    }
)
