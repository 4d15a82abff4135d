"""API keys and their limits: the key ring a request authenticates against, the hygiene checks of key
material, and the rate limits charged per key. It may import request/, observe/, config/ and the
flat base modules (errors, settings), nothing above."""
