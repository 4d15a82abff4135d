# vLLM servers for profile 'class-aware' (cpu): one command per backend.
# Set each pool's upstream key variable first; a LANE_ROUTER_MODEL_* variable may name
# a local copy of the model instead of the hub id.
# note: pools interactive, batch, prefix, slow: vLLM 0.32.0 has no partial-prefill flags: the
#   router's pool admission (max_prefilling / max_long_prefilling) enforces the chunked-prefill rule
#   instead

# pool interactive, backend 0: http://127.0.0.1:8101
VLLM_API_KEY="${POOL_INTERACTIVE_KEY:?set POOL_INTERACTIVE_KEY}" python -m vllm.entrypoints.openai.api_server --model "${LANE_ROUTER_MODEL_INTERACTIVE:-meta-llama/Llama-3.1-8B-Instruct}" --host 127.0.0.1 --port 8101 --served-model-name meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 --max-num-batched-tokens 2048 --max-num-seqs 64 --long-prefill-token-threshold 512 --stream-interval 1 --scheduling-policy fcfs --block-size 16 --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 1 --dtype auto --kv-cache-dtype auto --enable-prefix-caching --enable-chunked-prefill

# pool interactive, backend 1: http://127.0.0.1:8102
VLLM_API_KEY="${POOL_INTERACTIVE_KEY:?set POOL_INTERACTIVE_KEY}" python -m vllm.entrypoints.openai.api_server --model "${LANE_ROUTER_MODEL_INTERACTIVE:-meta-llama/Llama-3.1-8B-Instruct}" --host 127.0.0.1 --port 8102 --served-model-name meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 --max-num-batched-tokens 2048 --max-num-seqs 64 --long-prefill-token-threshold 512 --stream-interval 1 --scheduling-policy fcfs --block-size 16 --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 1 --dtype auto --kv-cache-dtype auto --enable-prefix-caching --enable-chunked-prefill

# pool batch, backend 0: http://127.0.0.1:8201
VLLM_API_KEY="${POOL_BATCH_KEY:?set POOL_BATCH_KEY}" python -m vllm.entrypoints.openai.api_server --model "${LANE_ROUTER_MODEL_BATCH:-meta-llama/Llama-3.1-8B-Instruct}" --host 127.0.0.1 --port 8201 --served-model-name meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768 --max-num-batched-tokens 16384 --max-num-seqs 128 --long-prefill-token-threshold 4096 --stream-interval 4 --scheduling-policy fcfs --block-size 16 --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 1 --dtype auto --kv-cache-dtype auto --enable-prefix-caching --enable-chunked-prefill

# pool batch, backend 1: http://127.0.0.1:8202
VLLM_API_KEY="${POOL_BATCH_KEY:?set POOL_BATCH_KEY}" python -m vllm.entrypoints.openai.api_server --model "${LANE_ROUTER_MODEL_BATCH:-meta-llama/Llama-3.1-8B-Instruct}" --host 127.0.0.1 --port 8202 --served-model-name meta-llama/Llama-3.1-8B-Instruct --max-model-len 32768 --max-num-batched-tokens 16384 --max-num-seqs 128 --long-prefill-token-threshold 4096 --stream-interval 4 --scheduling-policy fcfs --block-size 16 --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 1 --dtype auto --kv-cache-dtype auto --enable-prefix-caching --enable-chunked-prefill

# pool prefix, backend 0: http://127.0.0.1:8301
VLLM_API_KEY="${POOL_PREFIX_KEY:?set POOL_PREFIX_KEY}" python -m vllm.entrypoints.openai.api_server --model "${LANE_ROUTER_MODEL_PREFIX:-meta-llama/Llama-3.1-8B-Instruct}" --host 127.0.0.1 --port 8301 --served-model-name meta-llama/Llama-3.1-8B-Instruct --max-model-len 16384 --max-num-batched-tokens 4096 --max-num-seqs 64 --long-prefill-token-threshold 1024 --stream-interval 1 --scheduling-policy fcfs --block-size 16 --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 1 --dtype auto --kv-cache-dtype auto --enable-prefix-caching --enable-chunked-prefill

# pool prefix, backend 1: http://127.0.0.1:8302
VLLM_API_KEY="${POOL_PREFIX_KEY:?set POOL_PREFIX_KEY}" python -m vllm.entrypoints.openai.api_server --model "${LANE_ROUTER_MODEL_PREFIX:-meta-llama/Llama-3.1-8B-Instruct}" --host 127.0.0.1 --port 8302 --served-model-name meta-llama/Llama-3.1-8B-Instruct --max-model-len 16384 --max-num-batched-tokens 4096 --max-num-seqs 64 --long-prefill-token-threshold 1024 --stream-interval 1 --scheduling-policy fcfs --block-size 16 --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 1 --dtype auto --kv-cache-dtype auto --enable-prefix-caching --enable-chunked-prefill

# pool slow, backend 0: http://127.0.0.1:8401
VLLM_API_KEY="${POOL_SLOW_KEY:?set POOL_SLOW_KEY}" python -m vllm.entrypoints.openai.api_server --model "${LANE_ROUTER_MODEL_SLOW:-meta-llama/Llama-3.1-8B-Instruct}" --host 127.0.0.1 --port 8401 --served-model-name meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 --max-num-batched-tokens 2048 --max-num-seqs 128 --long-prefill-token-threshold 512 --stream-interval 8 --scheduling-policy fcfs --block-size 16 --tensor-parallel-size 1 --pipeline-parallel-size 1 --data-parallel-size 1 --dtype auto --kv-cache-dtype auto --enable-prefix-caching --enable-chunked-prefill
