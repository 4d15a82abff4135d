"""Capacity evidence measured: records from a benchmark run (`measure`), and the worked example of
docs/evidence.md run for real (`example`, `walkthrough`, `lane-router evidence example`)."""
