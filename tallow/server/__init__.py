"""The OpenAI-compatible HTTP server (`tallow serve`): FastAPI app, request protocol, worker."""
