"""Real vLLM on this machine's CPU: the setup locator, a locally built model, a server handle, a probe."""
