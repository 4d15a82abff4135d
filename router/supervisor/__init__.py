"""The worker processes of `serve --workers N`: starting and watching them, the link and channel
between supervisor and worker, and their merged metrics. It may import the folders below app/ and
the flat base modules."""
