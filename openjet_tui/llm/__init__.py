"""Chat clients: OpenAI-compatible streaming over httpx (client.py), tool calls written as text (textcalls.py),
providers and their keys (providers.py), server probing (probe.py), the airgap guard and traffic log (network.py).
Every server, local or remote, is spoken to the same way; none of this imports the engine."""
