"""lane-router: a class-aware routing reverse proxy for vLLM pools."""

from __future__ import annotations

import os
from pathlib import Path

from router.compiled import apply

__version__ = "0.1.0"

# Before any compiled module is imported: whether they load, or their sources (router/compiled.py).
BUILD = apply(__name__, Path(__file__).parent, os.environ)
