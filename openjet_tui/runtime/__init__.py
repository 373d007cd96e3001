"""Setup and runtime: what happens between `make run` and a working agent.

The app's one call is `launch.start_engine()`: it sets up on first use (hardware probe, verified model download,
engine decisions), starts the best engine as a worker and returns an `EngineSession` (provider, base URL, model,
the reason for the choice, every decision, the worker's events). `EngineSession.close()` stops everything it
started. Live GPU figures for the engine panel come from `hardware.sample_gpus()`.

Modules: hardware (NVML), catalog (assets/catalog.toml), download + hub + pypi_parts + verify (verified fetches),
ggufinfo (GGUF header facts), engines (selection with reasons), llamacpp (find or build llama-server),
localservers (Ollama, LM Studio), worker (process lifecycle), setup / launch, and the commands setup_cmd,
doctor_cmd and bench_cmd.
"""
