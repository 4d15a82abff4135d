"""The lab that proves a routing profile: the vLLM simulator (`sim/`), the benchmark harness
(`bench/`), the real-vLLM helpers (`realvllm/`) and evidence measurement (`evidence/`).

The lab imports the proxy; the proxy never imports the lab (docs/design.md).
"""
