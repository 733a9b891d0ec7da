"""The OpenAI-compatible server: config, engine thread, protocol, metrics, FastAPI app."""
