"""OpenAI-compatible HTTP server for the engine (`openjet-engine serve`): starlette + uvicorn, one engine thread
that owns the backend, a bounded FIFO queue, speculative decoding, prefix reuse and Prometheus metrics."""
