"""A megakernel that fails at run time: the request completes on the per-op path and /health and /metrics name the
new backend and why from then on. The megakernel runs on its VM with a launch that fails as the GPU runner reports
one; the reference backend stands where the per-op CUDA backend would on a machine without a GPU."""

from __future__ import annotations

import httpx
from tests.kernels.test_megakernel_fallback import FaultyExecutor
from tests.server.conftest import running_server

from engine.cuda.fallback import FallbackBackend
from engine.cuda.megakernel.backend import MegakernelBackend
from engine.reference.backend import ReferenceBackend
from engine.server.loader import load_model
from engine.server.state import ServerConfig, ServerState

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}


def test_a_megakernel_fault_moves_the_server_to_the_per_op_path_and_says_so(tiny_qwen35) -> None:
    reference = load_model(tiny_qwen35, "reference", 512)
    with running_server(ServerState(ServerConfig(model_path=str(tiny_qwen35), n_draft=0))) as plain:
        plain.state.attach(reference)
        expected = httpx.post(f"{plain.url}/v1/chat/completions", json=CHAT, timeout=60).json()

    model = load_model(tiny_qwen35, "reference", 512)
    mk = MegakernelBackend.on_vm(tiny_qwen35, context_size=512)
    faulty = FaultyExecutor(mk.ex)
    mk.ex = faulty
    model.backend = FallbackBackend(mk, "cuda: megakernel (VM)",
                                    lambda: ReferenceBackend.from_gguf(tiny_qwen35, context_size=512), "reference")
    model.backend_name, model.backend_reason = model.backend.name, model.backend.reason
    with running_server(ServerState(ServerConfig(model_path=str(tiny_qwen35), n_draft=0))) as server:
        server.state.attach(model)
        health = httpx.get(f"{server.url}/health", timeout=10).json()
        assert health["backend"] == "cuda-megakernel" and health["backend_reason"] == "cuda: megakernel (VM)"
        faulty.fail_at = faulty.runs + 3  # mid-generation
        response = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=120)
        assert response.status_code == 200
        assert response.json()["choices"][0]["message"] == expected["choices"][0]["message"]
        health = httpx.get(f"{server.url}/health", timeout=10).json()
        assert health["backend"] == "reference"
        assert "megakernel failed at run time" in health["backend_reason"]
        assert "CUDA_ERROR_LAUNCH_FAILED" in health["backend_reason"]
        info = next(line for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines()
                    if line.startswith("openjet_backend_info{"))
        assert 'backend="reference"' in info and "megakernel failed at run time" in info
