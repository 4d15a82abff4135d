"""lane-router: a class-aware routing reverse proxy for vLLM pools."""

from __future__ import annotations

__version__ = "0.1.0"
